"""Shared-prefix update (torchrl_grpo.objectives.shared_prefix): one prefix forward/backward for all episodes of a minibatch
gives the plain per-episode forward's log-probs and parameter gradients, with and without gradient checkpointing,
with LoRA, across micro-batch splits; rows with no shared prefix take the plain path."""
from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from torchrl_grpo.objectives.log_probs import _decoder_and_head, token_log_probs
from torchrl_grpo.objectives.loss import GRPOLoss
from torchrl_grpo.objectives.shared_prefix import build_shared_prefix, shared_prefix_length
from torchrl_grpo.training.update import GRPOUpdate


def _multi_turn_rows(prefix_len=23, n=5, seed=0, vocab=200):
    """Right-padded multi-turn-shaped rows: a common prefix, then per row response / tool tokens / response
    (response_mask gaps over the tool tokens), different lengths, padding after."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(3, vocab, (prefix_len,), generator=g)
    rows, masks = [], []
    for _ in range(n):
        r1, tool, r2 = (int(torch.randint(2, 7, (1,), generator=g)) for _ in range(3))
        parts = [prefix] + [torch.randint(3, vocab, (k,), generator=g) for k in (r1, tool, r2)]
        rows.append(torch.cat(parts))
        masks.append(torch.cat([torch.zeros(prefix_len, dtype=torch.bool), torch.ones(r1, dtype=torch.bool),
                                torch.zeros(tool, dtype=torch.bool), torch.ones(r2, dtype=torch.bool)]))
    T = max(len(r) for r in rows) + 2
    tokens = torch.zeros(n, T, dtype=torch.long)
    am = torch.zeros(n, T, dtype=torch.long)
    rm = torch.zeros(n, T, dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, masks)):
        tokens[i, : len(r)], am[i, : len(r)], rm[i, : len(r)] = r, 1, m
    return tokens, am, rm


def _model(tiny_model_and_tokenizer, gc: bool, lora: bool):
    model = copy.deepcopy(tiny_model_and_tokenizer[0]).float()
    if gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(0)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                                                 init_lora_weights=False))  # non-zero B: LoRA gradients everywhere
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model.train()


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(got, ref):
    """Same parameters, each gradient within rtol 1e-4 of the reference plus float32 rounding at the tensor's scale
    (an element-wise rtol alone fails on near-zero entries: fp32 sums in another order differ by ~1e-7 x scale)."""
    assert set(got) == set(ref) and len(ref) > 0
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=1e-4, atol=1e-5 * float(ref[n].abs().max()) + 1e-8, msg=n)


def _weights(B, T):
    return torch.linspace(0.5, 1.5, B * T).reshape(B, T)


def _plain(model, tokens, am, rm):
    """Per-episode forward/backward of sum(w * logp) over each row alone (no sharing at all)."""
    model.zero_grad(set_to_none=True)
    w = _weights(*tokens.shape)
    lps = []
    for i in range(tokens.shape[0]):
        lp, _ = token_log_probs(model, tokens[i : i + 1], am[i : i + 1], response_mask=rm[i : i + 1], share_prefix=False)
        (lp * w[i : i + 1]).sum().backward()
        lps.append(lp.detach())
    return torch.cat(lps), _grads(model)


def _shared(model, tokens, am, rm, splits):
    model.zero_grad(set_to_none=True)
    P = shared_prefix_length(tokens, am, rm)
    prefix = build_shared_prefix(model, _decoder_and_head(model)[0], tokens[0, :P])
    assert prefix is not None and prefix.length == P
    w = _weights(*tokens.shape)
    lps = []
    for rows in splits:
        lp, _ = token_log_probs(model, tokens[rows], am[rows], response_mask=rm[rows], prefix=prefix)
        (lp * w[rows]).sum().backward()
        lps.append(lp.detach())
    prefix.backward()
    return torch.cat(lps), _grads(model)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("gc", [False, True], ids=["nogc", "gc"])
@pytest.mark.parametrize("splits", [[[0, 1, 2, 3, 4]], [[0, 1], [2], [3, 4]]], ids=["one_mb", "three_mbs"])
def test_shared_prefix_matches_per_episode_forward(tiny_model_and_tokenizer, gc, lora, splits):
    tokens, am, rm = _multi_turn_rows()
    assert shared_prefix_length(tokens, am, rm) == 22  # one before the first response column (23)
    model = _model(tiny_model_and_tokenizer, gc, lora)
    ref_lp, ref_g = _plain(model, tokens, am, rm)
    lp, g = _shared(model, tokens, am, rm, splits)
    assert (ref_lp != 0).sum() == rm.sum() - 0  # every response token scored
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    _assert_grads_close(g, ref_g)
    if lora:
        assert all("lora_" in n for n in g)
    # the prefix reached the gradient: parameters only the prefix pass sees (embeddings of prefix-only tokens)
    assert max(float(v.abs().max()) for v in g.values()) > 0


def test_no_grad_prefix_matches_plain(tiny_model_and_tokenizer):
    tokens, am, rm = _multi_turn_rows(seed=1)
    model = _model(tiny_model_and_tokenizer, gc=False, lora=False).eval()
    with torch.no_grad():
        ref, _ = token_log_probs(model, tokens, am, response_mask=rm, share_prefix=False)
        prefix = build_shared_prefix(model, _decoder_and_head(model)[0], tokens[0, : shared_prefix_length(tokens, am, rm)])
        assert prefix.captured == [] and not prefix.keys[0].requires_grad
        lp = torch.cat([token_log_probs(model, tokens[r], am[r], response_mask=rm[r], prefix=prefix)[0]
                        for r in ([0, 1, 2], [3, 4])])
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=0)


def test_shared_prefix_length_cases():
    tokens, am, rm = _multi_turn_rows()
    assert shared_prefix_length(tokens[:1], am[:1], rm[:1]) == 0  # one row: nothing to share
    t2 = tokens.clone()
    t2[3, 10] = (t2[3, 10] + 1) % 200 + 3
    assert shared_prefix_length(t2, am, rm) == 10  # rows differ at column 10
    t3 = tokens.clone()
    t3[2, 0] += 1
    assert shared_prefix_length(t3, am, rm) == 0  # no shared prefix
    am_left = am.clone()
    am_left[1, :3] = 0  # a padded column is not part of the prefix
    assert shared_prefix_length(tokens, am_left, rm) == 0


def test_prefix_that_does_not_match_rows_is_rejected(tiny_model_and_tokenizer):
    tokens, am, rm = _multi_turn_rows()
    model = _model(tiny_model_and_tokenizer, gc=False, lora=False)
    with torch.no_grad():
        prefix = build_shared_prefix(model, _decoder_and_head(model)[0], tokens[0, :22])
        bad = tokens.clone()
        bad[1, 5] = (bad[1, 5] + 1) % 200 + 3
        with pytest.raises(ValueError, match="does not apply"):
            token_log_probs(model, bad, am, response_mask=rm, prefix=prefix)


def _batch(tokens, am, rm, seed=0):
    g = torch.Generator().manual_seed(seed)
    B, T = tokens.shape
    behav = torch.where(rm, -torch.rand(B, T, generator=g) - 1.0, torch.zeros(B, T))
    return TensorDict(tokens=tokens, attention_mask=am.bool(), response_mask=rm, sample_log_probs=behav,
                      advantage=torch.randn(B, generator=g), response_tokens=rm.sum(-1), batch_size=[B])


def _update_grads(model, batch, shared_prefix, micro_batch_size, kl=False):
    loss = GRPOLoss(model, kl_coef=0.1 if kl else 0.0)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)  # lr 0: weights stay
    grads = {}
    upd = GRPOUpdate(model, loss, opt, reference=None, device=torch.device("cpu"),
                     autocast=lambda: torch.autocast("cpu", enabled=False),
                     ppo_epochs=1, minibatch_size=0, micro_batch_size=micro_batch_size, max_tokens_per_mb=0,
                     max_grad_norm=1e9, anchor="behaviour", exact_log_probs=True, seed=0, shared_prefix=shared_prefix)
    orig_step = opt.step

    def step(*a, **k):
        grads.update(_grads(model))
        return orig_step(*a, **k)

    opt.step = step
    out = upd(batch.clone(), step=1)
    return grads, out, upd


@pytest.mark.parametrize("gc", [False, True], ids=["nogc", "gc"])
def test_grpo_update_shared_prefix_gradients_equal_plain(tiny_model_and_tokenizer, gc):
    tokens, am, rm = _multi_turn_rows(n=6)
    batch = _batch(tokens, am, rm)
    model = _model(tiny_model_and_tokenizer, gc=gc, lora=True)
    ref, ref_out, _ = _update_grads(model, batch, "off", micro_batch_size=1)
    got, out, upd = _update_grads(model, batch, "auto", micro_batch_size=2)
    assert out["train/shared_prefix_tokens"] == 22 and ref_out["train/shared_prefix_tokens"] == 0
    _assert_grads_close(got, ref)
    assert out["loss/total"] == pytest.approx(ref_out["loss/total"], rel=1e-5)


def test_grpo_update_without_shared_prefix_uses_plain_path(tiny_model_and_tokenizer, monkeypatch):
    tokens, am, rm = _multi_turn_rows(n=4)
    tokens[2, 0] = (tokens[2, 0] + 1) % 200 + 3  # row 2 differs at column 0: nothing shared
    import torchrl_grpo.training.update as update_mod

    called = []
    monkeypatch.setattr(update_mod, "build_shared_prefix", lambda *a, **k: called.append(1))
    model = _model(tiny_model_and_tokenizer, gc=False, lora=False)
    _g, out, _ = _update_grads(model, _batch(tokens, am, rm), "auto", micro_batch_size=2)
    assert out["train/shared_prefix_tokens"] == 0 and called == []


def test_micro_batches_count_remainder_tokens_only():
    tokens, am, rm = _multi_turn_rows(n=4)
    batch = _batch(tokens, am, rm)
    lengths = am.sum(-1)
    budget = 4 * int((lengths - 22).max())  # all four remainders fit; whole rows do not
    assert 4 * int(lengths.max()) > budget
    upd = GRPOUpdate(torch.nn.Linear(1, 1), None, None, reference=None, device=torch.device("cpu"),
                     autocast=lambda: torch.autocast("cpu", enabled=False), ppo_epochs=1, minibatch_size=0,
                     micro_batch_size=8, max_tokens_per_mb=budget, max_grad_norm=1.0, anchor="behaviour",
                     exact_log_probs=True, seed=0)
    plain = [rows for rows, _ in upd.micro_batches(batch)]
    shared = [rows for rows, mb in upd.micro_batches(batch, prefix_len=22)]
    assert len(plain) > 1 and shared == [[0, 1, 2, 3]]


def test_auto_keeps_per_micro_batch_group_sharing_when_it_runs_fewer_tokens(tiny_model_and_tokenizer):
    """Two groups whose prompts share only 4 tokens, one micro-batch per group: without gradient checkpointing
    today's per-micro-batch sharing runs each prompt once, so the minibatch prefix would save nothing (plain path);
    with checkpointing (no per-micro-batch sharing) it saves (G - 1) x 4 tokens."""
    a, am, rm = _multi_turn_rows(n=4, seed=2)  # prompt: columns 0..22, first response column 23
    b = a.clone()
    b[:, 4:23] = (a[:1, 4:23] + 7) % 190 + 3  # group b: another prompt after the common 4 tokens
    tokens = torch.cat([a, b])
    batch = _batch(tokens, torch.cat([am, am]), torch.cat([rm, rm]))
    assert shared_prefix_length(batch["tokens"], batch["attention_mask"], batch["response_mask"]) == 4
    for gc, expected in ((False, None), (True, 4)):
        model = _model(tiny_model_and_tokenizer, gc=gc, lora=False)
        upd = GRPOUpdate(model, GRPOLoss(model), None, reference=None, device=torch.device("cpu"),
                         autocast=lambda: torch.autocast("cpu", enabled=False), ppo_epochs=1, minibatch_size=0,
                         micro_batch_size=4, max_tokens_per_mb=0, max_grad_norm=1.0, anchor="behaviour",
                         exact_log_probs=True, seed=0)
        saved = upd.prefix_tokens_saved(batch, 4, model)
        prefix = upd.shared_prefix_for(batch, model)
        assert (prefix.length if prefix is not None else None) == expected, (gc, saved)
        # gc: 8 rows x 4 prefix tokens -> 4 (saves 28); no gc: per micro-batch, 22 prompt columns once per group (2 x 22)
        # against 4 once + 8 rows x 18 (loses 104)
        assert saved == (28 if gc else -104)


def _prompt_only_batch():
    """Four episodes sharing a 23-token prompt prefix; episode 3's prompt reached ``rollout.max_context_tokens``:
    it was collected with 0 response tokens (its prompt runs 6 tokens past the others' common prefix)."""
    tokens, am, rm = _multi_turn_rows(n=4)
    g = torch.Generator().manual_seed(7)
    tokens[3] = 0
    am[3] = 0
    rm[3] = False
    tokens[3, :29] = torch.cat([tokens[0, :23], torch.randint(3, 200, (6,), generator=g)])
    am[3, :29] = 1
    return _batch(tokens, am, rm)


@pytest.mark.parametrize("what", ["kl_reference", "anchor_recompute"])
def test_prompt_only_episode_with_shared_prefix(tiny_model_and_tokenizer, what):
    """Issue 25 C1: with ``shared_prefix=auto`` a micro-batch holding only a prompt-only episode (0 response tokens)
    got the minibatch prefix in the no-grad recompute (KL reference, PPO anchor) and ``token_log_probs`` raised
    ``ValueError: prefix of 22 tokens does not apply``. It must give the ``shared_prefix=off`` update: same
    gradients, same metrics, and log-prob 0 for the episode that has no scored token."""
    from contextlib import nullcontext

    batch = _prompt_only_batch()
    assert batch["response_mask"][3].sum() == 0 and batch["response_mask"][:3].sum(-1).min() > 0
    base = _model(tiny_model_and_tokenizer, gc=False, lora=False)
    ref_model = copy.deepcopy(base).eval()
    with torch.no_grad():  # a reference that differs from the policy, so that the KL term is not 0
        for p in ref_model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    kl = what == "kl_reference"
    runs = {}
    for mode in ("off", "auto"):
        model = copy.deepcopy(base)
        loss = GRPOLoss(model, kl_coef=0.1 if kl else 0.0)
        opt = torch.optim.SGD(list(model.parameters()), lr=0.0)
        upd = GRPOUpdate(model, loss, opt, reference=(lambda: nullcontext(ref_model)) if kl else None,
                         device=torch.device("cpu"), autocast=lambda: torch.autocast("cpu", enabled=False),
                         ppo_epochs=1, minibatch_size=0, micro_batch_size=1, max_tokens_per_mb=0, max_grad_norm=1e9,
                         anchor="behaviour" if kl else "recompute", exact_log_probs=True, seed=0, shared_prefix=mode)
        b = batch.clone()
        out = upd(b, step=1)
        runs[mode] = (out, _grads(model), b)
    (off, g_off, b_off), (auto, g_auto, b_auto) = runs["off"], runs["auto"]
    assert auto["train/shared_prefix_tokens"] == 22 and off["train/shared_prefix_tokens"] == 0
    key = "ref_log_probs" if kl else "old_log_probs"
    assert bool((b_auto[key][3] == 0).all())  # nothing scored in the prompt-only episode
    torch.testing.assert_close(b_auto[key], b_off[key], atol=1e-5, rtol=0)
    _assert_grads_close(g_auto, g_off)
    for k in ("loss/total", "num_tokens", "kl_ref" if kl else "ratio_mean"):
        assert auto[k] == pytest.approx(off[k], rel=1e-5), k


@pytest.mark.slow
def test_grpo_run_with_a_prompt_at_the_context_limit(tmp_path, gsm8k_dir):
    """Issue 25 C1 end to end (~20 s): ``rollout.max_context_tokens=220`` collects the longer GSM8K prompt with 0
    response tokens; with KL on and the default ``train.shared_prefix=auto`` the run exited 1 (the reference
    recompute raised "prefix of P tokens does not apply"); ``train.shared_prefix=off`` exited 0."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, str(repo / "grpo.py"), "--config-name=grpo_gsm8k", "actor.path=tiny-random", "train.steps=1",
                        "train.batch_size=2", "gconfig.n_samples=2", "train.micro_batch_size=1", "loss.kl_coef=0.05",
                        "rollout.max_context_tokens=220", "eval.n_problems=0", "stats_logger.wandb.mode=disabled",
                        "stats_logger.progress_bar=false", f"train_dataset.path={gsm8k_dir}", f"hydra.run.dir={run}"],
                       cwd=tmp_path, env={**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"},
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "reward/mean" in x]
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["train/shared_prefix_tokens"] > 0  # the shared prefix ran, next to the prompt-only episode
    assert rows[0]["train/optimizer_steps"] == 1.0


def test_an_attention_layout_the_rule_does_not_know_takes_the_plain_path(tiny_model_and_tokenizer, caplog):
    """Full and sliding-window layers are exact (tests/test_model_matrix.py); any other layer kind (chunked, linear
    attention) is refused by torchrl_grpo/exact_paths.py: build_shared_prefix returns None, with a
    warning, and the caller runs the plain path."""
    model = _model(tiny_model_and_tokenizer, gc=False, lora=False)
    tokens, _, _ = _multi_turn_rows()
    assert build_shared_prefix(model, _decoder_and_head(model)[0], tokens[0, :22]) is not None
    model.config.layer_types = ["chunked_attention", "full_attention"]
    try:
        with caplog.at_level("WARNING"):
            assert build_shared_prefix(model, _decoder_and_head(model)[0], tokens[0, :22]) is None
    finally:
        del model.config.layer_types
    assert "shared-prefix update not exact" in caplog.text and "chunked_attention" in caplog.text
