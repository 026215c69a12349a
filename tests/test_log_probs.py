"""token_log_probs: the response window and the group-shared prefix give the same log-probs, entropies and
gradients as one plain forward over the whole batch."""
from __future__ import annotations

import pytest
import torch

from torchrl_grpo.objectives.log_probs import _decoder_and_head, _window_outputs, token_log_probs


def _window_logits(model, tokens, am, pos, start, share):
    return _window_outputs(model, _decoder_and_head(model), tokens, am, pos, start, share)


def _models():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
    return {
        "llama": LlamaForCausalLM(LlamaConfig(**common)),
        "qwen2": Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True)),
        "gpt2": GPT2LMHeadModel(GPT2Config(vocab_size=97, n_positions=128, n_embd=32, n_layer=2, n_head=2)),
    }


def _grouped_batch(n_groups=3, group=4, seed=0):
    """Right-padded GRPO-style batch: each group shares a prompt (lengths differ across groups), responses differ."""
    g = torch.Generator().manual_seed(seed)
    rows, resp = [], []
    for gi in range(n_groups):
        prompt = torch.randint(3, 97, (5 + 2 * gi,), generator=g)
        for _ in range(group):
            r = torch.randint(3, 97, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g)
            rows.append(torch.cat([prompt, r]))
            resp.append(torch.cat([torch.zeros(len(prompt), dtype=torch.bool), torch.ones(len(r), dtype=torch.bool)]))
    T = max(len(r) for r in rows) + 2
    B = len(rows)
    tokens = torch.zeros(B, T, dtype=torch.long)
    am = torch.zeros(B, T, dtype=torch.long)
    rm = torch.zeros(B, T, dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, resp)):
        tokens[i, : len(r)] = r
        am[i, : len(r)] = 1
        rm[i, : len(r)] = m
    return tokens, am, rm


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_window_and_shared_prefix_match_plain_forward(arch):
    model = _models()[arch].train()  # train mode: the path the loss takes (no dropout in these configs' defaults)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    tokens, am, rm = _grouped_batch()
    ref_lp, ref_ent = token_log_probs(model, tokens, am, with_entropy=True, share_prefix=False)
    (ref_lp * rm).sum().backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    lp, ent = token_log_probs(model, tokens, am, with_entropy=True, response_mask=rm, temperature=1.0)
    (lp * rm).sum().backward()
    torch.testing.assert_close(lp[rm], ref_lp[rm], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent[rm], ref_ent[rm], rtol=1e-5, atol=1e-5)
    for p, gref in zip(model.parameters(), ref_grads):
        torch.testing.assert_close(p.grad, gref, rtol=1e-4, atol=1e-5)
    # only response tokens are scored; everything else is 0
    assert (lp[~rm] == 0).all() and (ent[~rm] == 0).all()


def test_shared_prefix_path_is_taken_and_runs_each_prompt_once():
    model = _models()["llama"].eval()
    tokens, am, rm = _grouped_batch(n_groups=2, group=4)
    # same prompt length for both groups' common part: the shared path must run
    _, shared = _window_logits(model, tokens, am, (am.cumsum(-1) - 1).clamp_min(0), int(rm.any(0).nonzero()[0]), True)
    assert shared
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    with torch.no_grad():
        token_log_probs(model, tokens, am, response_mask=rm)
    hook.remove()
    P = int(rm.any(0).nonzero()[0]) - 1
    assert seen[0] == (2, P)  # one prefix row per group, not 8
    assert seen[1] == (8, tokens.shape[1] - P)


def test_no_sharing_with_gradient_checkpointing_or_distinct_prompts():
    model = _models()["llama"].train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tokens, am, rm = _grouped_batch()
    pos = (am.cumsum(-1) - 1).clamp_min(0)
    start = int(rm.any(0).nonzero()[0])
    _, shared = _window_logits(model, tokens, am, pos, start, True)
    assert not shared
    model.gradient_checkpointing_disable()
    tokens, am, rm = _grouped_batch(n_groups=4, group=1)
    pos = (am.cumsum(-1) - 1).clamp_min(0)
    _, shared = _window_logits(model.eval(), tokens, am, pos, int(rm.any(0).nonzero()[0]), True)
    assert not shared


def test_response_mask_shape_checked():
    model = _models()["llama"]
    tokens, am, rm = _grouped_batch()
    with pytest.raises(ValueError, match="response_mask"):
        token_log_probs(model, tokens, am, response_mask=rm[:, :-1])


