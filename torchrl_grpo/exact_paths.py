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
                                  tokens), since one mask serves every layer; no length-dependent RoPE
preallocated KV cache             every layer full or sliding-window attention: it keeps every column, as the
(``kv_cache``)                    ``DynamicCache()`` the backend otherwise builds (full-length layers), and
                                  transformers builds the window into the mask (on cache columns)
backend prompt-prefix cache       every layer full attention and no ALiBi counted on key columns: prefix +
(backend ``_shared_prefix``)      left-padded suffix puts padding *between* real tokens, which shifts a sliding
                                  window (it counts cache columns) and MPT's ALiBi biases (Bloom's and Falcon's
                                  count the mask's real tokens: :data:`ALIBI_ON_MASK`)
GQA decode attention              attention ``sdpa`` without soft-capping or sinks (``decode_attention``
(``decode_attention``)            replaces transformers' SDPA function at one-token steps)
shared-prefix update              logits are ``lm_head(decoder(...))`` (checked in ``objectives/log_probs``),
(``objectives/shared_prefix``;    every layer full or sliding-window attention: its caches hold every column and
``token_log_probs``' in-pass      the prefix is real tokens from column 0, so transformers' window mask (on cache
sharing)                          columns) is the plain forward's (Mistral, gpt-oss: equal to 4e-6 in the matrix),
                                  and no length-dependent RoPE (the prefix alone runs at a shorter length)
behaviour log-probs equal the     no length-dependent RoPE (:func:`exact_log_probs_refusal`; else
recompute (backend                ``exact_log_probs`` is False, logged once: the trainer recomputes the PPO
``exact_log_probs``)              anchor)
================================  ==========================================================================

Length-dependent RoPE (:func:`length_dependent_rope`): transformers' ``dynamic_rope_update`` (5.19,
``modeling_rope_utils``) recomputes the rotary frequencies in each forward from that call's largest position id, for
``rope_type`` ``dynamic`` (and any type containing "dynamic"; NTK scaling from ``max_position_embeddings`` on, and the
module keeps the largest length it saw) and ``longrope`` (Phi-3/3.5-128k, Phi-4-mini: long factors from
``original_max_position_embeddings`` on). Across that length a decode step's new key is rotated under other
frequencies than its cached keys, while the recompute rotates every key under the whole row's (or the batch's longest
row's): no path is exact, not even the model's own (``model.generate`` and the eager loop alike), so the rule reports
it rather than pretending; below that length every path is exact. ``linear``, ``yarn``, ``llama3`` and
``proportional`` are computed once at start-up and are not length dependent.

Measured before this rule (tiny random models of the matrix's shape, CPU, ``decode=static``; max |behaviour -
recompute| log-prob, greedy / T=0.7 top-p 0.9 top-k 20): Llama with eager attention 1.95 / 47.2 nats, Mistral (SDPA)
with a sliding window of 16 0.261 / 0.562 and of 4 4.54 / 48.8, each with other greedy tokens than
``model.generate``; now they decode eagerly, within 2.4e-6. The backend's prompt-prefix cache on sliding-window models:
1.4 (Mistral, window 4) to 47 nats (Gemma 2, gpt-oss). The plain paths (the eager decode loop, the plain update) run
the model's own forward and are exact for every model in the matrix (<= 1e-4, ``tests/test_model_matrix.py``).
Issue 49 (same shapes, ``decode=static``, greedy / sampled, prompts of <= 11 tokens + 8 new across an original length
of 14): Llama ``dynamic`` 0.198 / 0.651 nats and Phi-3 ``longrope`` 3.8 / 48.5 in the static *and* the eager decode
(the static one now refused, ``exact_log_probs`` False); their shared prefix 0.52 / 3.3 from the plain forward (now
refused); MPT with the prompt-prefix cache 0.059 / 0.156, without it 1.9e-6 (now refused); YaRN and llama3 scaling
past their original length of 8: exact, every fast path kept (``tests/test_exact_paths_positions.py``).

