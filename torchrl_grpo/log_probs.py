r"""Per-token log-probs of sampled sequences under the trainer's model (the :math:`\log\pi_\theta(o_t|\cdot)` of GRPO).

Two savings over one plain forward over the whole padded batch, both exact up to float rounding:

* **Response window.** Only positions that can hold a response token need logits: with ``response_mask`` given,
  the LM head (a [hidden x vocab] matmul, ~27% of Qwen2.5-0.5B's forward FLOPs) runs from the first response column
  on, through the model's ``logits_to_keep`` argument, instead of over the prompt too.
* **Group-shared prefix.** The ``n_samples`` episodes of a GRPO group start with the same prompt. Columns before
  the window that are identical across rows are run once per distinct prefix (``use_cache=True``), the resulting
  KV cache is gathered to every row (differentiable: gradients of all rows flow back into the one prefix pass),
  and only the suffixes run per row. A group of G episodes then pays one prompt forward/backward, not G.

Sharing needs a KV cache, so it is off when the model trains with gradient checkpointing (HF turns the cache off
there) and for models whose forward has no ``past_key_values``; the plain path is used then.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["token_log_probs"]


def _uses_grad_checkpointing(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "is_gradient_checkpointing", False)) and model.training


def _forward_logits(model, tokens, am, pos, keep: int) -> torch.Tensor:
    """Logits of the last ``keep`` positions; falls back to full logits if the model has no ``logits_to_keep``."""
    try:
        return model(input_ids=tokens, attention_mask=am, position_ids=pos, logits_to_keep=keep).logits[:, -keep:]
    except TypeError:
        return model(input_ids=tokens, attention_mask=am, position_ids=pos).logits[:, -keep:]


def _window_logits(model, tokens, am, pos, start: int, share_prefix: bool) -> tuple[torch.Tensor, bool]:
    """Logits predicting ``tokens[:, start:]`` (those at positions ``start-1 .. T-2``): [b, T-start, V].

    Returns the logits and whether the shared-prefix path ran.
    """
    b, T = tokens.shape
    P = start - 1  # columns [0, P) need no logits: candidates for the shared prefix
    if share_prefix and P >= 1 and b > 1 and not _uses_grad_checkpointing(model):
        key = torch.cat([tokens[:, :P], am[:, :P]], dim=1)
        uniq, inv = torch.unique(key, dim=0, return_inverse=True)
        U = uniq.shape[0]
        if U < b:
            rep = torch.empty(U, dtype=torch.long, device=tokens.device).scatter_(
                0, inv, torch.arange(b, device=tokens.device))
            pre = model(input_ids=tokens[rep, :P], attention_mask=am[rep, :P], position_ids=pos[rep, :P],
                        use_cache=True, logits_to_keep=1)
            cache = getattr(pre, "past_key_values", None)
            if cache is not None and hasattr(cache, "batch_select_indices"):
                cache.batch_select_indices(inv)  # [U, ...] -> [b, ...], differentiable gather
                out = model(input_ids=tokens[:, P:], attention_mask=am, position_ids=pos[:, P:],
                            past_key_values=cache, use_cache=True)
                return out.logits[:, :-1], True
    return _forward_logits(model, tokens, am, pos, T - start + 1)[:, :-1], False


def token_log_probs(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    logits_chunk: int = 0,
    response_mask: torch.Tensor | None = None,
    share_prefix: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs of ``tokens`` under a causal LM.

    Args:
        model: HF causal LM (``model(input_ids, attention_mask, position_ids, ...).logits``), possibly peft-wrapped.
        tokens: long [B, T]; right- or left-padded sequences.
        attention_mask: bool/int [B, T]; 1 for real tokens.
        temperature: logits are divided by it, to match the distribution the behaviour policy sampled from.
        with_entropy: also return the per-token entropy (nats) of the predictive distribution.
        logits_chunk: if > 0, run the model on chunks of this many sequences to bound peak memory
            (the [B, T, vocab] logits dominate it).
        response_mask: optional bool [B, T], the tokens whose log-probs are needed. Positions before its first
            true column (over the whole batch) are returned as 0 and get no logits computed.
        share_prefix: run columns before the response window once per distinct prefix (see module docstring).

    Returns:
        ``(log_probs, entropy)``: float32 [B, T] each; position ``t`` holds ``log p(tokens[t] | tokens[<t])``;
        position 0 (no context), padded positions and positions before the response window are 0.
        ``entropy`` is None unless requested.

    Raises:
        ValueError: ``tokens``/``attention_mask``/``response_mask`` are not matching [B, T] tensors.
    """
    if tokens.ndim != 2 or attention_mask.shape != tokens.shape:
        raise ValueError(f"tokens [B, T] and attention_mask [B, T] expected, got {tuple(tokens.shape)} / {tuple(attention_mask.shape)}")
    if response_mask is not None and response_mask.shape != tokens.shape:
        raise ValueError(f"response_mask must be [B, T] like tokens, got {tuple(response_mask.shape)}")
    am = attention_mask.long()
    # positions count only real tokens, so left padding does not shift rotary positions
    position_ids = (am.cumsum(-1) - 1).clamp_min(0)
    B, T = tokens.shape
    start = 1
    if response_mask is not None:
        cols = response_mask.bool().any(0).nonzero()
        if cols.numel():
            start = max(1, int(cols[0]))
    step = logits_chunk if logits_chunk > 0 else B
    lps, ents = [], []
    for s in range(0, B, step):
        sl = slice(s, s + step)
        logits, _ = _window_logits(model, tokens[sl], am[sl], position_ids[sl], start, share_prefix)
        logits = logits.float()
        if temperature != 1.0:
            logits = logits / temperature
        logp_all = F.log_softmax(logits, dim=-1)
        lp = logp_all.gather(-1, tokens[sl, start:].unsqueeze(-1)).squeeze(-1)
        lps.append(F.pad(lp, (start, 0)))
        if with_entropy:
            ent = -(logp_all.exp() * logp_all).sum(-1)
            ents.append(F.pad(ent, (start, 0)))
    lp = torch.cat(lps) * am.to(torch.float32)
    ent = torch.cat(ents) * am.to(torch.float32) if with_entropy else None
    return lp, ent
