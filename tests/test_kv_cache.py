"""Preallocated KV cache (torchrl_grpo/backends/kv_cache.py): same keys/values as DynamicCache, same generations."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from torchrl_grpo.backends.base import SamplingConfig
from torchrl_grpo.backends.kv_cache import PreallocatedCache, supports_preallocation
from torchrl_grpo.backends.transformers_backend import TransformersBackend


@pytest.fixture(scope="module")
def model(tiny_llama):
    return tiny_llama(4096)


SYS = torch.randint(5, 300, (300,), generator=torch.Generator().manual_seed(1)).tolist()
# a 40-token prefix shared by all (prefix cache), groups of identical prompts (fan-out), prompts of different lengths
PROMPTS = [SYS + [5, 6, 7]] * 3 + [SYS + [10, 11, 12, 13, 14]] * 2 + [SYS[:40] + [12, 13]]
STOP = list(range(0, 300, 40))  # stops: rows finish at different steps (row dropping)


def test_layer_update_returns_the_concatenation_and_reorders_like_dynamic():
    g = torch.Generator().manual_seed(0)
    dyn, pre = DynamicCache(), PreallocatedCache(capacity=3)  # capacity 3 < 7 tokens: exercises growth
    for q in (2, 1, 1, 3):
        k, v = torch.randn(4, 2, q, 8, generator=g), torch.randn(4, 2, q, 8, generator=g)
        kd, vd = dyn.update(k, v, 0)
        kp, vp = pre.update(k, v, 0)
        assert torch.equal(kd, kp) and torch.equal(vd, vp)
    assert pre.get_seq_length() == dyn.get_seq_length() == 7
    for idx in ([2, 0, 3], [0, 1], [1, 1, 1, 0, 0]):  # drop rows, keep a prefix of rows (no copy), fan out
        dyn.reorder_cache(torch.tensor(idx))
        pre.reorder_cache(torch.tensor(idx))
        assert torch.equal(dyn.layers[0].keys, pre.layers[0].keys)
        assert torch.equal(dyn.layers[0].values, pre.layers[0].values)
    k, v = torch.randn(5, 2, 1, 8, generator=g), torch.randn(5, 2, 1, 8, generator=g)
    assert torch.equal(dyn.update(k, v, 0)[0], pre.update(k, v, 0)[0])


def test_prefix_is_copied_not_shared():
    prefix = DynamicCache()
    prefix.update(torch.ones(1, 2, 4, 8), torch.ones(1, 2, 4, 8), 0)
    pre = PreallocatedCache(capacity=8, prefix=prefix)
    pre.update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), 0)
    pre.layers[0].keys.mul_(0)  # writing to the new cache leaves the kept prefix cache as it was
    assert prefix.get_seq_length() == 4 and torch.equal(prefix.layers[0].keys, torch.ones(1, 2, 4, 8))
    assert pre.get_seq_length() == 5


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("prefix_min", [0, 16])
def test_generations_equal_the_dynamic_cache_path(model, temperature, prefix_min):
    sc = SamplingConfig(max_new_tokens=24, temperature=temperature, seed=7, stop_token_ids=STOP)
    ref_be = TransformersBackend(model, pad_token_id=0, prefix_cache_min_tokens=prefix_min, preallocate_kv=False)
    got_be = TransformersBackend(model, pad_token_id=0, prefix_cache_min_tokens=prefix_min, preallocate_kv=True)
    assert got_be.preallocate_kv and not ref_be.preallocate_kv
    for _ in range(2):  # the second call reuses the kept prefix cache (prefix_min=16)
        ref, got = ref_be.generate(PROMPTS, sc), got_be.generate(PROMPTS, sc)
        if temperature:
            assert len({len(g.token_ids) for g in ref}) > 2 and "stop" in {g.finish_reason for g in ref}
        for a, b in zip(ref, got):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), rtol=0, atol=1e-5)
    assert got_be.stats == ref_be.stats
    if prefix_min:
        assert got_be.stats["prefix_hits"] == 1 and got_be.stats["prefix_builds"] == 1
        pre, kept = got_be._prefix
        assert kept.get_seq_length() == len(pre)  # the kept prefix cache was not written to


def test_sliding_window_models_preallocate_other_layer_kinds_do_not():
    """The rule (torchrl_grpo/exact_paths.py full_length_cache_refusal): full and sliding-window layers
    take the preallocated cache (the window is in transformers' mask, on cache columns; the model matrix checks the
    tokens and log-probs of Mistral, Gemma 2/3, gpt-oss), a layer kind it does not know (chunked attention) keeps the
    DynamicCache. Mistral's ``sliding_window`` (no ``use_sliding_window``) counts as a window."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    from torchrl_grpo.exact_paths import full_attention_refusal

    shape = dict(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1)
    sliding = Qwen2ForCausalLM(Qwen2Config(**shape, use_sliding_window=True, sliding_window=8, max_window_layers=0))
    mistral = MistralForCausalLM(MistralConfig(**shape))  # default window 4096
    assert supports_preallocation(Qwen2ForCausalLM(Qwen2Config(**shape)))
    assert supports_preallocation(sliding) and supports_preallocation(mistral)
    # the backend's prompt-prefix cache needs full attention (padding between prefix and suffix shifts a window)
    assert full_attention_refusal(sliding) and full_attention_refusal(mistral)
    assert full_attention_refusal(MistralForCausalLM(MistralConfig(**shape, sliding_window=None))) is None
    chunked = LlamaForCausalLM(LlamaConfig(**shape))
    chunked.config.layer_types = ["chunked_attention", "full_attention"]
    assert not supports_preallocation(chunked)
    assert not TransformersBackend(chunked, pad_token_id=0).preallocate_kv
