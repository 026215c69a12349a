"""A tau2 customer played by a model on our own rollout backend (``econfig.user_llm=local``).

The tau2 env calls the user with the customer-side view of the conversation (tau2's user-simulator system
prompt with the task scenario, then the dialogue with roles flipped) and the customer's tool schemas; this
renders it with the tokenizer's chat template, samples a reply from the backend and returns the text. The
same backend (and so the policy being trained) or a second backend with another model can play the user;
no external endpoint is needed.

Batching: the env asks for the user's reply inside ``step``, one conversation at a time. The collector therefore
steps the live envs of a turn in threads inside :meth:`LocalUser.batched`; each customer request waits until every
env step of that turn has either asked for a reply or finished, and then all waiting requests go to the backend as
one batched ``generate`` call (``stats["calls"]`` requests in ``stats["batches"]`` calls).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import replace

from torchrl_grpo.backends.base import RolloutBackend, SamplingConfig
from torchrl_grpo.rollout.chat_tokens import ChatRenderer

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
            sampling = replace(sampling, stop_token_ids=sorted(base.end_of_turn_ids()))
        self.sampling = sampling
        self.max_prompt_tokens = max_prompt_tokens
        self.stats = {"calls": 0, "batches": 0}
        self._cv = threading.Condition()
        self._open = 0  # env steps of the current batched turn still running (not waiting, not finished)
        self._batching = False
        self._pending: list[dict] = []
        self._local = threading.local()  # order key of the env step running in this thread

    @property
    def calls(self) -> int:
        """Customer replies generated so far."""
        return self.stats["calls"]

    def _prompt(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        renderer = ChatRenderer(self.tokenizer, tools)
        msgs = list(messages)
        ids = renderer.prompt_ids(msgs)
        while len(ids) > self.max_prompt_tokens and len(msgs) > 2:
            msgs = msgs[:1] + msgs[2:]
            ids = renderer.prompt_ids(msgs)
        return ids

    def _generate(self, prompts: list[list[int]]) -> list[str | Exception]:
        seed = None if self.sampling.seed is None else self.sampling.seed + self.stats["batches"]
        gens = self.backend.generate(prompts, replace(self.sampling, seed=seed))
        self.stats["batches"] += 1
        self.stats["calls"] += len(prompts)
        out: list[str | Exception] = []
        for g in gens:
            text = self.tokenizer.decode(g.token_ids, skip_special_tokens=True).strip()
            out.append(text if text else RuntimeError("local user model produced an empty reply"))
        return out

    def __call__(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        ids = self._prompt(messages, tools)
        with self._cv:
            batching = self._batching
        if not batching:
            (res,) = self._generate([ids])
        else:
            slot = {"ids": ids, "res": None, "done": False, "key": getattr(self._local, "key", 0)}
            with self._cv:
                self._pending.append(slot)
                self._open -= 1
                self._flush_if_ready()
                self._cv.notify_all()  # the state changed: whoever waits on it re-checks (nothing else wakes them)
                while not slot["done"]:
                    self._cv.wait()
            res = slot["res"]
        if isinstance(res, Exception):
            raise res
        return res

    # ------------------------------------------------------------------ batched turns
    @contextmanager
    def batched(self, n_steps: int):
        """Scope in which ``n_steps`` env steps run concurrently; each must call :meth:`step_done` when it ends."""
        with self._cv:
            self._batching, self._open, self._pending = True, int(n_steps), []
        try:
            yield self
        finally:
            with self._cv:
                self._batching, self._open = False, 0

    def step_begin(self, key: int) -> None:
        """Called in the thread of an env step before it runs: ``key`` orders its requests within a batch, so the
        batch (and the sampled replies) do not depend on thread scheduling."""
        self._local.key = key

    def step_done(self) -> None:
        """An env step of the batched turn finished (successfully or not)."""
        with self._cv:
            self._open -= 1
            self._flush_if_ready()

    def _flush_if_ready(self) -> None:
        """Caller holds ``_cv``. Generate for all waiting requests once no env step is still running."""
        if not self._pending or self._open > 0:
            return
        batch, self._pending = sorted(self._pending, key=lambda s: s["key"]), []
        try:
            results = self._generate([s["ids"] for s in batch])
        except Exception as exc:  # every waiting env step gets the error (the env turns it into user_error)
            results = [exc] * len(batch)
        for s, r in zip(batch, results):
            s["res"], s["done"] = r, True
        self._open += len(batch)  # those env steps run again until they ask again or finish
        self._cv.notify_all()
