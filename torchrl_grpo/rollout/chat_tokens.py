"""Token-in/token-out chat rendering for multi-turn rollouts.

Earlier turns are never decoded and re-encoded: the collector keeps the exact token ids the policy produced
and appends only the tokens of *new* messages (tool results, user replies), rendered with the tokenizer's own
chat template. A new message's tokens are obtained as the difference between two renders,
``render(base + new) - render(base)``, where ``base`` is a fixed short conversation ending in an assistant
turn: the template decides every separator, so any chat template that renders prefixes stably works. Env messages
reach the template through :func:`envs.chat_template.template_messages` (tool-call arguments as objects).

The difference is taken on the rendered *text* and only the new text is tokenised: with tool schemas in the system
prompt (tau2 telecom: ~8.6k tokens) tokenising both renders cost ~14 ms per env turn, most of a zero-cost-model
rollout (``benchmarks/results/collector_overhead.md``). Each renderer checks once, at construction, that text-difference
tokenisation gives the same ids as the token difference, and keeps the token difference where it does not.
"""
from __future__ import annotations

from typing import Any, Sequence

from envs.chat_template import template_messages

__all__ = ["ChatRenderer"]

_BASE = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "A"},
]


def _ids(out: Any) -> list[int]:
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


class ChatRenderer:
    """Renders conversations to token ids with a HF tokenizer's chat template.

    Args:
        tokenizer: a HF tokenizer with a ``chat_template``.
        tools: OpenAI tool schemas passed to the template (or None).

    Raises:
        ValueError: the tokenizer has no chat template, no eos token, or its template does not render
            conversations prefix-stably (a longer conversation's render does not start with the shorter's).
    """

    def __init__(self, tokenizer, tools: Sequence[dict] | None = None) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("tokenizer has no chat_template; set one (e.g. ChatML) before rolling out chats")
        if tokenizer.eos_token_id is None:
            raise ValueError("tokenizer has no eos token")
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        base = self._render(_BASE, add_generation_prompt=False)
        self._base = base
        self._base_text = self._text(_BASE, add_generation_prompt=False)
        self._prompt_cache: dict[str, list[int]] = {}
        # tokens the template puts after the assistant's end-of-turn token (e.g. "\n" in ChatML)
        eos = self.end_of_turn_ids()
        last = max((i for i, t in enumerate(base) if t in eos), default=None)
        if last is None:
            raise ValueError("chat template does not close assistant turns with an eos / end-of-turn token")
        self.assistant_suffix: list[int] = base[last + 1 :]
        probe = self._render(_BASE + [{"role": "user", "content": "V"}], add_generation_prompt=True)
        if probe[: len(base)] != base:
            raise ValueError("chat template is not prefix-stable; token-in/token-out multi-turn rollouts need one")
        self._text_diff = True  # verified on a tool reply and a user turn; else the token difference is used
        for new in ([{"role": "tool", "content": '{"ok": 1}', "tool_call_id": "c"}], [{"role": "user", "content": "V"}]):
            by_tokens = self._render(_BASE + new, add_generation_prompt=True)[len(base):]
            if self.continuation_ids(new) != by_tokens:
                self._text_diff = False
                break

    def end_of_turn_ids(self) -> set[int]:
        """Token ids that end an assistant turn (eos, and ``<|im_end|>`` / ``<|eot_id|>`` when present)."""
        tok = self.tokenizer
        ids = {tok.eos_token_id}
        for name in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
            tid = tok.convert_tokens_to_ids(name)
            if isinstance(tid, int) and tid != getattr(tok, "unk_token_id", None) and tid >= 0:
                ids.add(tid)
        return ids

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        kwargs: dict[str, Any] = {"add_generation_prompt": add_generation_prompt, "tokenize": True}
        if self.tools:
            kwargs["tools"] = self.tools
        return _ids(self.tokenizer.apply_chat_template(template_messages(messages), **kwargs))

    def _text(self, messages: list[dict], add_generation_prompt: bool) -> str:
        kwargs: dict[str, Any] = {"add_generation_prompt": add_generation_prompt, "tokenize": False}
        if self.tools:
            kwargs["tools"] = self.tools
        return self.tokenizer.apply_chat_template(template_messages(messages), **kwargs)

    def _encode(self, text: str) -> list[int]:
        # as apply_chat_template(tokenize=True): the template writes its own special tokens
        return _ids(self.tokenizer(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Token ids of a whole conversation followed by the assistant generation prompt (the ids of the last
        distinct renders are cached: the episodes of a group start from the same prompt)."""
        if not messages:
            raise ValueError("cannot render an empty conversation")
        text = self._text(messages, add_generation_prompt=True)
        ids = self._prompt_cache.get(text)
        if ids is None:
            ids = self._render(messages, add_generation_prompt=True)
            if len(self._prompt_cache) >= 64:
                self._prompt_cache.pop(next(iter(self._prompt_cache)))
            self._prompt_cache[text] = ids
        return list(ids)

    def continuation_ids(self, new_messages: list[dict]) -> list[int]:
        """Token ids that append ``new_messages`` (non-assistant) after a closed assistant turn, followed by
        the assistant generation prompt. The assistant's end-of-turn suffix is *not* included (see
        :attr:`assistant_suffix`)."""
        if getattr(self, "_text_diff", True):
            full = self._text(_BASE + list(new_messages), add_generation_prompt=True)
            if full.startswith(self._base_text):
                return self._encode(full[len(self._base_text):])
        full_ids = self._render(_BASE + list(new_messages), add_generation_prompt=True)
        return full_ids[len(self._base) :]

    def assistant_ids(self, message: dict) -> list[int]:
        """Token ids a policy samples to write the assistant ``message`` (OpenAI format; tool calls included):
        the template's render of it after the generation prompt, through its end-of-turn token (the stop token
        the collector's sampling ends on), without the :attr:`assistant_suffix` the collector appends itself.
        The demonstrations of supervised fine-tuning (:mod:`torchrl_grpo.rollout.demonstrations`) are these tokens, so a
        model is taught exactly the text the env parses from its samples.

        Raises:
            ValueError: ``message`` is not an assistant message, or the template renders it in a way that does not
                continue the generation prompt or does not close it with an end-of-turn token.
        """
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            raise ValueError(f"assistant_ids() takes an assistant message dict, got {message!r:.200}")
        ctx = _BASE + [{"role": "user", "content": "V"}]
        head = self._text(ctx, add_generation_prompt=True)
        full = self._text(ctx + [{**message, "role": "assistant"}], add_generation_prompt=False)
        if not full.startswith(head):
            raise ValueError("chat template renders an assistant message that does not continue its generation prompt")
        ids = self._encode(full[len(head):])
        eos = self.end_of_turn_ids()
        last = max((i for i, t in enumerate(ids) if t in eos), default=None)
        if last is None:
            raise ValueError("chat template does not close the assistant message with an end-of-turn token")
        return ids[: last + 1]
