"""A preallocated key/value cache for the rollout backend's decode loop.

transformers' :class:`~transformers.DynamicCache` appends each decode step's keys/values with ``torch.cat``, which
copies the whole cache of every layer at every step: O(T) bytes per step, O(T^2) per generation. On CPU, where decode
is memory-bandwidth-bound, that was 20% of SmolLM2-135M decode time in the GSM8K ``train_bench`` setting (torch
profiler, 16 rows x 32 steps: ``aten::cat`` 20.5% of self CPU time, ``aten::mm`` 60%).

:class:`PreallocatedCache` instead allocates each layer's ``[B, H_kv, capacity, D]`` key and value buffers once,
writes every step's keys/values in place and hands attention a view of the filled part, ``buf[:, :, :T]`` (same
values, same order: attention reads identical numbers, so the generation is unchanged; the tests compare tokens and
log-probs with the ``DynamicCache`` path). Capacity grows by doubling if a caller writes past it.
Batch reordering (GRPO fan-out of a prompt's cache to its samples, dropping finished rows) copies only the filled
part.

Full- and sliding-window-attention layers (the window is in the mask transformers builds, on cache columns, as for
the full-length layers of a ``DynamicCache()``); other layer kinds keep :class:`~transformers.DynamicCache`
(:func:`supports_preallocation`, the rule of :func:`torchrl_grpo.exact_paths.full_length_cache_refusal`).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from torchrl_grpo.exact_paths import full_length_cache_refusal, note_fallback

__all__ = ["PreallocatedLayer", "PreallocatedCache", "assemble_cache", "supports_preallocation"]


class PreallocatedLayer(DynamicLayer):
    """One layer's keys/values in preallocated ``[B, H_kv, capacity, D]`` buffers.

    ``keys`` / ``values`` are always views ``buf[:, :, :length]`` of the buffers (what transformers reads).

    Args:
        capacity: token slots to allocate on the first write (at least the first write's length).
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = int(capacity)
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def _alloc(self, like: torch.Tensor, batch: int, capacity: int) -> torch.Tensor:
        B, H, _, D = like.shape
        return torch.empty((batch, H, capacity, D), dtype=like.dtype, device=like.device)

    def _set_views(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        cap = max(self.capacity, key_states.shape[-2])
        self._k = self._alloc(key_states, key_states.shape[0], cap)
        self._v = self._alloc(value_states, value_states.shape[0], cap)
        self.capacity, self.length = cap, 0
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write ``key_states`` / ``value_states`` [B, H_kv, q, D] after the filled part; return the filled views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        if self.length + q > self.capacity:
            self._grow(max(2 * self.capacity, self.length + q))
        self._k[:, :, self.length : self.length + q].copy_(key_states)
        self._v[:, :, self.length : self.length + q].copy_(value_states)
        self.length += q
        self._set_views()
        return self.keys, self.values

    def _grow(self, capacity: int) -> None:
        k, v = self._alloc(self._k, self._k.shape[0], capacity), self._alloc(self._v, self._v.shape[0], capacity)
        k[:, :, : self.length].copy_(self._k[:, :, : self.length])
        v[:, :, : self.length].copy_(self._v[:, :, : self.length])
        self._k, self._v, self.capacity = k, v, capacity

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Take ``keys`` / ``values`` [B, H_kv, capacity, D] as the buffers (no copy), ``length`` slots filled."""
        self.dtype, self.device = keys.dtype, keys.device
        self._k, self._v, self.capacity, self.length = keys, values, keys.shape[2], int(length)
        self.is_initialized = True
        self._set_views()

    def load(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Start from existing keys/values [B, H_kv, T, D] (a prefix cache), copied into fresh buffers."""
        self.lazy_initialization(keys, values)
        self.update(keys, values)

    def get_seq_length(self) -> int:
        return self.length

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Rows ``beam_idx`` (any length, repeats allowed) of the cache become its batch; only the filled part is
        copied."""
        if not self.is_initialized:
            return
        idx = beam_idx.to(self._k.device)
        n, L = idx.numel(), self.length
        if n <= self._k.shape[0] and bool((idx == torch.arange(n, device=idx.device)).all()):
            self._k, self._v = self._k[:n], self._v[:n]  # a prefix of the rows: no copy
        else:
            k, v = self._alloc(self._k, n, self.capacity), self._alloc(self._v, n, self.capacity)
            k[:, :, :L].copy_(self._k[:, :, :L].index_select(0, idx))
            v[:, :, :L].copy_(self._v[:, :, :L].index_select(0, idx))
            self._k, self._v = k, v
        self._set_views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if not self.is_initialized:
            return
        if indices.dtype == torch.bool:
            indices = indices.nonzero().flatten()
        self.reorder_cache(torch.as_tensor(indices, dtype=torch.long))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self.reorder_cache(torch.arange(self._k.shape[0], device=self._k.device).repeat_interleave(repeats))

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:  # legacy: the absolute length to keep
            self.length = min(self.length, tokens_to_remove)
        else:
            self.length = max(0, self.length + tokens_to_remove)
        if self.is_initialized:
            self._set_views()

    def reset(self) -> None:
        self.length = 0
        if self.is_initialized:
            self._set_views()


class PreallocatedCache(DynamicCache):
    """A :class:`~transformers.DynamicCache` whose layers are :class:`PreallocatedLayer` of ``capacity`` tokens.

    Args:
        capacity: token slots per layer (prompt + new tokens of the longest row); grows by doubling if exceeded.
        prefix: optional cache whose keys/values [1 or B, H_kv, T, D] per layer are copied in first (the backend's
            shared-prefix cache; it is not modified).
    """

    def __init__(self, capacity: int, prefix: Cache | None = None) -> None:
        Cache.__init__(self, layer_class_to_replicate=lambda: PreallocatedLayer(capacity))
        if prefix is not None:
            for layer in prefix.layers:
                new = PreallocatedLayer(capacity)
                if layer.is_initialized and layer.get_seq_length() > 0:
                    new.load(layer.keys, layer.values)
                self.layers.append(new)


def assemble_cache(prefix: Cache | None, rows: list[tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]] | None],
                   width: int, capacity: int | None = None) -> DynamicCache:
    """A batch cache of ``len(rows)`` rows and ``Lp + width`` filled columns: the ``Lp`` columns of ``prefix`` (batch
    1, copied to every row), then each row's own keys/values right-aligned in the next ``width`` columns
    (the cross-turn KV reuse of :mod:`torchrl_grpo.backends.turn_kv_cache`). The columns before a row's own part
    are zeros, never uninitialised memory (a masked column still enters attention's weighted sum, with weight 0):
    the caller's attention mask must hide them.

    Args:
        prefix: batch-1 cache (per layer ``[1, H_kv, Lp, D]``) or None (``Lp = 0``); only read.
        rows: per row, per-layer ``(keys, values)`` ``[H_kv, n_r, D]`` with ``n_r <= width``, or None (no own part).
        width: columns for the rows' own parts.
        capacity: a :class:`PreallocatedCache` with this many slots per layer (at least ``Lp + width``); None: a
            :class:`~transformers.DynamicCache`.

    Raises:
        ValueError: no prefix and no row to take the layers' shapes from, a row longer than ``width``, rows with
            another layer count than the prefix, or ``capacity < Lp + width``.
    """
    own = [r for r in rows if r is not None]
    if prefix is not None:
        like = [lay.keys for lay in prefix.layers]
        lp = like[0].shape[2]
    elif own:
        like, lp = [k[None] for k in own[0][0]], 0
    else:
        raise ValueError("assemble_cache needs a prefix or at least one row")
    if any(len(k) != len(like) or len(v) != len(like) for k, v in own):
        raise ValueError(f"rows must have {len(like)} layers like the prefix")
    if any(k[0].shape[1] > width for k, _ in own):
        raise ValueError(f"a row has more than width={width} columns")
    filled = lp + width
    cap = filled if capacity is None else int(capacity)
    if cap < filled:
        raise ValueError(f"capacity {cap} < the {filled} filled columns")
    B = len(rows)
    layers = []
    for i, k0 in enumerate(like):
        H, D = k0.shape[1], k0.shape[3]
        bufs = []
        for kv in (0, 1):
            buf = torch.empty((B, H, cap, D), dtype=k0.dtype, device=k0.device)
            buf[:, :, :filled].zero_()
            if prefix is not None:
                src = prefix.layers[i].keys if kv == 0 else prefix.layers[i].values
                buf[:, :, :lp].copy_(src[:, :, :lp].expand(B, -1, -1, -1))
            for b, r in enumerate(rows):
                if r is not None:
                    t = r[kv][i]
                    buf[b, :, filled - t.shape[1] : filled].copy_(t)
            bufs.append(buf)
        layers.append(bufs)
    if capacity is None:
        return DynamicCache(ddp_cache_data=[(k, v) for k, v in layers])
    cache = PreallocatedCache(cap)
    for k, v in layers:
        layer = PreallocatedLayer(cap)
        layer.adopt(k, v, filled)
        cache.layers.append(layer)
    return cache


def supports_preallocation(model: torch.nn.Module) -> bool:
    """True when every decoder layer of ``model`` uses full or sliding-window attention (not chunked / linear
    attention) (:func:`~torchrl_grpo.exact_paths.full_length_cache_refusal`); a refusal is logged once."""
    reason = full_length_cache_refusal(model)
    if reason is not None:
        note_fallback(model, "preallocated KV cache", reason)
    return reason is None
