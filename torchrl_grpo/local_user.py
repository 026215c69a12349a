"""A tau2 customer played by a model on our own rollout backend (``econfig.user_llm=local``).

The tau2 env calls the user with the customer-side view of the conversation (tau2's user-simulator system
prompt with the task scenario, then the dialogue with roles flipped) and the customer's tool schemas; this
renders it with the tokenizer's chat template, samples a reply from the backend and returns the text. The
same backend (and so the policy being trained) or a second backend with another model can play the user;
no external endpoint is needed. Calls come one conversation at a time (the env asks for the user's reply
inside ``step``), so user turns are not batched across episodes the way agent turns are.
"""
from __future__ import annotations

from .backends.base import RolloutBackend, SamplingConfig
from .chat_tokens import ChatRenderer

__all__ = ["LocalUser"]


class LocalUser:
    """Callable ``(messages, tools) -> str`` for ``Tau2Env(user_fn=...)``.

    Args:
        backend: rollout backend used to sample the customer's replies.
        tokenizer: the backend model's tokenizer (chat template).
        sampling: sampling settings for user turns (stop tokens default to the end-of-turn ids).
        max_prompt_tokens: the oldest dialogue turns are dropped (system prompt kept) beyond this many tokens.

    Raises (when called):
        RuntimeError: the model produced an empty reply (the env ends the episode with ``user_error``).
    """

    def __init__(self, backend: RolloutBackend, tokenizer, sampling: SamplingConfig | None = None,
                 max_prompt_tokens: int = 3072) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        base = ChatRenderer(tokenizer)
        sampling = sampling or SamplingConfig(max_new_tokens=128, temperature=0.7)
        if not sampling.stop_token_ids:
            sampling = SamplingConfig(**{**sampling.__dict__, "stop_token_ids": sorted(base.end_of_turn_ids())})
        self.sampling = sampling
        self.max_prompt_tokens = max_prompt_tokens
        self.calls = 0

    def __call__(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        renderer = ChatRenderer(self.tokenizer, tools)
        msgs = list(messages)
        ids = renderer.prompt_ids(msgs)
        while len(ids) > self.max_prompt_tokens and len(msgs) > 2:
            msgs = msgs[:1] + msgs[2:]
            ids = renderer.prompt_ids(msgs)
        seed = None if self.sampling.seed is None else self.sampling.seed + self.calls
        gen = self.backend.generate([ids], SamplingConfig(**{**self.sampling.__dict__, "seed": seed}))[0]
        self.calls += 1
        text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True).strip()
        if not text:
            raise RuntimeError("local user model produced an empty reply")
        return text
