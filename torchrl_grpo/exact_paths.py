"""Which fast paths are exact for a model: the one rule, read from the model's config.

Several fast paths rebuild what a transformers model's own code normally builds (its attention masks, position ids,
KV cache). Each is exact only for the models whose own code would build the same thing:

================================  ==========================================================================
path (who uses it)                exact when (else the plain path runs, with one warning per model and path)
================================  ==========================================================================
fixed-shape / CUDA-graph decode   attention ``sdpa`` (a boolean ``[B, 1, 1, C]`` mask means "attend" only to
(``graph_decode``, backend        SDPA: eager attention *adds* it to the scores, i.e. masks nothing), no
``decode=static|graph``)          attention soft-capping or sinks, a model type run through the model matrix
                                  (:data:`FIXED_SHAPE_VERIFIED`), and no sliding window that bites: every layer
                                  full attention, or the window at least the decode's columns (prompt + new
                                  tokens), since one mask serves every layer
preallocated KV cache             every layer full or sliding-window attention: it keeps every column, as the
(``kv_cache``)                    ``DynamicCache()`` the backend otherwise builds (full-length layers), and
                                  transformers builds the window into the mask (on cache columns)
backend prompt-prefix cache       every layer full attention: prefix + left-padded suffix puts padding *between*
(backend ``_shared_prefix``)      real tokens, which shifts a sliding window (it counts cache columns)
GQA decode attention              attention ``sdpa`` without soft-capping or sinks (``decode_attention``
(``decode_attention``)            replaces transformers' SDPA function at one-token steps)
shared-prefix update              logits are ``lm_head(decoder(...))`` (checked in ``objectives/log_probs``) and
(``objectives/shared_prefix``)    every layer full or sliding-window attention: its caches hold every column and
                                  the prefix is real tokens from column 0, so transformers' window mask (on cache
                                  columns) is the plain forward's (Mistral, gpt-oss: equal to 4e-6 in the matrix)
================================  ==========================================================================

Measured before this rule (tiny random models of the matrix's shape, CPU, ``decode=static``; max |behaviour -
recompute| log-prob, greedy / T=0.7 top-p 0.9 top-k 20): Llama with eager attention 1.95 / 47.2 nats, Mistral (SDPA)
with a sliding window of 16 0.261 / 0.562 and of 4 4.54 / 48.8, each with other greedy tokens than
``model.generate``; now they decode eagerly, within 2.4e-6. The backend's prompt-prefix cache on sliding-window models:
1.4 (Mistral, window 4) to 47 nats (Gemma 2, gpt-oss). The plain paths (the eager decode loop, the plain update) run
the model's own forward and are exact for every model in the matrix (<= 1e-4, ``tests/test_model_matrix.py``).

Each ``*_refusal`` function returns None when the path is exact for the model, else a one-line reason.
"""
from __future__ import annotations

import logging
import weakref

import torch

__all__ = ["FIXED_SHAPE_VERIFIED", "GQA_DECODE_IMPLEMENTATION", "SDPA_IMPLEMENTATIONS", "fixed_shape_decode_refusal",
           "full_attention_refusal", "full_length_cache_refusal", "gqa_decode_refusal", "note_fallback", "shared_prefix_refusal", "sliding_window",
           "text_config"]

log = logging.getLogger(__name__)

#: model types whose fixed-shape decode we ran against ``model.generate`` and the recompute (tests/test_model_matrix.py)
FIXED_SHAPE_VERIFIED = frozenset({"llama", "qwen2", "qwen3", "mistral", "phi3"})
#: the name :mod:`torchrl_grpo.backends.decode_attention` registers its SDPA-based decode attention under
GQA_DECODE_IMPLEMENTATION = "torchrl_grpo_gqa_decode"
#: attention implementations that read a boolean mask as "attend": transformers' SDPA and our GQA decode over it
SDPA_IMPLEMENTATIONS = frozenset({"sdpa", GQA_DECODE_IMPLEMENTATION})
#: a window this small is "not full attention" whatever the length (attention chunking, linear attention, ...)
_ALWAYS = 0

_warned: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(path, reason)} already logged


