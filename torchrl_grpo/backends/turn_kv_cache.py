"""Cross-turn KV reuse for the transformers backend (``rollout.turn_cache_mb``; off by default).

Why: in a multi-turn episode the prompt of turn ``t + 1`` is the prompt of turn ``t``, the tokens sampled at turn
``t`` and the env's reply (tool results, the next generation prompt). The backend's prompt-prefix cache
(:meth:`~torchrl_grpo.backends.transformers_backend.TransformersBackend._shared_prefix`) keeps only the prefix the
whole batch shares (a tau2 system prompt and tool schemas), so each turn re-prefilled every episode's own suffix:
``O(T^2)`` prefill tokens over ``T`` turns. On the tau2 mock recipe (SmolLM2-135M, solo, 64 greedy episodes, 2 CPU
cores) py-spy put 62% of a greedy eval in ``Linear.forward`` and 27% in SDPA: prefill.

:class:`TurnKVCache` keeps, for each row of the last ``generate`` call, the keys/values of what that row has in the
cache when it stops: its prompt and the tokens it sampled, except the last one (never fed back). Each row's part
*after* the call's shared prefix is stored compactly (its real columns only, ``[H_kv, n, D]`` per layer), with a
reference to that shared prefix. When a later call's prompt strictly extends a stored sequence, the backend
prefills only the new tokens after that row's stored keys/values (:meth:`TurnKVCache.plan`,
:func:`torchrl_grpo.backends.kv_cache.assemble_cache`): the batch cache is the shared prefix, then each row's
stored part right-aligned after left padding, then the new tokens, left-padded; padding columns are masked and the
new tokens' position ids are the mask's cumulative sum, so each row attends to exactly its own real tokens at their
own positions, as the prompt-prefix cache already does. Exact under the same rule
(:func:`torchrl_grpo.exact_paths.prefix_cache_refusal`: full attention, no ALiBi on key columns); refused models run
the plain path (logged once).

Only the last call's rows are kept; everything is dropped when the weights change, when the model's forward state
(peft's active / disabled adapters: :func:`~torchrl_grpo.backends.graph_decode.forward_state`) differs from the one
the keys/values were computed under, and when one call's rows would exceed ``max_bytes`` (that call keeps nothing).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["TurnEntry", "TurnKVCache"]


@dataclass(frozen=True)
class TurnEntry:
    """One row's kept keys/values.

    Attributes:
        tokens: the token ids whose keys/values are held, from position 0 (shared prefix + the row's own part).
        prefix: the backend's shared-prefix ``(tokens, cache)`` these keys/values follow (its cache is batch 1 and
            only read); None when the own part starts at position 0.
        keys, values: per layer, the own part's ``[H_kv, n, D]`` (``n = len(tokens) - len(prefix tokens)``).
    """

    tokens: tuple[int, ...]
    prefix: tuple | None
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    @property
    def prefix_len(self) -> int:
        return len(self.prefix[0]) if self.prefix is not None else 0

    @property
    def own_len(self) -> int:
        return len(self.tokens) - self.prefix_len


def bytes_per_token(keys: list[torch.Tensor]) -> int:
    """Bytes one token's keys and values take over all layers, from per-layer key tensors ``[B, H_kv, T, D]``
    (values have the keys' shape and dtype)."""
    return sum(2 * k.shape[1] * k.shape[3] * k.element_size() for k in keys)


class TurnKVCache:
    """The kept keys/values of the last ``generate`` call's rows (module docstring).

    Args:
        max_bytes: the most bytes one call's rows may keep (keys and values, all layers); a call whose rows would
            take more keeps none.

    Raises:
        ValueError: ``max_bytes <= 0``.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self.entries: dict[tuple[int, ...], TurnEntry] = {}  # the last call's rows, by their tokens
        self.state: tuple | None = None  # forward_state the entries were computed under
        self._pending: dict[tuple[int, ...], TurnEntry] | None = None  # the running call's rows; None: not kept
        self._pending_bytes = 0
        self._pending_state: tuple | None = None
        self._pending_version: int | None = None
        self.overflowed = False  # the last call's rows exceeded max_bytes

    @property
    def nbytes(self) -> int:
        """Bytes held by the kept entries."""
        return sum(k.numel() * k.element_size() * 2 for e in self.entries.values() for k in e.keys)

    def clear(self) -> None:
        """Drop every kept entry and the running call's (new weights: their keys/values are another model's)."""
        self.entries, self.state, self._pending, self._pending_bytes = {}, None, None, 0

    # ------------------------------------------------------------------ one generate call
    def begin(self, version: int, state: tuple) -> None:
        """Start collecting the rows of a call made under weights ``version`` and forward state ``state``."""
        self._pending, self._pending_bytes, self.overflowed = {}, 0, False
        self._pending_state, self._pending_version = state, version

    @property
    def collecting(self) -> bool:
        """Whether the running call still keeps its rows (not over ``max_bytes``, no weight change)."""
        return self._pending is not None

    def capture(self, tokens: tuple[int, ...], prefix: tuple | None, keys: list[torch.Tensor],
                values: list[torch.Tensor], row: int, columns: torch.Tensor) -> bool:
        """Keep row ``row``'s keys/values at ``columns`` (long [n], the row's real columns after the shared prefix,
        in order) of per-layer ``keys`` / ``values`` ``[B, H_kv, T, D]`` as the entry of ``tokens``.

        Returns False (and stops collecting this call) when the call's rows would exceed ``max_bytes``."""
        if self._pending is None:
            return False
        if tokens in self._pending:
            return True
        need = int(columns.numel()) * bytes_per_token(keys)
        if self._pending_bytes + need > self.max_bytes:
            self._pending, self._pending_bytes, self.overflowed = None, 0, True
            return False
        idx = columns.to(keys[0].device)
        self._pending[tokens] = TurnEntry(
            tokens=tokens, prefix=prefix,
            keys=tuple(k[row].index_select(1, idx) for k in keys),
            values=tuple(v[row].index_select(1, idx) for v in values))
        self._pending_bytes += need
        return True

    def finish(self, version: int) -> None:
        """End the call: its rows become the kept entries if they were all kept under unchanged weights, else none
        are kept."""
        pending = self._pending
        ok = pending is not None and version == self._pending_version
        self.entries = pending if ok else {}
        self.state = self._pending_state if ok else None
        self._pending, self._pending_bytes = None, 0

    # ------------------------------------------------------------------ lookups
    def match(self, prompt: tuple[int, ...]) -> TurnEntry | None:
        """The longest kept entry whose tokens ``prompt`` strictly extends (at least one new token), or None."""
        best: TurnEntry | None = None
        n_p = len(prompt)
        for key, entry in self.entries.items():
            n = len(key)
            if n < n_p and (best is None or n > len(best.tokens)) and prompt[n - 1] == key[-1] \
                    and prompt[:n] == key:
                best = entry
        return best

    def plan(self, prompts: list[tuple[int, ...]], state: tuple
             ) -> tuple[tuple | None, list[TurnEntry | None]] | None:
        """How to prefill ``prompts`` (distinct) after kept keys/values: ``(prefix, entries)`` with the shared prefix
        every row starts from (None: position 0) and, per prompt, the entry it extends (None: only the prefix is
        reused; that prompt must extend it by at least one token). None when no prompt extends an entry, or a prompt
        that extends none does not extend the prefix (the plain path then prefills). ``state``: the model's forward
        state now; kept entries computed under another are dropped (another adapter's keys/values).

        Entries of one call may follow different shared prefixes (one per ``max_batch_size`` chunk): the prefix most
        matched prompts follow is taken; a prompt whose entry follows another counts as extending none."""
        if self.entries and state != self.state:
            self.entries, self.state = {}, None
        if not self.entries:
            return None
        found = [self.match(p) for p in prompts]
        refs: dict[int, tuple[tuple | None, int]] = {}
        for e in found:
            if e is not None:
                ref, n = refs.get(id(e.prefix), (e.prefix, 0))
                refs[id(e.prefix)] = (ref, n + 1)
        if not refs:
            return None
        prefix = max(refs.values(), key=lambda rn: rn[1])[0]
        entries = [e if e is not None and e.prefix is prefix else None for e in found]
        pre = prefix[0] if prefix is not None else ()
        for p, e in zip(prompts, entries):
            if e is None and not (len(p) > len(pre) and p[: len(pre)] == pre):
                return None
        return prefix, entries
