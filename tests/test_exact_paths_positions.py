"""The exact-path rule and position schemes (issue 49, hole 4): RoPE whose frequencies follow the sequence length
(``dynamic``; ``longrope`` of Phi-3/3.5-128k and Phi-4-mini) and ALiBi.

transformers 5.19's ``dynamic_rope_update`` recomputes the frequencies in each forward from that call's largest
position id, for ``rope_type`` containing ``dynamic`` (from ``max_position_embeddings`` on) and ``longrope`` (long
factors from ``original_max_position_embeddings`` on); ``linear``, ``yarn``, ``llama3`` and ``proportional`` are
computed once at start-up. Across that length a decode step's new key is rotated under other frequencies than the
cached keys, and the trainer's recompute rotates every key under the whole row's (or the batch's longest row's):
no path is exact, the rule says so (``exact_log_probs`` False, logged) and refuses the fast paths that add their
own length (the fixed-shape decode, the shared-prefix update). Below that length every path is exact
(tests/test_model_matrix.py). MPT's ALiBi biases count key columns, so the prompt-prefix cache's padding between
prefix and suffix shifts them; Bloom's and Falcon's count real tokens of the attention mask (exact, in the matrix).

The refused paths are run here with the rule bypassed (monkeypatched) to show them inexact on tiny random models
(transformers' config classes, no hub; CPU).
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

from torchrl_grpo.backends.transformers_backend import TransformersBackend
from torchrl_grpo.exact_paths import exact_log_probs_refusal, fixed_shape_decode_refusal, length_dependent_rope, \
    prefix_cache_refusal, shared_prefix_refusal, uses_alibi
from torchrl_grpo.objectives.log_probs import token_log_probs
from tests.test_model_matrix import GREEDY, NEW, PROMPTS, SAMPLED, _SHAPE, behaviour_vs_recompute
from tests.test_shared_prefix_update import _multi_turn_rows

#: the original length of the rows below: the prompts (<= 11 tokens) fit, prompt + NEW (19) does not
SHORT = 14


def _model(cls: str, impl: str = "sdpa", **extra) -> torch.nn.Module:
    cfg = getattr(transformers, cls)(**{**_SHAPE, **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).float().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _dynamic(**kw):
    return _model("LlamaConfig", rope_parameters={"rope_type": "dynamic", "factor": 4.0}, max_position_embeddings=SHORT,
                  **kw)


def _longrope(**kw):
    return _model("Phi3Config", rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3],
                                              "long_factor": [2.0, 3.0, 5.0, 8.0]},
                  original_max_position_embeddings=SHORT, max_position_embeddings=4 * SHORT, **kw)


LENGTH_DEPENDENT = {"llama_dynamic": _dynamic, "phi3_longrope": _longrope}


def _cfg(**kw):
    """A config object as an older transformers (or a remote-code model) keeps it: attributes only."""
    return SimpleNamespace(model_type="llama", max_position_embeddings=4096, **kw)


@pytest.mark.parametrize("kw, want", [
    (dict(rope_scaling={"type": "dynamic", "factor": 2.0}), ("dynamic", 4096)),  # transformers 4.x: "type"
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), ("dynamic", 4096)),
    (dict(rope_parameters={"rope_type": "longrope", "original_max_position_embeddings": 8192}), ("longrope", 8192)),
    (dict(rope_scaling={"type": "su"}, original_max_position_embeddings=2048), ("su", 2048)),  # Phi-3's old name
    (dict(rope_parameters={"full_attention": {"rope_type": "default"},  # per layer type (Gemma 3's shape)
                           "sliding_attention": {"rope_type": "dynamic", "factor": 8.0}}), ("dynamic", 4096)),
    (dict(rope_parameters={"rope_type": "default"}, rope_scaling={"type": "dynamic"}), ("dynamic", 4096)),
    (dict(use_dynamic_ntk=True, seq_length=8192), ("dynamic", 8192)),  # Qwen-1's remote-code flag
    (dict(rope_scaling=None), None),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), None),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}), None),
    (dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}), None),
    (dict(rope_parameters={"rope_type": "proportional"}), None),
    (dict(rope_parameters="not a dict"), None),
])
def test_length_dependent_rope_is_read_from_either_attribute_and_any_shape(kw, want):
    assert length_dependent_rope(_cfg(**kw)) == want


#: Configs as transformers' own config classes build them (rope_scaling given the 4.x way is standardised into
#: rope_parameters): whether their RoPE follows the sequence length, for each architecture that ships a scaling.
_PHI_FACTORS = {"short_factor": [1.0] * 48, "long_factor": [2.0] * 48}
CONFIG_CLASSES = {
    "qwen2_dynamic": ("Qwen2Config", dict(rope_scaling={"type": "dynamic", "factor": 2.0}), True),
    "mistral_dynamic": ("MistralConfig", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), True),
    "gpt_neox_dynamic": ("GPTNeoXConfig", dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), True),
    "falcon_dynamic": ("FalconConfig", dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), True),
    "phi3_longrope": ("Phi3Config", dict(rope_scaling={"type": "longrope", **_PHI_FACTORS},
                                         original_max_position_embeddings=4096, max_position_embeddings=131072), True),
    "phi3_longrope_parameters": ("Phi3Config", dict(rope_parameters={"rope_type": "longrope", **_PHI_FACTORS,
                                                                     "original_max_position_embeddings": 4096},
                                                    max_position_embeddings=131072), True),
    "gemma3_per_layer_dynamic": ("Gemma3TextConfig", dict(rope_parameters={
        "full_attention": {"rope_type": "dynamic", "factor": 2.0}, "sliding_attention": {"rope_type": "default"}}),
        True),
    "llama_default": ("LlamaConfig", {}, False),
    "llama_linear": ("LlamaConfig", dict(rope_scaling={"type": "linear", "factor": 2.0}), False),
    "llama_yarn": ("LlamaConfig", dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}), False),
    "llama3": ("LlamaConfig", dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 1024}), False),
    "qwen3_yarn": ("Qwen3Config", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 32768}), False),
    "gemma3_per_layer_linear": ("Gemma3TextConfig", dict(rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0}, "sliding_attention": {"rope_type": "default"}}),
        False),
}


@pytest.mark.parametrize("name", list(CONFIG_CLASSES))
def test_the_rule_reads_each_architectures_own_config(name):
    """Length-dependent RoPE (``dynamic``, ``longrope``) is never called exact, whichever architecture carries it and
    however its config spells it; scalings computed once (``linear``, ``yarn``, ``llama3``) keep every path."""
    cls, kw, length_dependent = CONFIG_CLASSES[name]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {cls}")
    cfg = getattr(transformers, cls)(**kw)
    cfg._attn_implementation = "sdpa"
    model = SimpleNamespace(config=cfg)
    assert (length_dependent_rope(cfg) is not None) == length_dependent
    assert (exact_log_probs_refusal(model) is not None) == length_dependent
    assert (shared_prefix_refusal(model) is not None) == length_dependent
    if length_dependent:
        assert fixed_shape_decode_refusal(model, columns=8) is not None


def test_alibi_is_read_from_each_models_config():
    assert uses_alibi(transformers.MptConfig())  # attn_config.alibi, True by default
    assert not uses_alibi(transformers.MptConfig(attn_config={"alibi": False}))
    assert uses_alibi(transformers.BloomConfig())
    assert uses_alibi(transformers.FalconConfig(alibi=True))
    assert not uses_alibi(transformers.FalconConfig())
    assert uses_alibi(_cfg(position_embedding_type="alibi"))
    assert not uses_alibi(transformers.LlamaConfig())
    # the prompt-prefix cache: refused where the biases count key columns (MPT, or an ALiBi the rule does not know)
    for cfg, refused in [(transformers.MptConfig(), True), (transformers.BloomConfig(), False),
                         (transformers.FalconConfig(alibi=True), False), (_cfg(alibi=True), True),
                         (transformers.LlamaConfig(), False)]:
        assert (prefix_cache_refusal(SimpleNamespace(config=cfg)) is not None) == refused, cfg.model_type


@pytest.mark.parametrize("name", list(LENGTH_DEPENDENT))
def test_length_dependent_rope_no_path_is_exact_across_its_original_length_and_the_rule_says_so(
        name, caplog, monkeypatch):
    model = LENGTH_DEPENDENT[name]()
    assert fixed_shape_decode_refusal(model, columns=SHORT - 4) is not None  # whatever the length
    assert shared_prefix_refusal(model) is not None
    with caplog.at_level(logging.WARNING, logger="torchrl_grpo.exact_paths"):
        be = TransformersBackend(model, pad_token_id=0, decode="static", prefix_cache_min_tokens=0)
        assert be.exact_log_probs is False
        assert be.exact_log_probs is False
        gens = be.generate(PROMPTS, GREEDY)
    logged = [r.getMessage() for r in caplog.records]
    assert sum("behaviour log-probs" in m for m in logged) == 1, logged  # once per model
    assert any("rollout.decode=static" in m for m in logged), logged
    assert be.decode_path == "eager"
    # the eager decode (the plain path) is not exact either: the model's own code gives other log-probs at each step
    # than over the whole row (measured 0.198 greedy / 0.651 sampled nats dynamic, 3.8 / 48.5 longrope)
    assert behaviour_vs_recompute(model, PROMPTS, gens, GREEDY) > 0.05
    sampled = be.generate(PROMPTS, SAMPLED)
    assert behaviour_vs_recompute(model, PROMPTS, sampled, SAMPLED) > 0.05
    # nor would the refused fixed-shape decode be
    monkeypatch.setattr("torchrl_grpo.backends.transformers_backend.fixed_shape_decode_refusal", lambda *a: None)
    be = TransformersBackend(model, pad_token_id=0, decode="static", prefix_cache_min_tokens=0)
    forced = be.generate(PROMPTS, SAMPLED)
    assert be.decode_path == "static"
    assert behaviour_vs_recompute(model, PROMPTS, forced, SAMPLED) > 0.05


@pytest.mark.parametrize("name", list(LENGTH_DEPENDENT))
def test_the_refused_prefix_sharing_is_inexact_across_the_original_length(name, monkeypatch):
    """token_log_probs' in-pass prefix sharing (and the update's shared prefix, the same rule) runs the prefix at its
    own length and the remainders at theirs: refused, so sharing changes nothing; bypassing the rule shows why."""
    model = LENGTH_DEPENDENT[name]()
    tokens, am, rm = _multi_turn_rows(prefix_len=9, n=3, vocab=_SHAPE["vocab_size"])  # rows of 20-24 tokens
    assert int(am.sum(1).min()) > SHORT
    with torch.no_grad():
        plain, _ = token_log_probs(model, tokens, am, response_mask=rm, share_prefix=False)
        shared, _ = token_log_probs(model, tokens, am, response_mask=rm, share_prefix=True)
        torch.testing.assert_close(shared, plain, atol=1e-5, rtol=0)
        monkeypatch.setattr("torchrl_grpo.objectives.log_probs.shared_prefix_refusal", lambda m: None)
        bypassed, _ = token_log_probs(model, tokens, am, response_mask=rm, share_prefix=True)
    assert float((bypassed - plain)[rm].abs().max()) > 0.05  # measured 0.52 (dynamic), 3.3 (longrope)


@pytest.mark.parametrize("make", [
    lambda: _model("LlamaConfig", rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 8}, max_position_embeddings=32),
    lambda: _model("LlamaConfig", rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
    lambda: _model("LlamaConfig", rope_parameters={"rope_type": "linear", "factor": 4.0}, max_position_embeddings=8),
], ids=["yarn", "llama3", "linear"])
def test_rope_scaled_once_at_start_up_keeps_every_fast_path_past_its_original_length(make):
    model = make()
    assert exact_log_probs_refusal(model) is None and shared_prefix_refusal(model) is None
    be = TransformersBackend(model, pad_token_id=0, decode="static", prefix_cache_min_tokens=4)
    assert be.exact_log_probs
    for s in (GREEDY, SAMPLED):
        gens = be.generate(PROMPTS, s)
        assert be.decode_path == "static" and be.stats["prefix_builds"] > 0
        assert max(len(p) for p in PROMPTS) + NEW > 8
        assert behaviour_vs_recompute(model, PROMPTS, gens, s) < 1e-4


def test_mpt_prompt_prefix_cache_is_refused_and_was_inexact(monkeypatch, caplog):
    model = _model("MptConfig", "eager")
    with caplog.at_level(logging.WARNING, logger="torchrl_grpo.exact_paths"):
        be = TransformersBackend(model, pad_token_id=0, decode="eager", prefix_cache_min_tokens=4)
        gens = be.generate(PROMPTS, SAMPLED)
    assert be.stats["prefix_builds"] == 0
    assert any("prompt-prefix KV cache" in r.getMessage() and "ALiBi" in r.getMessage() for r in caplog.records)
    assert behaviour_vs_recompute(model, PROMPTS, gens, SAMPLED) < 1e-4  # measured 1.9e-6
    monkeypatch.setattr("torchrl_grpo.backends.transformers_backend.prefix_cache_refusal", lambda m: None)
    be = TransformersBackend(model, pad_token_id=0, decode="eager", prefix_cache_min_tokens=4)
    gens = be.generate(PROMPTS, SAMPLED)
    assert be.stats["prefix_builds"] == 1
    assert behaviour_vs_recompute(model, PROMPTS, gens, SAMPLED) > 0.01  # measured 0.156
