r"""Per-token log-probs of sampled sequences under the trainer's model (the :math:`\log\pi_\theta(o_t|\cdot)` of GRPO).

Two savings over one plain forward over the whole padded batch, both exact up to float rounding:

* **Response tokens only.** Only response tokens need log-probs: with ``response_mask`` given, the decoder runs from
  the first response column on and the LM head (a [hidden x vocab] matmul, ~27% of Qwen2.5-0.5B's forward FLOPs)
  only at response positions — not over the prompt, tool outputs or padding — in chunks whose [chunk, vocab] logits
  are recomputed in the backward pass instead of stored (a multi-turn tau2 micro-batch of 8 episodes otherwise kept
  ~15 GB of Qwen logits and was OOM-killed on a 24 GB machine). Models whose logits are not plainly
  ``lm_head(last_hidden_state)`` (soft-capping, scaling) use their own forward with ``logits_to_keep``.
* **Fused log-softmax at the sampled token.** ``log pi(o_t) = z[o_t] - logsumexp(z)`` with ``z = logits / T`` and
  the hand-written gradient ``d/dz = g (onehot(o_t) - softmax(z))`` (:class:`_TargetLogSoftmax`), instead of autograd
  through ``log_softmax`` + ``gather``, whose backward allocates and zero-fills a [N, V] gradient, keeps the [N, V]
  log-softmax output and runs ``log_softmax_backward`` over it. When the whole call's fp32 logits fit
  :data:`HEAD_KEEP_BYTES` they are kept for the backward pass instead of recomputing the LM head there
  (checkpointing); above it, chunks are recomputed as before. Measured on the train_bench GSM8K update (SmolLM2,
  4 x 128 response tokens per micro-batch, 2 cores): ``benchmarks/results/update_ab_bench.md``, 1.10x on the update.
* **Group-shared prefix.** The ``n_samples`` episodes of a GRPO group start with the same prompt. Columns before
  the window that are identical across rows are run once per distinct prefix (``use_cache=True``), the resulting
  KV cache is gathered to every row (differentiable: gradients of all rows flow back into the one prefix pass),
  and only the suffixes run per row. A group of G episodes then pays one prompt forward/backward, not G.

Sharing needs a KV cache, so it is off when the model trains with gradient checkpointing (HF turns the cache off
there) and for models whose forward has no ``past_key_values``; the plain path is used then. The update
(:class:`torchrl_grpo.training.update.GRPOUpdate`) goes further with ``prefix=``: the prefix common to a whole minibatch
runs once for all its micro-batches, under gradient checkpointing too (:mod:`torchrl_grpo.objectives.shared_prefix`).

Which distribution: ``log_softmax`` of :func:`torchrl_grpo.objectives.sampling.processed_logits` (temperature, then top-k,
then nucleus top-p, renormalised), the function the transformers backend samples with, so the recomputed
log-probs are the behaviour policy's. A token the truncation drops has probability 0 (log-prob ``-inf``); on-policy
it cannot have been sampled, but off-policy (a stale batch, a different engine's numerics at the nucleus boundary)
it can. Its log-prob is then reported as :data:`MASKED_LOG_PROB` instead of ``-inf``, with zero gradient.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from torchrl_grpo.exact_paths import note_fallback, shared_prefix_refusal
from torchrl_grpo.objectives.sampling import check_processing, processed_logits
from torchrl_grpo.objectives.shared_prefix import SharedPrefix, cache_under_checkpointing, sharing_pays

__all__ = ["token_log_probs", "Window", "HEAD_CHUNK", "MASKED_LOG_PROB"]

#: positions per LM-head chunk (see :func:`_selected_log_probs`): 1024 x 151k fp32 logits = 0.6 GB transient.
#: With top-k/top-p truncation the chunk is halved: the mask and masked copies raise the measured peak of one
#: 1024-position no-grad chunk (V = 151,936, CPU RSS) from 1.23 GB to 1.99 GB (top-p or top-k) / 2.60 GB (both);
#: 512 positions truncated take 1.00 / 1.31 GB. (With the entropy, 3.05 GB either way at 1024.)
HEAD_CHUNK = 1024

#: fp32 logits bytes a whole :func:`token_log_probs` call may keep for its backward pass (the fused path only;
#: otherwise the LM head runs again per chunk in the backward pass). 512 response positions x 49,152 (SmolLM2) =
#: 96 MiB are kept; 512 x 151,936 (Qwen) = 297 MiB are recomputed, as are multi-turn tau2 micro-batches.
HEAD_KEEP_BYTES = 256 * 2**20

#: Log-prob (nats) reported for a token outside the top-k/nucleus set (true value ``-inf``). ``-inf`` itself would
#: make the ratio 0 but the k3 KL to a reference that keeps the token infinite (``exp(ref - logp)``) and poison the
#: backward pass with ``0 * inf``. At -50 the ratio ``exp(-50 - old)`` is ~0 (< 1e-9 for any old log-prob above
#: -29), which the clipped surrogate handles (no gradient either way), while ``exp(50 + ref) <= 5.2e21`` stays far
#: from float32 overflow (3.4e38). The token gets no gradient (it has no logit to push inside the support).
MASKED_LOG_PROB = -50.0


class Window(NamedTuple):
    """What :func:`token_log_probs` would otherwise read back from the device about its rows (``window=``)."""

    start: int  # the first column holding a scored token in any row (>= 1)
    scored: int  # scored tokens (response_mask & attention_mask) in all rows
    right_padded: bool = False  # every row's real tokens come first (attention_mask[i] = 1 for exactly its first n)


def _uses_grad_checkpointing(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "is_gradient_checkpointing", False)) and model.training


_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def _decoder_and_head(model: torch.nn.Module):
    """``(decoder, lm_head)`` when the model's logits are exactly ``lm_head(decoder(...).last_hidden_state)`` (HF
    causal LMs without logit soft-capping/scaling, peft-wrapped or not); else None (the model's own forward is used).
    None for an FSDP-sharded model (:mod:`torchrl_grpo.distributed.data_parallel`): its root's forward gathers the embeddings,
    final norm and LM head, which calling the decoder alone would leave sharded."""
    from torchrl_grpo.distributed.data_parallel import is_fsdp

    if is_fsdp(model):
        return None
    cfg = getattr(model, "config", None)
    if any(getattr(cfg, a, None) not in (None, 1, 1.0) for a in _LOGIT_TRANSFORMS):
        return None
    try:
        dec, head = model.get_decoder(), model.get_output_embeddings()
    except Exception:
        return None
    if dec is None or dec is model or not isinstance(head, torch.nn.Module):
        return None
    return dec, head


def _window_outputs(model, dec_head, tokens, am, pos, start: int, share_prefix: bool,
                   prefix: SharedPrefix | None = None, causal_only: bool = False) -> tuple[torch.Tensor, bool]:
    """Outputs at positions ``start-1 .. T-2`` (those predicting ``tokens[:, start:]``): final hidden states
    [b, T-start, H] when ``dec_head`` is given, else logits [b, T-start, V]. Also returns whether a shared-prefix
    path ran. With ``prefix`` (checked by the caller: every row starts with it, ``prefix.length < start``, and
    ``dec_head`` is given) only ``tokens[:, P:]`` run, against the prefix's keys/values. ``causal_only``: the rows
    are right-padded (real tokens first), so the model gets no padding mask: with causal attention a real token never
    sees the padding after it (the padding's own outputs are never read), and the attention needs no mask
    (transformers then reads none back to decide that; SDPA takes its causal kernel)."""
    b, T = tokens.shape
    mask = None if causal_only else am
    net = dec_head[0] if dec_head is not None else model

    def run(**kw):
        out = net(**kw)
        return out.last_hidden_state if dec_head is not None else out.logits

    if prefix is not None:  # cross-micro-batch shared prefix (torchrl_grpo.objectives.shared_prefix): remainders only
        Pp = prefix.length
        with cache_under_checkpointing(model):
            out = dec_head[0](input_ids=tokens[:, Pp:], attention_mask=mask, position_ids=pos[:, Pp:],
                              past_key_values=prefix.cache(), use_cache=False).last_hidden_state
        return out[:, start - 1 - Pp : -1], True
    P = start - 1  # columns [0, P) need no outputs: candidates for the shared prefix
    if share_prefix and P >= 1 and b > 1 and not _uses_grad_checkpointing(model) \
            and sharing_pays(P * (b - 1), model, tokens.device):  # upper bound of the saving: no read needed
        key = torch.cat([tokens[:, :P], am[:, :P]], dim=1)
        uniq, inv = torch.unique(key, dim=0, return_inverse=True)
        U = uniq.shape[0]
        if U < b:
            rep = torch.empty(U, dtype=torch.long, device=tokens.device).scatter_(
                0, inv, torch.arange(b, device=tokens.device))
            kw = {} if dec_head is not None else {"logits_to_keep": 1}
            pre = net(input_ids=tokens[rep, :P], attention_mask=None if mask is None else mask[rep, :P],
                      position_ids=pos[rep, :P],
                      use_cache=True, **kw)
            cache = getattr(pre, "past_key_values", None)
            if cache is not None and hasattr(cache, "batch_select_indices"):
                cache.batch_select_indices(inv)  # [U, ...] -> [b, ...], differentiable gather
                out = run(input_ids=tokens[:, P:], attention_mask=mask, position_ids=pos[:, P:],
                          past_key_values=cache, use_cache=True)
                return out[:, :-1], True
    if dec_head is not None:
        return run(input_ids=tokens, attention_mask=mask, position_ids=pos)[:, start - 1 : -1], False
    return _forward_logits(model, tokens, mask, pos, T - start + 1)[:, :-1], False


def _forward_logits(model, tokens, am, pos, keep: int) -> torch.Tensor:
    """Logits of the last ``keep`` positions; falls back to full logits if the model has no ``logits_to_keep``."""
    try:
        return model(input_ids=tokens, attention_mask=am, position_ids=pos, logits_to_keep=keep).logits[:, -keep:]
    except TypeError:
        return model(input_ids=tokens, attention_mask=am, position_ids=pos).logits[:, -keep:]


class _TargetLogSoftmax(torch.autograd.Function):
    r"""``log_softmax(logits / T)[n, targets[n]]`` for float32 ``logits`` [N, V] and long ``targets`` [N] -> [N].

    Forward: :math:`\log\pi(o_n) = z_{n,o_n} - \operatorname{logsumexp}_v z_{n,v}` with :math:`z = \ell / T`
    (temperature scaling as in :func:`torchrl_grpo.objectives.sampling.processed_logits`). Backward, for upstream gradient
    :math:`g_n`: :math:`\partial/\partial \ell_{n,v} = (g_n / T)(\mathbb 1[v = o_n] - \operatorname{softmax}(z_n)_v)`
    (the softmax cross-entropy gradient, e.g. Goodfellow et al., *Deep Learning*, 2016, eq. 6.31), computed into one
    [N, V] buffer. Saved: ``logits`` (the caller decides whether that fits, :data:`HEAD_KEEP_BYTES`), ``targets``
    and the [N] log-normalisers. Equal to autograd through ``log_softmax`` + ``gather`` up to float rounding
    (tests/test_log_probs.py).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
        z = logits / temperature if temperature != 1.0 else logits
        lse = torch.logsumexp(z, dim=-1)
        lp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        return lp

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        logits, targets, lse = ctx.saved_tensors
        T = ctx.temperature
        # softmax(z) in the one new [N, V] buffer, then g/T * (onehot - softmax) in place
        grad = (logits.div(T).sub_(lse[:, None]) if T != 1.0 else logits.sub(lse[:, None])).exp_()
        gs = (g / T if T != 1.0 else g)[:, None]
        grad.mul_(-gs).scatter_add_(-1, targets[:, None], gs)
        return grad, None, None


def _fusable(with_entropy: bool, top_p: float, top_k: int) -> bool:
    """Whether :class:`_TargetLogSoftmax` computes what :func:`_head_log_probs` is asked for (no entropy, no
    truncation: the scored distribution is the temperature-scaled softmax)."""
    return not with_entropy and top_p >= 1.0 and top_k <= 0


def _vocab_size(head) -> int | None:
    """Output width of the LM head (``out_features`` or the weight's rows; peft layers through ``base_layer``)."""
    for m in (head, getattr(head, "base_layer", None)):
        if m is None:
            continue
        if isinstance(getattr(m, "out_features", None), int):
            return m.out_features
        w = getattr(m, "weight", None)
        if isinstance(w, torch.Tensor) and w.ndim == 2:
            return int(w.shape[0])
    return None


def _head_log_probs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool,
                    top_p: float = 1.0, top_k: int = 0):
    """log pi(target) (and the entropy of pi) from final hidden states [N, H]: LM head, float32 processed logits
    (:func:`torchrl_grpo.objectives.sampling.processed_logits`), log-softmax. Targets outside the kept set get
    :data:`MASKED_LOG_PROB`; dropped tokens contribute 0 to the entropy. Without entropy or truncation the
    fused :class:`_TargetLogSoftmax` computes the same log-probs."""
    if _fusable(with_entropy, top_p, top_k):  # (temperature checked by token_log_probs, the only caller)
        lp = _TargetLogSoftmax.apply(head(hidden).float(), targets, float(temperature))
        return lp, torch.zeros_like(lp)
    logits = processed_logits(head(hidden).float(), temperature=temperature, top_p=top_p, top_k=top_k)
    logp_all = F.log_softmax(logits, dim=-1)
    lp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    if top_p < 1.0 or top_k > 0:
        # where (not clamp): no gradient reaches the -inf entry, and kept targets stay exact however unlikely
        lp = torch.where(torch.isneginf(lp), torch.full_like(lp, MASKED_LOG_PROB), lp)
    if with_entropy:
        # 0 * log 0 := 0 for dropped tokens (masked_fill, so the backward pass sees no 0 * inf either)
        ent = -(logp_all.exp() * logp_all.masked_fill(torch.isneginf(logp_all), 0.0)).sum(-1)
    else:
        ent = torch.zeros_like(lp)
    return lp, ent


def _selected_log_probs(head, hidden, targets, temperature, with_entropy, chunk: int, top_p: float = 1.0,
                        top_k: int = 0):
    """:func:`_head_log_probs` over chunks of ``chunk`` positions. With gradients on, each chunk's [chunk, V] logits
    are recomputed in the backward pass (activation checkpointing) instead of kept: the saved memory is then O(N x H),
    not O(N x V) (151k-word vocabularies make the latter dominate) — unless the fused path applies and all N x V
    fp32 logits fit :data:`HEAD_KEEP_BYTES`: then they are kept and the head runs once."""
    from torch.utils.checkpoint import checkpoint

    if top_p < 1.0 or top_k > 0:
        chunk = max(1, chunk // 2)  # see HEAD_CHUNK
    V = _vocab_size(head)
    recompute = torch.is_grad_enabled() and hidden.requires_grad and not (
        _fusable(with_entropy, top_p, top_k) and V is not None and hidden.shape[0] * V * 4 <= HEAD_KEEP_BYTES)
    lps, ents = [], []
    for s in range(0, hidden.shape[0], chunk):
        h, t = hidden[s : s + chunk], targets[s : s + chunk]
        if recompute:
            lp, ent = checkpoint(_head_log_probs, head, h, t, temperature, with_entropy, top_p, top_k,
                                 use_reentrant=False)
        else:
            lp, ent = _head_log_probs(head, h, t, temperature, with_entropy, top_p, top_k)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        z = hidden.new_zeros((0,), dtype=torch.float32)
        return z, z
    return torch.cat(lps), torch.cat(ents)


def token_log_probs(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    with_entropy: bool = False,
    logits_chunk: int = 0,
    response_mask: torch.Tensor | None = None,
    share_prefix: bool = True,
    prefix: SharedPrefix | None = None,
    window: Window | tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs of ``tokens`` under a causal LM.

    Args:
        model: HF causal LM (``model(input_ids, attention_mask, position_ids, ...).logits``), possibly peft-wrapped.
        tokens: long [B, T]; right- or left-padded sequences.
        attention_mask: bool/int [B, T]; 1 for real tokens.
        temperature: logits are divided by it, to match the distribution the behaviour policy sampled from.
        top_p: nucleus mass in (0, 1] the behaviour policy sampled with (1: no truncation).
        top_k: top-k the behaviour policy sampled with (0: no truncation). Temperature, top-k and top-p together
            define the scored distribution pi = softmax(processed logits) (:mod:`torchrl_grpo.objectives.sampling`).
        with_entropy: also return the per-token entropy (nats) of the predictive distribution pi.
        logits_chunk: if > 0, run the model on chunks of this many sequences to bound peak memory
            (the [B, T, vocab] logits dominate it).
        response_mask: optional bool [B, T], the tokens whose log-probs are needed; only they get logits
            computed, every other position is returned as 0.
        share_prefix: run columns before the response window once per distinct prefix (see module docstring);
            off where :func:`~torchrl_grpo.exact_paths.shared_prefix_refusal` refuses the model (logged once).
            Off for an FSDP-sharded model, as is ``logits_chunk``: a call then runs exactly one forward (each is a
            collective, counted per call by :meth:`torchrl_grpo.distributed.data_parallel.DataParallel.lockstep`).
        prefix: a :class:`~torchrl_grpo.objectives.shared_prefix.SharedPrefix` every row starts with, computed once for several
            calls (micro-batches); only the columns after it run here, against its keys/values. Its gradients
            accumulate on its leaves: call its ``backward()`` after the last backward pass that reads it.
        window: a :class:`Window` of these rows (first scored column, scored tokens, right-padded) when the caller
            knows it on the host (the update reads it once per minibatch, :class:`torchrl_grpo.training.update.GRPOUpdate`):
            then the call reads nothing back from the device (no ``nonzero``/boolean indexing: a device sync each on
            CUDA; the ``prefix`` check becomes a device-side assert; right-padded rows run without a padding mask,
            which transformers would read back each forward). Scored tokens are ``response_mask & attention_mask``
            (all real tokens without ``response_mask``); a wrong count is an indexing error. None: derived here.

    Returns:
        ``(log_probs, entropy)``: float32 [B, T] each; position ``t`` holds ``log pi(tokens[t] | tokens[<t])``;
        position 0 (no context), padded positions and positions outside ``response_mask`` are 0; a token outside
        the top-k/nucleus set holds :data:`MASKED_LOG_PROB` (no gradient). ``entropy`` is None unless requested.

    Raises:
        ValueError: ``tokens``/``attention_mask``/``response_mask`` are not matching [B, T] tensors, or
            ``temperature``/``top_p``/``top_k`` out of range (see :func:`~torchrl_grpo.objectives.sampling.processed_logits`);
            ``prefix`` given but a row does not start with it, it reaches the first scored column, or the model's
            logits are not ``lm_head(decoder(...))``.
    """
    _check_inputs(tokens, attention_mask, response_mask, temperature, top_p, top_k)
    am = attention_mask.long()
    # positions count only real tokens, so left padding does not shift rotary positions
    position_ids = (am.cumsum(-1) - 1).clamp_min(0)
    B, T = tokens.shape
    start, n_scored, right_padded = _scored_window(window, response_mask)
    from torchrl_grpo.distributed.data_parallel import is_fsdp

    if is_fsdp(model):  # one forward per call, whatever the rows hold (see share_prefix)
        share_prefix, logits_chunk = False, 0
    # the rule, for a model with a config (e.g. length-dependent RoPE); one without keeps the cache check below
    if share_prefix and getattr(model, "config", None) is not None \
            and (refusal := shared_prefix_refusal(model)) is not None:
        note_fallback(model, "token_log_probs prefix sharing", refusal)
        share_prefix = False
    step = logits_chunk if logits_chunk > 0 else B
    score = (response_mask.bool() if response_mask is not None else torch.ones_like(am, dtype=torch.bool)) & am.bool()
    dec_head = _decoder_and_head(model)
    if prefix is not None:
        _check_prefix(prefix, dec_head, tokens, am, start, checked_on_device=window is not None)
    lps, ents = [], []
    for s in range(0, B, step):
        sl = slice(s, s + step)
        out, _ = _window_outputs(model, dec_head, tokens[sl], am[sl], position_ids[sl], start, share_prefix, prefix,
                                 causal_only=right_padded)
        lp, ent = _scored_log_probs(out, dec_head, tokens[sl], score[sl], start,
                                    n_scored if step == B else None, temperature, with_entropy, top_p, top_k)
        lps.append(lp)
        if with_entropy:
            ents.append(ent)
    lp = torch.cat(lps)
    ent = torch.cat(ents) if with_entropy else None
    return lp, ent


def _check_inputs(tokens, attention_mask, response_mask, temperature: float, top_p: float, top_k: int) -> None:
    """:func:`token_log_probs`'s argument checks (its Raises)."""
    if tokens.ndim != 2 or attention_mask.shape != tokens.shape:
        raise ValueError(f"tokens [B, T] and attention_mask [B, T] expected, got {tuple(tokens.shape)} / {tuple(attention_mask.shape)}")
    if response_mask is not None and response_mask.shape != tokens.shape:
        raise ValueError(f"response_mask must be [B, T] like tokens, got {tuple(response_mask.shape)}")
    check_processing(temperature, top_p, top_k)


def _scored_window(window: Window | tuple | None, response_mask: torch.Tensor | None) -> tuple[int, int | None, bool]:
    """``(start, scored, right_padded)`` of a call: the caller's ``window`` (no device read), else the first column
    any row scores, read from ``response_mask`` (one read; 1 without a mask), scored count unknown (None)."""
    start, n_scored, right_padded = 1, None, False
    if window is not None:
        window = Window(*window)
        start, n_scored, right_padded = max(1, int(window.start)), int(window.scored), bool(window.right_padded)
        if n_scored < 0:
            raise ValueError(f"window's scored-token count must be >= 0, got {n_scored}")
    elif response_mask is not None:
        cols = response_mask.bool().any(0).nonzero()
        if cols.numel():
            start = max(1, int(cols[0]))
    return start, n_scored, right_padded


def _check_prefix(prefix: SharedPrefix, dec_head, tokens: torch.Tensor, am: torch.Tensor, start: int, *,
                  checked_on_device: bool) -> None:
    """Refuse a ``prefix`` that does not apply (ValueError, :func:`token_log_probs`'s Raises); with
    ``checked_on_device`` (the caller gave a window) the rows-start-with-it check is a device-side assert, read by
    no one unless it fails."""
    T = tokens.shape[1]
    why = (f"prefix of {prefix.length} tokens does not apply: rows must start with it (real tokens), end it before "
           f"column {start - 1} (the output predicting the first scored token), and the model's logits must be "
           "lm_head(decoder(...))")
    if dec_head is None or prefix.length >= start or T <= prefix.length:
        raise ValueError(why)
    if not checked_on_device and not prefix.matches(tokens, am):
        raise ValueError(why)
    if checked_on_device:
        torch._assert_async(prefix.matches_on_device(tokens, am), why)


def _scored_log_probs(out: torch.Tensor, dec_head, tokens: torch.Tensor, score: torch.Tensor, start: int,
                      n_scored: int | None, temperature: float, with_entropy: bool, top_p: float, top_k: int):
    """Log-probs (and entropies) [b, T] of one chunk of rows from its window outputs ``out`` (hidden states or
    logits at positions ``start-1 .. T-2``): the scored positions ``score[:, start:]`` gathered (static-size indices
    when their count ``n_scored`` is known: no device sync), scored, and scattered back; 0 elsewhere."""
    sel = score[:, start:]  # [b, T-start]: positions whose log-prob is needed
    zeros = torch.zeros(sel.shape, dtype=torch.float32, device=tokens.device)
    if n_scored is not None:  # the count is known: static-size indices, no device sync
        row, col = torch.nonzero_static(sel, size=n_scored, fill_value=sel.shape[0]).unbind(-1)
        picked, targets = out[row, col], tokens[:, start:][row, col]
        put = lambda v: zeros.index_put((row, col), v)  # noqa: E731
    else:
        picked, targets = out[sel], tokens[:, start:][sel]
        put = lambda v: zeros.masked_scatter(sel, v)  # noqa: E731
    if dec_head is not None:
        lp_sel, ent_sel = _selected_log_probs(dec_head[1], picked, targets, temperature, with_entropy,
                                              chunk=HEAD_CHUNK, top_p=top_p, top_k=top_k)
    else:
        lp_sel, ent_sel = _head_log_probs(lambda x: x, picked, targets, temperature, with_entropy, top_p, top_k)
    lp = F.pad(put(lp_sel), (start, 0))
    return lp, F.pad(put(ent_sel), (start, 0)) if with_entropy else None
