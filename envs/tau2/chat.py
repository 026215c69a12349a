"""Render a tau2 conversation and its tools with a tokenizer's chat template.

Chat templates expect slightly different message shapes than the OpenAI wire format that
:class:`envs.tau2.env.Tau2Env` emits, so :func:`render_chat` normalizes first:

- ``tool_calls[i].function.arguments`` JSON strings become dicts (HF's documented convention;
  Qwen2.5's template would otherwise JSON-encode the string a second time); unparsable ones stay
  strings;
- ``content: None`` becomes ``""``.

Templates that ignore ``tools=`` (e.g. SmolLM2's ChatML) would silently hide the tools from the
model. With ``tool_prompt="auto"`` (default) the rendered text is checked for the tool names and,
if they are missing, the tools are described in the system message in the Hermes format (the
same ``<tools>`` / ``<tool_call>`` convention Qwen2.5 uses, which
:func:`envs.tau2.actions.parse_action` reads back), and assistant tool calls are written as
``<tool_call>`` blocks in the content.
"""
from __future__ import annotations

import copy
import json
from typing import Any

__all__ = ["render_chat", "normalize_for_template", "hermes_tool_system_prompt"]


def normalize_for_template(messages: list[dict]) -> list[dict]:
    """Copies of ``messages`` shaped for HF chat templates (see module docstring)."""
    out = []
    for m in messages:
        m = copy.deepcopy(m)
        if m.get("content") is None:
            m["content"] = ""
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", tc)
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    decoded = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    continue
                if isinstance(decoded, dict):
                    fn["arguments"] = decoded
        out.append(m)
    return out


def hermes_tool_system_prompt(tools: list[dict]) -> str:
    """Hermes-style tool description appended to a system prompt (Qwen2.5's wording)."""
    lines = [
        "# Tools",
        "",
        "You may call one or more functions to assist with the user query.",
        "",
        "You are provided with function signatures within <tools></tools> XML tags:",
        "<tools>",
    ]
    lines += [json.dumps(t) for t in tools]
    lines += [
        "</tools>",
        "",
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:",
        "<tool_call>",
        '{"name": <function-name>, "arguments": <args-json-object>}',
        "</tool_call>",
    ]
    return "\n".join(lines)


def _inline_tools(messages: list[dict], tools: list[dict]) -> list[dict]:
    """Tools described in the system message, tool calls as text (for tool-less templates)."""
    out = []
    system = hermes_tool_system_prompt(tools)
    if messages and messages[0].get("role") == "system":
        out.append({"role": "system", "content": (messages[0].get("content") or "") + "\n\n" + system})
        rest = messages[1:]
    else:
        out.append({"role": "system", "content": system})
        rest = messages
    for m in rest:
        m = dict(m)
        calls = m.pop("tool_calls", None) or []
        if calls:
            blocks = []
            for tc in calls:
                fn = tc.get("function", tc)
                args = fn.get("arguments")
                blocks.append(
                    "<tool_call>\n"
                    + json.dumps({"name": fn.get("name"), "arguments": args}, default=str)
                    + "\n</tool_call>"
                )
            m["content"] = "\n".join(([m["content"]] if m.get("content") else []) + blocks)
        if m.get("role") == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
        out.append(m)
    return out


def render_chat(
    tokenizer: Any,
    messages: list[dict],
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
    tokenize: bool = False,
    tool_prompt: str = "auto",
    **template_kwargs: Any,
) -> str | list[int]:
    """``tokenizer.apply_chat_template`` on a tau2 conversation with its tools.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        messages: OpenAI-format messages (``info["messages"]`` of :class:`~envs.tau2.env.Tau2Env`).
        tools: OpenAI tool schemas (``info["tools"]``) or ``None``.
        add_generation_prompt: append the assistant turn header.
        tokenize: return token ids (``list[int]``) instead of text.
        tool_prompt: ``"auto"`` (template's tool support, Hermes fallback when it has none),
            ``"template"`` (template only), or ``"hermes"`` (always the Hermes fallback).
        template_kwargs: passed to ``apply_chat_template`` (e.g. ``enable_thinking``).

    Returns:
        The rendered prompt (``str``) or its token ids.

    Raises:
        ValueError: the tokenizer has no chat template, or ``tool_prompt`` is unknown.
    """
    if tool_prompt not in ("auto", "template", "hermes"):
        raise ValueError(f"tool_prompt must be 'auto', 'template' or 'hermes', got {tool_prompt!r}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template (set tokenizer.chat_template)")
    msgs = normalize_for_template(messages)

    def apply(ms: list[dict], ts: list[dict] | None, tok: bool):
        kwargs = dict(add_generation_prompt=add_generation_prompt, tokenize=tok, **template_kwargs)
        if ts:
            kwargs["tools"] = ts
        out = tokenizer.apply_chat_template(ms, **kwargs)
        if tok and not isinstance(out, list):  # transformers 5 returns a BatchEncoding
            out = list(out["input_ids"])
        return out

    if not tools or tool_prompt == "template":
        return apply(msgs, tools, tokenize)
    if tool_prompt == "auto":
        text = apply(msgs, tools, False)
        names = [t.get("function", t).get("name") for t in tools]
        if all(n and n in text for n in names):
            return apply(msgs, tools, True) if tokenize else text
    return apply(_inline_tools(msgs, tools), None, tokenize)
