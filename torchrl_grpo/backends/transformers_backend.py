"""Embedded rollout backend on a transformers causal LM (the default; no extra dependency).

It runs its own batched decode loop over a KV cache instead of ``model.generate`` so that it can

* prefill every *distinct* prompt once and fan its KV cache out to the ``n`` samples of its group
  (GRPO groups share a prompt),
* keep the KV cache of the longest prefix shared by a whole batch (a tau2 domain's system prompt: policy and
  tool schemas, ~10k tokens for telecom) across calls, so later turns and later batches prefill only what
  follows it; the cache is dropped when the weights change (:meth:`load_weights`),
* optionally (``turn_cache_mb``, off by default) keep each row's keys/values when it stops, so the next turn of a
  multi-turn episode (a prompt that extends that row's prompt + sampled tokens) prefills only the env's reply and
  what follows, not its whole history again (:mod:`torchrl_grpo.backends.turn_kv_cache`),
* drop finished sequences from the batch as they stop (short answers free compute for long ones),
* attend with grouped-query attention at decode steps without copying KV heads
  (:mod:`torchrl_grpo.backends.decode_attention`),
* write each step's keys/values into a preallocated cache instead of re-concatenating the whole cache per step
  (:mod:`torchrl_grpo.backends.kv_cache`; ``aten::cat`` was 20% of SmolLM2 decode time),
* return the behaviour log-prob of each sampled token under the distribution actually sampled from
  (``log_softmax(top_p(top_k(logits / T)))``, :mod:`torchrl_grpo.objectives.sampling`), with no second forward pass.
* partial rollouts (AReaL's interruptible generation; :attr:`RolloutBackend.weight_update_hook`): every
  ``partial_rollout_chunk`` decode steps the hook may load new weights; the unfinished rows are then re-prefilled
  (prompt + tokens so far) under the new weights — their old KV cache is the old policy's — and decoding goes on,
  so every later token and its log-prob are the new policy's; ``Generation.versions`` records each token's version.
  The re-prefill consumes no random numbers: without a weight change the samples are those of an uninterrupted call.

When colocated with the trainer (``share_module=True``) it samples from the very module being trained, so
:meth:`load_weights` only bumps ``policy_version``; otherwise it copies the weights in.
"""
from __future__ import annotations

import copy
from contextlib import nullcontext
from typing import Iterable

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from torchrl_grpo.config.choices import DECODE_MODES
from torchrl_grpo.exact_paths import exact_log_probs_refusal, fixed_shape_decode_refusal, note_fallback, \
    prefix_cache_refusal
from torchrl_grpo.objectives.sampling import processed_logits
from torchrl_grpo.backends.base import Generation, RolloutBackend, SamplingConfig, iter_named_weights
from torchrl_grpo.backends.decode_attention import decode_attention
from torchrl_grpo.backends.factory import BackendInputs, BackendSpec, register_backend
from torchrl_grpo.backends.graph_decode import STOP_CHECK_EVERY, StaticDecoder, forward_state
from torchrl_grpo.backends.kv_cache import PreallocatedCache, assemble_cache, supports_preallocation
from torchrl_grpo.backends.turn_kv_cache import TurnKVCache

__all__ = ["DECODE_MODES", "TransformersBackend", "make_transformers_backend", "sample_next_token"]

# decode loops (TransformersBackend ``decode``, :data:`~torchrl_grpo.config.choices.DECODE_MODES`): "eager" drops
# finished rows and reads each step's tokens on the host (best on CPU, where a step's arithmetic dominates); "static"
# decodes fixed shapes with no per-step host read; "graph" is "static" with each step replayed as a CUDA graph (CUDA
# only; :mod:`torchrl_grpo.backends.graph_decode`); "auto": "graph" on CUDA, "eager" elsewhere. "static" and "graph"
# run only where :func:`torchrl_grpo.exact_paths.fixed_shape_decode_refusal` accepts the model (else
# "eager", logged once); :attr:`TransformersBackend.decode_path` says which loop ran.


