"""OpenAI-format env messages shaped for Hugging Face chat templates.

The envs speak the OpenAI wire format (:mod:`envs.contract`): an assistant ``tool_calls`` entry
is ``{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}`` and
``content`` may be ``None``. Chat templates follow transformers' documented convention instead:
``arguments`` is a dict. Qwen2.5's template writes ``arguments | tojson``, so a JSON string is
encoded a second time (``"arguments": "{\\"user_id\\": \\"u1\\"}"``) and the model is shown a
format the env's parser (:func:`envs.tau2.actions.parse_action`) reads as a string, not an
object; templates that concatenate ``content`` fail on ``None``.

:func:`template_messages` is the one conversion, for whoever renders env messages with a
template (the trainer's token-in/token-out ``ChatRenderer``; a TorchRL user's tokenizer). It
does not touch tool *schemas*: a template that ignores ``tools=`` is the tokenizer's business
(the trainer replaces it with ChatML + Hermes tools when it loads a model).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from envs.action_text import UnusableJSON, loads_bounded

__all__ = ["template_messages"]


def _template_arguments(args: Any) -> Any:
    """A JSON-object string as a dict, ``""`` as ``{}``; anything else unchanged.

    The string is model text when the env recorded a malformed call as written: it is decoded with
    :func:`envs.action_text.loads_bounded` (nesting and integer length checked first, linear time), so JSON nested
    deeper than :data:`~envs.action_text.MAX_JSON_DEPTH` or holding a 4,300-digit integer is kept as a string
    instead of raising ``RecursionError`` / ``ValueError`` in the renderer (issue 34)."""
    if not isinstance(args, str):
        return args
    if not args.strip():
        return {}
    try:
        decoded = loads_bounded(args)
    except (json.JSONDecodeError, UnusableJSON):
        return args  # malformed or unusable: shown as the model wrote it
    return decoded if isinstance(decoded, dict) else args


def template_messages(messages: Sequence[dict]) -> list[dict]:
    """Copies of ``messages`` shaped for HF chat templates; the input is not modified.

    - ``content: None`` becomes ``""``;
    - each ``tool_calls`` entry becomes ``{"type": "function", "function": {"name", "arguments"},
      "id"?}`` (a bare ``{"name", "arguments"}`` entry is wrapped; other keys are dropped);
    - ``arguments`` given as a JSON string of an object becomes that dict, ``""`` becomes ``{}``;
      any other string (malformed JSON, a JSON list or number, JSON nested deeper than
      :data:`~envs.action_text.MAX_JSON_DEPTH` or with an over-long integer) is kept as written.
      Lone surrogates in decoded strings become U+FFFD.

    Cost: linear in the total length of the messages. Never raises on what a model wrote.

    Other message keys (``tool_call_id``, ``name``) are kept. Copies are shallow below the
    changed keys (a dict ``arguments`` is shared with the input).

    Args:
        messages: OpenAI-format chat messages (an env's ``info["messages"]`` or observation).

    Returns:
        A new list of new message dicts, same length and order.
    """
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c.get("function", c))
                fn["arguments"] = _template_arguments(fn.get("arguments"))
                calls.append({"type": "function", "function": fn, **({"id": c["id"]} if "id" in c else {})})
            m["tool_calls"] = calls
        out.append(m)
    return out
