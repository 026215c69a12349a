r"""Grouped-query attention for one-token decode steps without repeating the KV heads.

Models with grouped-query attention (GQA; Ainslie et al., 2023, arXiv:2305.13245) share each key/value head among
``n_rep = H / H_kv`` query heads. transformers' SDPA path passes GQA to the kernel only when there is no attention
mask; with the left padding of a batched decode it copies every KV head ``n_rep`` times at every step
(``repeat_kv``: ~10% of SmolLM2-135M decode time on CPU, measured with py-spy) and runs attention over ``H`` heads.

For a decode step (query length 1) the ``n_rep`` query heads of a group can instead be laid out along the query-length
axis, ``q [B, H, 1, D] -> [B, H_kv, n_rep, D]``, and attend to the un-repeated ``k, v [B, H_kv, T, D]`` with the same
``[B, 1, 1, T]`` padding mask: each row of ``softmax(q k^T / sqrt(D)) v`` (Vaswani et al., 2017, Eq. 1) is computed
independently, so the result is the same attention. Query lengths > 1 (prefill, training) and non-GQA models go
through transformers' own SDPA function unchanged.

:func:`decode_attention` switches a model to it for the duration of a ``with`` block (the rollout backend's decode
loop) and restores the model's setting afterwards; it does nothing for models where
:func:`~torchrl_grpo.exact_paths.gqa_decode_refusal` refuses it (not on ``sdpa``, attention soft-capping,
attention sinks).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

from torchrl_grpo.exact_paths import GQA_DECODE_IMPLEMENTATION, gqa_decode_refusal, note_fallback, \
    text_config

__all__ = ["ATTN_IMPLEMENTATION", "gqa_decode_sdpa", "decode_attention"]

ATTN_IMPLEMENTATION = GQA_DECODE_IMPLEMENTATION
_registered = False


def gqa_decode_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                    **kwargs):
    """transformers attention function (``AttentionInterface`` signature).

    Args:
        query: [B, H, q_len, D]; key, value: [B, H_kv, T, D]; attention_mask: None, or bool/float broadcastable to
            [B, 1, q_len, T] (transformers' SDPA mask).

    Returns:
        ``(out [B, q_len, H, D], None)`` like transformers' ``sdpa_attention_forward``.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n_rep = int(getattr(module, "num_key_value_groups", 1) or 1)
    B, H, q_len, D = query.shape
    if q_len != 1 or n_rep == 1 or module.training or dropout or kwargs.get("output_attentions", False):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    h_kv = key.shape[1]
    q = query.reshape(B, h_kv, n_rep, D)  # head h = kv * n_rep + r, the order repeat_kv uses
    mask = attention_mask
    if mask is not None:
        mask = mask[..., : key.shape[-2]]
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling, is_causal=False)
    return out.reshape(B, H, 1, D).transpose(1, 2).contiguous(), None


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, gqa_decode_sdpa)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    _registered = True


@contextmanager
def decode_attention(model: torch.nn.Module):
    """Use :func:`gqa_decode_sdpa` in ``model`` (and its sub-configs) inside the block, if it runs on ``sdpa`` and
    :func:`~torchrl_grpo.exact_paths.gqa_decode_refusal` accepts it (else the model's own attention, with
    one warning when the model is on ``sdpa``)."""
    reason = gqa_decode_refusal(model)
    if reason is not None:
        if getattr(text_config(model), "_attn_implementation", None) == "sdpa":
            note_fallback(model, "GQA decode attention", reason)
        yield model
        return
    configs = []
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and getattr(cfg, "_attn_implementation", None) == "sdpa" and all(cfg is not c for c in configs):
            configs.append(cfg)
    if not configs:
        yield model
        return
    _register()
    for cfg in configs:
        cfg._attn_implementation = ATTN_IMPLEMENTATION
    try:
        yield model
    finally:
        for cfg in configs:
            cfg._attn_implementation = "sdpa"