def text_config(model: torch.nn.Module):
    """The decoder's config of ``model`` (a peft wrapper's base model's; a multimodal model's text config); None if
    the model has no config."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    try:
        return config.get_text_config(decoder=True)
    except (AttributeError, TypeError):
        return config


def sliding_window(config) -> int | None:
    """The smallest number of key columns some layer may attend to, None when every layer attends to all columns.

    Read from ``layer_types`` where the config has them (``"full_attention"`` everywhere: None; ``"sliding_attention"``:
    ``config.sliding_window``; anything else, e.g. chunked or linear attention: 0), else from ``sliding_window`` (and
    ``use_sliding_window``, which Qwen2 keeps off by default) and ``attention_chunk_size``."""
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if getattr(config, "attention_chunk_size", None):
        return _ALWAYS
    if types is not None:
        kinds = set(types) - {"full_attention"}
        if not kinds:
            return None
        return int(window) if kinds == {"sliding_attention"} and window else _ALWAYS
    if getattr(config, "use_sliding_window", True) is False or not window:
        return None
    return int(window)


def full_attention_refusal(model: torch.nn.Module) -> str | None:
    """None when every decoder layer of ``model`` attends to all columns (no sliding window / chunked / linear
    attention), else the reason: the preallocated KV cache and the backend's prompt-prefix cache need it."""
    config = text_config(model)
    if config is None:
        return "the model has no config to read its attention layout from"
    w = sliding_window(config)
    if w is None:
        return None
    if w:
        return f"{config.model_type}: layers with a sliding window of {w}"
    return f"{config.model_type}: layers that are not full attention ({sorted(set(getattr(config, 'layer_types', ())))})"


def _attention_refusal(config) -> str | None:
    impl = getattr(config, "_attn_implementation", None)
    if impl not in SDPA_IMPLEMENTATIONS:
        return f"{config.model_type}: attention {impl!r}, not sdpa"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return f"{config.model_type}: attention soft-capping ({config.attn_logit_softcapping})"
    if config.model_type == "gpt_oss":
        return "gpt_oss: attention sinks"
    return None


def gqa_decode_refusal(model: torch.nn.Module) -> str | None:
    """None when :mod:`~torchrl_grpo.backends.decode_attention` may replace transformers' SDPA function at one-token
    decode steps of ``model`` (SDPA, no soft-capping, no sinks), else the reason."""
    config = text_config(model)
    return "the model has no config" if config is None else _attention_refusal(config)


def fixed_shape_decode_refusal(model: torch.nn.Module, columns: int | None = None) -> str | None:
    """None when the fixed-shape (and CUDA-graph) decode of :mod:`~torchrl_grpo.backends.graph_decode` is exact for
    ``model``, else the reason.

    Args:
        columns: cache columns the decode fills (padded prompt + new tokens); a sliding window at least this wide
            never bites. None: refuse any sliding window.
    """
    config = text_config(model)
    if config is None:
        return "the model has no config"
    if config.model_type not in FIXED_SHAPE_VERIFIED:
        return f"model type {config.model_type!r} not verified for the fixed-shape decode ({sorted(FIXED_SHAPE_VERIFIED)})"
    reason = _attention_refusal(config)
    if reason is not None:
        return reason
    w = sliding_window(config)
    if w is not None and (columns is None or columns > w):
        return f"{config.model_type}: a sliding window of {w} columns < the decode's {columns or 'unknown'}"
    return None


def full_length_cache_refusal(model: torch.nn.Module) -> str | None:
    """None when a cache that keeps every column (the preallocated KV cache; the shared-prefix update's capture and
    read-only layers) is exact for ``model``'s attention layout: full or sliding-window attention on every layer
    (transformers builds the window into the mask, on cache columns, as for its own full-length ``DynamicLayer``),
    else the reason (chunked, linear or other attention kinds: not verified)."""
    config = text_config(model)
    if config is None:
        return "the model has no config"
    if sliding_window(config) == _ALWAYS:
        return full_attention_refusal(model)
    return None


def shared_prefix_refusal(model: torch.nn.Module) -> str | None:
    """None when the shared-prefix update (:mod:`~torchrl_grpo.objectives.shared_prefix`) is exact for ``model``'s
    attention layout (:func:`full_length_cache_refusal`; its prefix is real tokens from column 0, so no padding sits
    between prefix and remainder), else the reason."""
    return full_length_cache_refusal(model)


def note_fallback(model: torch.nn.Module, path: str, reason: str) -> None:
    """Log once per (model, path, reason) that ``path`` is not taken for ``model`` and why (never silently)."""
    try:
        seen = _warned.setdefault(model, set())
    except TypeError:  # not weak-referenceable: log every time rather than never
        seen = set()
    if (path, reason) not in seen:
        seen.add((path, reason))
        log.warning("%s not exact for this model (%s): the plain path runs", path, reason)