Each ``*_refusal`` function returns None when the path is exact for the model, else a one-line reason.
"""
from __future__ import annotations

import logging
import weakref

import torch

__all__ = ["ALIBI_ON_MASK", "FIXED_SHAPE_VERIFIED", "GQA_DECODE_IMPLEMENTATION", "LONGROPE_TYPES",
           "SDPA_IMPLEMENTATIONS", "exact_log_probs_refusal", "fixed_shape_decode_refusal", "full_attention_refusal",
           "full_length_cache_refusal", "gqa_decode_refusal", "length_dependent_rope", "note_fallback",
           "prefix_cache_refusal", "shared_prefix_refusal", "sliding_window", "text_config", "uses_alibi"]

log = logging.getLogger(__name__)

#: model types whose fixed-shape decode we ran against ``model.generate`` and the recompute (tests/test_model_matrix.py)
FIXED_SHAPE_VERIFIED = frozenset({"llama", "qwen2", "qwen3", "mistral", "phi3"})
#: the name :mod:`torchrl_grpo.backends.decode_attention` registers its SDPA-based decode attention under
GQA_DECODE_IMPLEMENTATION = "torchrl_grpo_gqa_decode"
#: attention implementations that read a boolean mask as "attend": transformers' SDPA and our GQA decode over it
SDPA_IMPLEMENTATIONS = frozenset({"sdpa", GQA_DECODE_IMPLEMENTATION})
#: a window this small is "not full attention" whatever the length (attention chunking, linear attention, ...)
_ALWAYS = 0
#: rope types that switch to long factors past ``original_max_position_embeddings`` ("su": Phi-3's first name for it);
#: any type containing "dynamic" recomputes its frequencies too (``dynamic_rope_update`` tests ``"dynamic" in type``)
LONGROPE_TYPES = frozenset({"longrope", "su"})
#: model types whose ALiBi biases count the real tokens of the attention mask (transformers' ``build_alibi_tensor``:
#: its cumulative sum), so padding between real tokens shifts nothing (the prompt-prefix cache is exact: 1.2e-6 Bloom,
#: 4.8e-7 Falcon in tests/test_model_matrix.py). MPT's count key columns; an ALiBi not listed here is refused.
ALIBI_ON_MASK = frozenset({"bloom", "falcon"})

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


def _rope_dicts(config):
    """Every RoPE parameter dict of ``config``: ``rope_parameters`` (transformers >= 5) and ``rope_scaling`` (4.x, and
    remote-code configs), each flat or nested per layer type (``{"full_attention": {...}, ...}``)."""
    for attr in ("rope_parameters", "rope_scaling"):
        value = getattr(config, attr, None)
        if not isinstance(value, dict):
            continue
        if "rope_type" in value or "type" in value:
            yield value
        else:
            yield from (v for v in value.values() if isinstance(v, dict))


def length_dependent_rope(config) -> tuple[str, int] | None:
    """``(rope_type, length)`` when ``config``'s RoPE recomputes its frequencies from each forward's sequence length
    (transformers' ``dynamic_rope_update``: a type containing "dynamic", or one of :data:`LONGROPE_TYPES`) -- exact on
    no path past ``length`` positions (``dynamic``: ``max_position_embeddings``; longrope:
    ``original_max_position_embeddings``) -- else None (``default``, ``linear``, ``yarn``, ``llama3``,
    ``proportional``: computed once). Read from ``rope_type`` or the older ``type`` key of ``rope_parameters`` or
    ``rope_scaling``, flat or per layer type; anything else (None, not a dict) is no scaling. Also the
    ``use_dynamic_ntk`` flag of remote-code configs (Qwen-1: past ``seq_length``)."""
    if getattr(config, "use_dynamic_ntk", False) is True:
        return "dynamic", int(getattr(config, "seq_length", None) or getattr(config, "max_position_embeddings", 0) or 0)
    for params in _rope_dicts(config):
        kind = params.get("rope_type") or params.get("type")
        if not isinstance(kind, str):
            continue
        if "dynamic" in kind:
            return kind, int(getattr(config, "max_position_embeddings", 0) or 0)
        if kind in LONGROPE_TYPES:
            length = params.get("original_max_position_embeddings") \
                or getattr(config, "original_max_position_embeddings", None) \
                or getattr(config, "max_position_embeddings", 0)
            return kind, int(length or 0)
    return None


def _rope_refusal(config) -> str | None:
    rope = length_dependent_rope(config)
    if rope is None:
        return None
    kind, length = rope
    return (f"{getattr(config, 'model_type', '?')}: RoPE {kind!r} recomputes its frequencies from each forward's "
            f"longest position; past {length} positions no path's log-probs equal the recompute")


def uses_alibi(config) -> bool:
    """Whether ``config``'s attention adds ALiBi biases: Bloom (always), MPT (``attn_config.alibi``, a dict or an
    ``MptAttentionConfig``), Falcon and others (``alibi``), ``position_embedding_type == "alibi"``."""
    if getattr(config, "model_type", None) == "bloom":
        return True
    attn = getattr(config, "attn_config", None)
    if (attn.get("alibi") if isinstance(attn, dict) else getattr(attn, "alibi", False)) is True:
        return True
    return getattr(config, "alibi", False) is True or getattr(config, "position_embedding_type", None) == "alibi"


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


def prefix_cache_refusal(model: torch.nn.Module) -> str | None:
    """None when the backend's prompt-prefix KV cache (prefix once, then left-padded suffixes: padding *between* real
    tokens) is exact for ``model``: every layer full attention (:func:`full_attention_refusal`) and no ALiBi counted on
    key columns (:func:`uses_alibi`, unless the model type is in :data:`ALIBI_ON_MASK`); else the reason."""
    reason = full_attention_refusal(model)
    if reason is not None:
        return reason
    config = text_config(model)
    if uses_alibi(config) and getattr(config, "model_type", None) not in ALIBI_ON_MASK:
        return (f"{getattr(config, 'model_type', '?')}: ALiBi biases counted on key columns (padding between prefix "
                "and suffix shifts them)")
    return None


def exact_log_probs_refusal(model: torch.nn.Module) -> str | None:
    """None when a decode of ``model`` can return the trainer's own log-probs (the backend's ``exact_log_probs``),
    else the reason: RoPE whose frequencies follow the sequence length (:func:`length_dependent_rope`), where the
    model's own step-by-step decode and its forward over the whole row differ. A model without a config: None
    (nothing says otherwise; the fast paths refuse it on their own)."""
    config = text_config(model)
    return None if config is None else _rope_refusal(config)


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
            never bites. None: refuse any sliding window. Length-dependent RoPE is refused at any length (its
            per-step frequency update is a host-side branch on the step's positions).
    """
    config = text_config(model)
    if config is None:
        return "the model has no config"
    if config.model_type not in FIXED_SHAPE_VERIFIED:
        return f"model type {config.model_type!r} not verified for the fixed-shape decode ({sorted(FIXED_SHAPE_VERIFIED)})"
    reason = _rope_refusal(config) or _attention_refusal(config)
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
    """None when the shared-prefix update (:mod:`~torchrl_grpo.objectives.shared_prefix`) and the in-pass prefix
    sharing of :func:`~torchrl_grpo.objectives.log_probs.token_log_probs` are exact for ``model``: its attention
    layout (:func:`full_length_cache_refusal`; the prefix is real tokens from column 0, so no padding sits between
    prefix and remainder) and no length-dependent RoPE (the prefix alone runs at its own, shorter length:
    :func:`length_dependent_rope`); else the reason."""
    config = text_config(model)
    return (None if config is None else _rope_refusal(config)) or full_length_cache_refusal(model)


def note_fallback(model: torch.nn.Module, path: str, reason: str, outcome: str = "the plain path runs") -> None:
    """Log once per (model, path, reason) that ``path`` is not exact for ``model``, why, and what happens instead
    (``outcome``; never silently)."""
    try:
        seen = _warned.setdefault(model, set())
    except TypeError:  # not weak-referenceable: log every time rather than never
        seen = set()
    if (path, reason) not in seen:
        seen.add((path, reason))
        log.warning("%s not exact for this model (%s): %s", path, reason, outcome)