def sample_next_token(
    logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row.

    Args:
        logits: float [N, V] next-token logits.
        sampling: temperature (0 = greedy), top_k and top_p.
        generator: RNG for reproducible sampling.

    Returns:
        ``(token_ids [N] long, log_probs [N] float32)`` — log-prob of each chosen token under the sampled
        distribution: ``log_softmax`` of :func:`torchrl_grpo.objectives.sampling.processed_logits` (temperature-scaled, top-k-
        and nucleus-truncated, renormalised; the trainer's recompute uses the same function); raw ``log_softmax``
        when greedy.
    """
    logits = logits.float()
    if sampling.temperature == 0:
        logp = F.log_softmax(logits, dim=-1)
        tok = logp.argmax(-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    logp = F.log_softmax(processed_logits(logits, temperature=sampling.temperature, top_p=sampling.top_p,
                                          top_k=sampling.top_k), dim=-1)
    # inverse-CDF sampling: one uniform per row and a binary search over the cumulative distribution; same
    # distribution as torch.multinomial, ~9% less decode time on CPU (it is a full-vocab op per step).
    # right=True never lands on a zero-probability token (its CDF step is empty).
    cdf = logp.exp().cumsum(-1)
    u = torch.rand((logits.shape[0], 1), generator=generator, device=logits.device, dtype=cdf.dtype) * cdf[:, -1:]
    tok = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_max(logits.shape[-1] - 1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


class TransformersBackend(RolloutBackend):
    """Rollout backend over an in-process HF causal LM.

    Args:
        model: HF causal LM (may be a peft model); used in eval mode under ``torch.no_grad``.
        pad_token_id: id used for left padding.
        share_module: True if ``model`` is the trainer's own module (colocated); then no copy is made on sync.
        max_batch_size: most sequences decoded at once (longer request lists are processed in chunks,
            keeping each group's samples together).
        prefix_cache_min_tokens: reuse a shared-prefix KV cache only for prefixes at least this long (0 disables).
        gqa_decode: run decode steps of grouped-query-attention models without repeating KV heads
            (:mod:`torchrl_grpo.backends.decode_attention`; same attention, less copying).
        preallocate_kv: decode into a preallocated KV cache (:class:`~torchrl_grpo.backends.kv_cache.PreallocatedCache`;
            same keys/values, no per-step concatenation) when the model has full-attention layers only.
        decode: one of :data:`DECODE_MODES`. Partial rollouts (a ``weight_update_hook``) always decode eagerly, and
            so does a model the fixed-shape decode is not exact for
            (:func:`~torchrl_grpo.exact_paths.fixed_shape_decode_refusal`; logged once).
        turn_cache_mb: cross-turn KV reuse (:mod:`torchrl_grpo.backends.turn_kv_cache`): keep the keys/values of the
            last call's rows, up to this many MiB (a call whose rows need more keeps none); 0 disables it. Runs
            where the prompt-prefix cache is exact (:func:`~torchrl_grpo.exact_paths.prefix_cache_refusal`; else
            the plain path, logged once). ``stats``: ``turn_cache_hits`` (distinct prompts prefilled after kept
            keys/values), ``reused_tokens`` (their kept tokens not prefilled again, beyond the shared prefix),
            ``turn_cache_overflows`` (calls whose rows exceeded the cap).

    Raises:
        ValueError: ``decode`` not in :data:`DECODE_MODES`, ``turn_cache_mb < 0``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pad_token_id: int,
        share_module: bool = True,
        max_batch_size: int = 64,
        prefix_cache_min_tokens: int = 256,
        gqa_decode: bool = True,
        preallocate_kv: bool = True,
        decode: str = "auto",
        turn_cache_mb: float = 0.0,
    ) -> None:
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
        if not turn_cache_mb >= 0:
            raise ValueError(f"turn_cache_mb must be >= 0 (0 disables the cross-turn KV cache), got {turn_cache_mb!r}")
        self.model = model
        self.decode = decode
        self._static: StaticDecoder | None = None
        self.pad_token_id = int(pad_token_id)
        self.share_module = share_module
        self.max_batch_size = int(max_batch_size)
        self.policy_version = 0
        self._generator: torch.Generator | None = None
        self.prefix_cache_min_tokens = int(prefix_cache_min_tokens)
        self.gqa_decode = bool(gqa_decode)
        self.preallocate_kv = bool(preallocate_kv) and supports_preallocation(model)
        self._prefix: tuple[tuple[int, ...], DynamicCache] | None = None
        self._prefix_state: tuple = ()  # forward_state of the model when the prefix cache was built
        self._decode_path: str | None = None
        self._turn = TurnKVCache(int(turn_cache_mb * 2**20)) if turn_cache_mb > 0 else None
        self.stats = {"prefix_hits": 0, "prefix_builds": 0, "prefilled_tokens": 0}
        if self._turn is not None:
            self.stats.update(turn_cache_hits=0, reused_tokens=0, turn_cache_overflows=0)

    @property
    def exact_log_probs(self) -> bool:
        """Colocated (``share_module``): it samples from the trainer's own module in its own precision, so its
        behaviour log-probs equal the trainer's recompute (tested to 1e-4) and can anchor the ratio: every decode loop
        and cache that runs is exact for the model (:mod:`torchrl_grpo.exact_paths`; the model matrix,
        tests/test_model_matrix.py). False, logged once, where no decode can be: RoPE whose frequencies follow the
        sequence length (:func:`~torchrl_grpo.exact_paths.exact_log_probs_refusal`)."""
        if not self.share_module:
            return False
        reason = exact_log_probs_refusal(self.model)
        if reason is not None:
            note_fallback(self.model, "behaviour log-probs", reason,
                          "exact_log_probs=False: the trainer recomputes the PPO anchor")
        return reason is None

    @property
    def decode_path(self) -> str:
        """The decode loop of the last ``generate`` chunk ("eager" | "static" | "graph"; before any call, the one a
        call of unknown length would use): what ``rollout.decode`` resolved to for this model and device."""
        return self._decode_path or self.decode_mode()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def sync_from(self, model: torch.nn.Module, *, probe: list[int] | None = None) -> None:
        """Colocated (``share_module``): the engine already runs ``model``, so only ``policy_version`` moves.
        A copy (``share_module=False``) gets the exported weights, LoRA merged (:meth:`RolloutBackend.sync_from`)."""
        if self.share_module:
            self.load_weights(None)
            self.last_sync_stats = {}
        else:
            super().sync_from(model, probe=probe)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | dict[str, torch.Tensor] | None = None) -> None:
        """Sync new weights. Colocated (shared module): nothing to copy. Otherwise copy by parameter name.

        Raises:
            KeyError: a weight name the backend's model does not have.
        """
        if not self.share_module and weights is not None:
            params = dict(self.model.named_parameters())
            params.update(dict(self.model.named_buffers()))
            with torch.no_grad():
                for name, tensor in iter_named_weights(weights):
                    if name not in params:
                        raise KeyError(f"backend model has no parameter {name!r}")
                    params[name].copy_(tensor.to(params[name].dtype))
        self._prefix = None  # cached keys/values belong to the old weights
        if self._turn is not None:
            self._turn.clear()
        self.policy_version += 1

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[Generation]:
        if not prompts:
            raise ValueError("generate() needs at least one prompt")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty")
        if sampling.seed is not None:
            self._generator = torch.Generator(device="cpu").manual_seed(int(sampling.seed))
        elif self._generator is None:
            self._generator = torch.Generator(device="cpu").manual_seed(torch.initial_seed() % (2**63))
        # chunk by max_batch_size, keeping identical prompts in the same chunk when possible
        order = sorted(range(len(prompts)), key=lambda i: (tuple(prompts[i]), i))
        out: list[Generation | None] = [None] * len(prompts)
        turn = self._turn_cache()
        try:
            with decode_attention(self.model) if self.gqa_decode else nullcontext():
                if turn is not None:  # the state the forward runs under (decode_attention swaps its attention)
                    turn.begin(self.policy_version, forward_state(self.model))
                for s in range(0, len(order), self.max_batch_size):
                    idx = order[s : s + self.max_batch_size]
                    for i, g in zip(idx, self._generate_chunk([prompts[i] for i in idx], sampling)):
                        out[i] = g
        except BaseException:
            if turn is not None:
                turn.clear()
            raise
        if turn is not None:
            turn.finish(self.policy_version)
            if turn.overflowed:
                self.stats["turn_cache_overflows"] += 1
        return out  # type: ignore[return-value]

    def _turn_cache(self) -> TurnKVCache | None:
        """The cross-turn KV cache where it is on and exact for the model (else None, the refusal logged once)."""
        if self._turn is None:
            return None
        refusal = prefix_cache_refusal(self.model)  # padding between kept keys and new tokens, as for the prefix
        if refusal is not None:
            note_fallback(self.model, "cross-turn KV cache", refusal)
            return None
        return self._turn

    def _turn_plan(self, uprompts: list[tuple[int, ...]]):
        """:meth:`TurnKVCache.plan` for ``uprompts`` under the model's current forward state; None: the plain
        prefill."""
        turn = self._turn_cache()
        if turn is None or not turn.entries:
            return None
        return turn.plan(uprompts, forward_state(self.model))

    def _capture_rows(self, prefix: tuple | None, rows: list[tuple[tuple[int, ...], int, torch.Tensor]],
                      keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Keep, for the cross-turn KV cache, each ``(tokens, row, columns)`` of ``rows``: the keys/values
        ``[B, H_kv, T, D]`` per layer at that row's real ``columns`` after the shared ``prefix``."""
        turn = self._turn
        for tokens, row, cols in rows:
            if turn is None or not turn.collecting:
                return
            turn.capture(tokens, prefix, keys, values, row, cols)

    def _shared_prefix(self, uprompts: list[tuple[int, ...]], private: bool = True
                       ) -> tuple[tuple[int, ...], DynamicCache | None]:
        """The longest prefix all prompts share (leaving each >= 1 own token) and its KV cache (batch 1), built once
        and reused while the weights and the forward's Python-level state (peft's active / disabled adapters:
        :func:`~torchrl_grpo.backends.graph_decode.forward_state`) are unchanged; ``((), None)`` when not worth it or
        not exact (a sliding window, ALiBi on key columns: :func:`~torchrl_grpo.exact_paths.prefix_cache_refusal`).
        ``private``: return a deep copy (the caller may write to it); otherwise the kept cache itself, which the
        caller must only read."""
        if self.prefix_cache_min_tokens <= 0:
            return (), None
        refusal = prefix_cache_refusal(self.model)  # padding between prefix and suffix would shift a window
        if refusal is not None:
            note_fallback(self.model, "prompt-prefix KV cache", refusal)
            return (), None
        state = forward_state(self.model)
        if self._prefix is not None and state != self._prefix_state:
            self._prefix = None  # built under another adapter: its keys/values are another forward's
        if self._prefix is not None:
            pre, cache = self._prefix
            if all(len(p) > len(pre) and p[: len(pre)] == pre for p in uprompts):
                self.stats["prefix_hits"] += 1
                return pre, copy.deepcopy(cache) if private else cache
        first = uprompts[0]
        n = min(len(p) for p in uprompts) - 1
        for p in uprompts[1:]:
            k = 0
            while k < n and p[k] == first[k]:
                k += 1
            n = k
        if n < self.prefix_cache_min_tokens:
            return (), None
        pre = first[:n]
        cache = DynamicCache()
        ids = torch.tensor([pre], dtype=torch.long, device=self.device)
        self.model(input_ids=ids, past_key_values=cache, use_cache=True)
        self.stats["prefix_builds"] += 1
        self.stats["prefilled_tokens"] += n
        self._prefix, self._prefix_state = (pre, cache), state
        return pre, copy.deepcopy(cache) if private else cache

    def _prefill(self, prompts: list[list[int]], new_tokens: int = 0):
        """Prefill each distinct prompt once (after a shared-prefix KV cache when there is one, or after a row's
        kept keys/values of the last call: :mod:`~torchrl_grpo.backends.turn_kv_cache`) and fan out to rows;
        ``new_tokens``: decode steps to preallocate KV room for.

        Layout of each row's cache columns: ``[shared prefix | pad | kept own part | pad | new tokens]`` (no kept
        parts: ``[shared prefix | pad | prompt suffix]``), padding masked, position ids the mask's cumulative sum.

        Returns:
            ``(logits [B, V], cache, attention_mask [B, S] long, next_pos [B] long, prefix)`` for the B rows of
            ``prompts``; ``prefix`` the shared-prefix ``(tokens, cache)`` the rows' columns start with (None: none).
        """
        model, dev = self.model, self.device
        uniq: dict[tuple[int, ...], int] = {}
        row_to_uniq = [uniq.setdefault(tuple(p), len(uniq)) for p in prompts]
        uprompts = list(uniq.keys())
        U = len(uprompts)
        plan = self._turn_plan(uprompts)
        if plan is None:
            prefix, cache = self._shared_prefix(uprompts, private=not self.preallocate_kv)
            ref = self._prefix if prefix else None
            kept = [None] * U
        else:
            ref, kept = plan
            prefix = ref[0] if ref is not None else ()
        Lp = len(prefix)
        own = [e.own_len if e is not None else 0 for e in kept]
        C = max(own)  # columns of the kept own parts (0 without kept keys/values)
        W0 = Lp + C  # cached columns before the new tokens
        S = max(len(p) - Lp - c for p, c in zip(uprompts, own))
        if plan is not None:
            cache = assemble_cache(ref[1] if ref is not None else None,
                                   [(e.keys, e.values) if e is not None else None for e in kept], C,
                                   capacity=W0 + S + new_tokens if self.preallocate_kv else None)
            self.stats["turn_cache_hits"] += sum(e is not None for e in kept)
            self.stats["reused_tokens"] += sum(own)
        elif self.preallocate_kv:  # copies the shared prefix's keys/values (if any) into fresh buffers
            cache = PreallocatedCache(Lp + S + new_tokens, prefix=cache)
        ids = torch.full((U, S), self.pad_token_id, dtype=torch.long)
        am = torch.zeros((U, W0 + S), dtype=torch.long)
        am[:, :Lp] = 1
        for u, (p, c) in enumerate(zip(uprompts, own)):
            am[u, W0 - c : W0] = 1
            sfx = p[Lp + c :]
            ids[u, S - len(sfx) :] = torch.tensor(sfx, dtype=torch.long)
            am[u, W0 + S - len(sfx) :] = 1
        ids, am = ids.to(dev), am.to(dev)
        pos = (am.cumsum(-1) - 1).clamp_min(0)[:, W0:]
        if cache is None:
            cache = DynamicCache()
        elif plan is None:
            cache.reorder_cache(torch.zeros(U, dtype=torch.long, device=dev))
        self.stats["prefilled_tokens"] += int((am[:, W0:] > 0).sum())
        logits = model(input_ids=ids, attention_mask=am, position_ids=pos, past_key_values=cache, use_cache=True,
                       logits_to_keep=1).logits[:, -1]
        fan = torch.tensor(row_to_uniq, dtype=torch.long, device=dev)
        cache.reorder_cache(fan)
        return logits.index_select(0, fan), cache, am.index_select(0, fan), pos[:, -1].index_select(0, fan) + 1, ref

    @staticmethod
    def _kept_columns(am_row: torch.Tensor, prefix: tuple | None, extra: int = 0) -> torch.Tensor:
        """A row's real cache columns after the shared ``prefix`` (long [n]): the nonzero columns of its attention
        mask ``am_row`` [W], then ``extra`` columns after ``W`` (tokens fed by a fixed-shape decode)."""
        lp = len(prefix[0]) if prefix is not None else 0
        cols = am_row[lp:].nonzero().flatten() + lp
        if extra > 0:
            cols = torch.cat([cols, torch.arange(am_row.shape[0], am_row.shape[0] + extra, device=cols.device)])
        return cols

    def _weights_changed(self, step: int) -> bool:
        """Partial rollouts: after every ``partial_rollout_chunk`` tokens, let the hook load pending weights; True
        if it did (``policy_version`` moved)."""
        chunk, hook = self.partial_rollout_chunk, self.weight_update_hook
        if hook is None or chunk <= 0 or (step + 1) % chunk != 0:
            return False
        before = self.policy_version
        hook()
        if self.policy_version == before:
            return False
        self.stats["partial_interrupts"] = self.stats.get("partial_interrupts", 0) + 1
        return True

    def decode_mode(self, columns: int | None = None) -> str:
        """The decode loop a call uses: ``decode`` with ``auto`` resolved for the model's device; "eager" while a
        partial-rollout hook is set (re-prefilling under new weights needs the row-dropping loop) and where the
        fixed-shape decode is not exact for the model
        (:func:`~torchrl_grpo.exact_paths.fixed_shape_decode_refusal`, logged once).

        Args:
            columns: cache columns the call fills (longest prompt + ``max_new_tokens``); None: unknown (a sliding
                window then refuses the fixed-shape loop).
        """
        if self.weight_update_hook is not None and self.partial_rollout_chunk > 0:
            return "eager"
        mode = self.decode
        if mode == "auto":
            mode = "graph" if self.device.type == "cuda" else "eager"
        if mode == "graph" and self.device.type != "cuda":
            mode = "static"
        if mode != "eager":
            refusal = fixed_shape_decode_refusal(self.model, columns)
            if refusal is not None:
                note_fallback(self.model, f"rollout.decode={mode}", refusal)
                mode = "eager"
        return mode

    @torch.no_grad()
    def _generate_chunk(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[Generation]:
        mode = self.decode_mode(max(map(len, prompts)) + sampling.max_new_tokens)
        self._decode_path = mode
        if mode != "eager":
            return self._generate_chunk_static(prompts, sampling, graphs=mode == "graph")
        model, dev = self.model, self.device
        was_training = model.training
        model.eval()
        try:
            # 1. prefill each distinct prompt once, after a shared-prefix KV cache when there is one; fan out to rows
            logits, cache, am, next_pos, prefix = self._prefill(prompts, sampling.max_new_tokens)
            B = len(prompts)
            keep_rows = self._turn_cache() is not None  # cross-turn KV cache: keep each row's keys/values at its end
            stop = set(sampling.stop_token_ids)
            stop_t = torch.tensor(sorted(stop), dtype=torch.long, device=dev) if stop else None
            toks: list[list[int]] = [[] for _ in range(B)]
            lps: list[list[float]] = [[] for _ in range(B)]
            vers: list[list[int]] = [[] for _ in range(B)]
            finish = ["length"] * B
            active = torch.arange(B, device=dev)  # row ids still generating, aligned with cache rows
            for step in range(sampling.max_new_tokens):
                tok, lp = sample_next_token(logits, sampling, self._generator if dev.type == "cpu" else None)
                tok_l, lp_l, act_l = tok.tolist(), lp.tolist(), active.tolist()
                v = self.policy_version
                for r, t, lp_r in zip(act_l, tok_l, lp_l):
                    toks[r].append(t)
                    lps[r].append(lp_r)
                    vers[r].append(v)
                done = torch.isin(tok, stop_t) if stop_t is not None else torch.zeros_like(tok, dtype=torch.bool)
                done_l = done.nonzero().flatten().tolist()
                for j in done_l:
                    finish[act_l[j]] = "stop"
                last = step == sampling.max_new_tokens - 1
                if keep_rows and self._turn.collecting and (done_l or last):
                    # each stopping row's keys/values: its prompt and every token but the one just sampled (not fed)
                    self._capture_rows(prefix, [(tuple(prompts[act_l[j]]) + tuple(toks[act_l[j]][:-1]), j,
                                                 self._kept_columns(am[j], prefix))
                                                for j in (range(len(act_l)) if last else done_l)],
                                       [lay.keys for lay in cache.layers], [lay.values for lay in cache.layers])
                if last:
                    break
                keep = (~done).nonzero().flatten()
                if keep.numel() == 0:
                    break
                if keep.numel() < active.numel():
                    cache.reorder_cache(keep)
                    active, tok, am, next_pos = active[keep], tok[keep], am[keep], next_pos[keep]
                if self._weights_changed(step):
                    # partial rollout: the cached keys/values are the old policy's; re-encode prompt + tokens so far
                    # with the new weights, so every later token is sampled from the new policy
                    logits, cache, am, next_pos, prefix = self._prefill(
                        [prompts[r] + toks[r] for r in active.tolist()], sampling.max_new_tokens - step - 1)
                    continue
                am = torch.cat([am, am.new_ones((am.shape[0], 1))], dim=1)
                logits = model(
                    input_ids=tok[:, None], attention_mask=am, position_ids=next_pos[:, None],
                    past_key_values=cache, use_cache=True,
                ).logits[:, -1]
                next_pos = next_pos + 1
            return [Generation(token_ids=toks[r], logprobs=lps[r], finish_reason=finish[r], versions=vers[r])
                    for r in range(B)]
        finally:
            if was_training:
                model.train()

    @torch.no_grad()
    def _generate_chunk_static(self, prompts: list[list[int]], sampling: SamplingConfig, *, graphs: bool
                               ) -> list[Generation]:
        """Fixed-shape decode (:mod:`torchrl_grpo.backends.graph_decode`): no row is dropped, tokens and log-probs
        stay on the device until the end, "every row stopped" is read every ``STOP_CHECK_EVERY`` steps; on CUDA with
        ``graphs`` each step's forward is a replayed CUDA graph."""
        model, dev = self.model, self.device
        was_training = model.training
        model.eval()
        try:
            logits, cache, am, next_pos, prefix = self._prefill(prompts, 0)
            B, T = len(prompts), sampling.max_new_tokens
            if self._static is None or self._static.model is not model:
                self._static = StaticDecoder(model, use_graphs=graphs)
            self._static.use_graphs = graphs
            stop_t = torch.tensor(sorted(set(sampling.stop_token_ids)), dtype=torch.long, device=dev) \
                if sampling.stop_token_ids else None
            toks = torch.zeros((B, T), dtype=torch.long, device=dev)
            lps = torch.zeros((B, T), dtype=torch.float32, device=dev)
            done = torch.zeros(B, dtype=torch.bool, device=dev)
            slot = self._static.start(cache, am, next_pos, T) if T > 1 else None
            kv = (slot.keys, slot.values) if slot is not None else \
                ([lay.keys for lay in cache.layers], [lay.values for lay in cache.layers])
            del cache
            gen = self._generator if dev.type == "cpu" else None
            n = 0
            for step in range(T):
                tok, lp = sample_next_token(logits, sampling, gen)
                toks[:, step], lps[:, step] = tok, lp
                n = step + 1
                if stop_t is not None:
                    done |= torch.isin(tok, stop_t)
                    if n % STOP_CHECK_EVERY == 0 and bool(done.all()):
                        break
                if n == T:
                    break
                logits = self._static.step(slot, tok)
            tok_rows, lp_rows = toks[:, :n].tolist(), lps[:, :n].tolist()  # the one read of the whole generation
            stop = set(sampling.stop_token_ids)
            v = self.policy_version
            out = []
            for r in range(B):
                t_r, reason = tok_rows[r], "length"
                for j, t in enumerate(t_r):
                    if t in stop:
                        t_r, reason = t_r[: j + 1], "stop"
                        break
                out.append(Generation(token_ids=t_r, logprobs=lp_rows[r][: len(t_r)], finish_reason=reason,
                                      versions=[v] * len(t_r)))
            if self._turn_cache() is not None:  # slot column W + j holds the keys/values of sampled token j
                self._capture_rows(prefix, [(tuple(prompts[r]) + tuple(g.token_ids[:-1]), r,
                                             self._kept_columns(am[r], prefix, len(g.token_ids) - 1))
                                            for r, g in enumerate(out)], *kv)
            return out
        finally:
            if was_training:
                model.train()


def make_transformers_backend(inputs: BackendInputs, *, max_batch_size: int = 64,
                              decode: str = "auto", turn_cache_mb: float = 0.0) -> TransformersBackend:
    """The registered factory of ``rollout.backend=transformers``: a backend sharing ``inputs.model`` (sync is a
    no-op), or, with ``inputs.own_copy``, generating from a merged (LoRA), frozen copy on ``inputs.device``
    (None: the model's), synced by weight copy across devices.

    Args:
        inputs: the engine-neutral :class:`~torchrl_grpo.backends.factory.BackendInputs`.
        max_batch_size: ``rollout.max_batch_size``, most sequences per generate call.
        decode: ``rollout.decode``, the decode loop (:data:`DECODE_MODES`).
        turn_cache_mb: ``rollout.turn_cache_mb``, the cross-turn KV cache's cap in MiB (0: off).

    Raises:
        ValueError: ``decode`` not in :data:`DECODE_MODES`, ``turn_cache_mb < 0``.
    """
    model = inputs.model
    if inputs.own_copy:
        model = copy.deepcopy(model)
        if hasattr(model, "peft_config"):
            model = model.merge_and_unload()
        model.eval().requires_grad_(False)
        if inputs.device is not None:
            model.to(inputs.device)
    return TransformersBackend(model, pad_token_id=inputs.tokenizer.pad_token_id, share_module=not inputs.own_copy,
                               max_batch_size=max_batch_size, decode=decode, turn_cache_mb=turn_cache_mb)


register_backend(BackendSpec("transformers", make_transformers_backend,
                             settings=("max_batch_size", "decode", "turn_cache_mb")))