def test_lm_head_runs_only_on_response_tokens_in_chunks(monkeypatch):
    import torchrl_grpo.objectives.log_probs as lpm

    model = _models()["qwen2"].train()
    tokens, am, rm = _grouped_batch()
    rows = []
    h = model.lm_head.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    monkeypatch.setattr(lpm, "HEAD_CHUNK", 16)
    monkeypatch.setattr(lpm, "HEAD_KEEP_BYTES", 0)  # logits over the keep budget: recomputed per chunk
    lp, _ = token_log_probs(model, tokens, am, response_mask=rm)
    lp.sum().backward()  # checkpointed chunks: the head runs again in backward
    h.remove()
    n = int(rm.sum())
    fwd = [min(16, n - s) for s in range(0, n, 16)]
    assert rows[: len(fwd)] == fwd and sum(rows) == 2 * n
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_target_log_softmax_equals_autograd_log_softmax_gather(temperature):
    from torchrl_grpo.objectives.log_probs import _TargetLogSoftmax

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(23, 97, generator=g, dtype=torch.float64) * 3
    targets = torch.randint(0, 97, (23,), generator=g)
    upstream = torch.randn(23, generator=g, dtype=torch.float64)
    a = logits.clone().requires_grad_()
    ref = torch.log_softmax(a / temperature, -1).gather(-1, targets[:, None]).squeeze(-1)
    (ref * upstream).sum().backward()
    b = logits.clone().requires_grad_()
    got = _TargetLogSoftmax.apply(b, targets, temperature)
    (got * upstream).sum().backward()
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: _TargetLogSoftmax.apply(x, targets, temperature), (logits.clone().requires_grad_(),))


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "recomputed"])
def test_fused_head_kept_or_recomputed_matches_plain_forward(monkeypatch, keep):
    """Under the keep budget the head runs once and its logits serve the backward pass; over it, each chunk runs
    again in the backward pass. Both give the plain forward's log-probs and gradients (temperature 0.7)."""
    import torchrl_grpo.objectives.log_probs as lpm

    model = _models()["qwen2"].train()
    tokens, am, rm = _grouped_batch()
    ref, _ = token_log_probs(model, tokens, am, temperature=0.7, share_prefix=False, with_entropy=True)
    (ref * rm).sum().backward()  # with_entropy: the autograd log_softmax path, not the fused one
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    rows = []
    h = model.lm_head.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    monkeypatch.setattr(lpm, "HEAD_CHUNK", 16)
    monkeypatch.setattr(lpm, "HEAD_KEEP_BYTES", 1 << 30 if keep else 0)
    lp, _ = token_log_probs(model, tokens, am, temperature=0.7, response_mask=rm)
    lp.sum().backward()
    h.remove()
    n = int(rm.sum())
    assert sum(rows) == (n if keep else 2 * n)
    torch.testing.assert_close(lp[rm], ref[rm], rtol=1e-5, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_models_with_logit_transforms_use_their_own_forward():
    model = _models()["llama"]
    assert _decoder_and_head(model) is not None
    model.config.final_logit_softcapping = 30.0
    assert _decoder_and_head(model) is None
    tokens, am, rm = _grouped_batch()
    lp, _ = token_log_probs(model.eval(), tokens, am, response_mask=rm)
    assert lp[rm].lt(0).all() and (lp[~rm] == 0).all()


# ======================================================================================================================
# Truncated sampling (top-k / top-p): the recompute scores tokens under the distribution the sampler drew from
# ======================================================================================================================
#: (temperature, top_p, top_k): nucleus only, top-k only, both, and neither.
TRUNCATED_SAMPLING = [(0.8, 0.7, 0), (0.8, 1.0, 5), (1.3, 0.9, 20), (1.0, 1.0, 0)]


def _sampling_llama(vocab=97):
    """Tiny Llama with weights large enough (std 0.3) that next-token distributions range from flat to peaked."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        initializer_range=0.3)).eval()


def backend_rollout(model, sampling, prompts, pad_id=0):
    """Sample with the transformers backend; right-padded ``(tokens, attention_mask, response_mask, behaviour)``
    [B, T] with the backend's behaviour log-probs at the response positions (0 elsewhere)."""
    from torchrl_grpo.backends.transformers_backend import TransformersBackend

    gens = TransformersBackend(model, pad_token_id=pad_id).generate(prompts, sampling)
    rows = [p + g.token_ids for p, g in zip(prompts, gens)]
    B, T = len(rows), max(map(len, rows))
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    am = torch.zeros(B, T, dtype=torch.long)
    rm = torch.zeros(B, T, dtype=torch.bool)
    behav = torch.zeros(B, T)
    for i, (p, g) in enumerate(zip(prompts, gens)):
        L = len(p) + len(g.token_ids)
        tokens[i, :L] = torch.tensor(p + g.token_ids)
        am[i, :L] = 1
        rm[i, len(p):L] = True
        behav[i, len(p):L] = torch.tensor(g.logprobs)
    return tokens, am, rm, behav


@pytest.mark.parametrize("temperature,top_p,top_k", TRUNCATED_SAMPLING)
def test_recompute_equals_backend_behaviour_log_probs(temperature, top_p, top_k):
    """token_log_probs(..., temperature, top_p, top_k) of the sampled tokens == the transformers backend's behaviour
    log-probs (the same module, colocated), to 1e-4 nats, on the window/shared-prefix path and on chunked heads."""
    from torchrl_grpo.backends.base import SamplingConfig

    model = _sampling_llama()
    prompts = [[5, 6, 7, 8]] * 3 + [[30, 31, 32]] * 3 + [[40, 41, 42, 43, 44]] * 2
    sampling = SamplingConfig(max_new_tokens=12, temperature=temperature, top_p=top_p, top_k=top_k, seed=0)
    tokens, am, rm, behav = backend_rollout(model, sampling, prompts)
    with torch.no_grad():
        lp, _ = token_log_probs(model, tokens, am, temperature=temperature, top_p=top_p, top_k=top_k,
                                response_mask=rm)
        per_row, _ = token_log_probs(model, tokens, am, temperature=temperature, top_p=top_p, top_k=top_k,
                                     response_mask=rm, logits_chunk=1, share_prefix=False)
        untruncated, _ = token_log_probs(model, tokens, am, temperature=temperature, response_mask=rm)
    assert (lp - behav)[rm].abs().max() < 1e-4
    assert (per_row - behav)[rm].abs().max() < 1e-4
    gap = (behav - untruncated)[rm]  # log of the kept mass: >= 0, and > 0 wherever the truncation dropped a token
    assert gap.min() > -1e-4
    if top_p < 1 or top_k > 0:
        assert gap.mean() > 0.05  # the truncation bites on these samples: scoring without it is off
    else:
        assert gap.abs().max() < 1e-4
