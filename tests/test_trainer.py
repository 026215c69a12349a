"""End-to-end trainer tests on a tiny random model (CPU, no network)."""
from __future__ import annotations

import json
import math

import pytest
from omegaconf import OmegaConf

import tests.toy_envs  # noqa: F401  (registers ToyVowels-v0)
from torchrl_grpo.config import GRPOConfig
from torchrl_grpo.assembly import build_trainer


def make_cfg(**over):
    base = {
        "actor": {"path": "tiny-random"},
        "econfig": {"env_id": "ToyVowels-v0"},
        "gconfig": {"n_samples": 8, "max_new_tokens": 16},
        "train": {"steps": 10, "batch_size": 2, "micro_batch_size": 16},
        "optimizer": {"lr": 5e-2},
        "eval": {"at_start": False, "at_end": False},
        "checkpoint": {"every": 0, "save_final": False},
        "stats_logger": {"wandb": {"mode": "disabled"}, "progress_bar": False, "console": False},
    }
    cfg = OmegaConf.merge(OmegaConf.structured(GRPOConfig), OmegaConf.create(base), OmegaConf.create(over))
    return cfg


def test_reward_rises_on_toy_task(tmp_path):
    trainer = build_trainer(make_cfg(), tmp_path)
    rewards = [trainer.train_step()["reward/mean"] for _ in range(10)]
    trainer.close()
    first, last = sum(rewards[:2]) / 2, sum(rewards[-2:]) / 2
    assert last > first + 0.1, rewards
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] if (tmp_path / "metrics.jsonl").exists() else []
    assert lines == []  # train_step alone does not log; fit() does (checked below)


def test_first_update_is_on_policy_metrics(tmp_path):
    trainer = build_trainer(make_cfg(), tmp_path)
    m = trainer.train_step()
    trainer.close()
    # colocated fp32 backend: behaviour policy == current policy before the single update
    assert m["ess"] == pytest.approx(1.0, abs=1e-4)
    assert m["clip_fraction"] == 0.0
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["num_tokens"] == 2 * 8 * 16 or m["num_tokens"] <= 2 * 8 * 16
    assert m["train/optimizer_steps"] == 1.0
    assert math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0


def test_fit_writes_metrics_and_checkpoints(tmp_path):
    cfg = make_cfg(train={"steps": 3}, checkpoint={"every": 2, "save_final": True, "keep_last": 5})
    trainer = build_trainer(cfg, tmp_path)
    summary = trainer.fit()
    trainer.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # the run dir keeps its resolved config, as an SFT run's does (a run with output_dir= had none: issue 48's
    # GRPO-only runs could not be told apart by seed from their dirs)
    assert OmegaConf.load(tmp_path / "config.yaml").train.steps == 3
    assert all("reward/mean" in r and "ess" in r and "clip_fraction" in r for r in rows)
    ck = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ck == ["step_000002", "step_000003"]
    for name in ck:
        d = tmp_path / "checkpoints" / name
        for f in ("optimizer.pt", "scheduler.pt", "trainer_state.pt", "config.yaml"):
            assert (d / f).is_file()
        assert list((d / "model").glob("*.safetensors"))
    assert summary["checkpoint"].endswith("step_000003")
    # two example episodes per step (first of each group), decoded, with their rewards
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1, 1, 2, 2, 3, 3]
    assert all(isinstance(s["text"], str) and s["text"] and "reward" in s for s in samples)
    assert all(s["response_tokens"] > 0 for s in samples)


def test_evaluate_writes_every_evaluated_episode_to_eval_episodes_jsonl(tmp_path):
    """Each evaluation appends its episodes (greedy, then k sampled per task) to eval_episodes.jsonl with the step."""
    trainer = build_trainer(make_cfg(eval={"n_problems": 2, "pass_k": 2}), tmp_path)
    ev = trainer.evaluate()
    trainer.train_step()
    trainer.evaluate()
    trainer.close()
    rows = [json.loads(x) for x in (tmp_path / "eval_episodes.jsonl").read_text().splitlines()]
    assert [(r["step"], r["mode"]) for r in rows] == [(0, "greedy")] * 2 + [(0, "sampled")] * 4 + \
        [(1, "greedy")] * 2 + [(1, "sampled")] * 4
    greedy0 = [r["reward"] for r in rows[:2]]
    assert sum(r >= 1.0 for r in greedy0) / 2 == pytest.approx(ev["eval/accuracy"])
    assert all(isinstance(r["messages"], list) and r["messages"] for r in rows if r["mode"] == "greedy")


@pytest.mark.parametrize("peft", [False, True])
def test_resume_matches_uninterrupted(tmp_path, peft):
    over = {"train": {"steps": 3}, "checkpoint": {"every": 2, "save_final": False},
            "actor": {"peft": {"enable": peft, "r": 4, "lora_alpha": 8, "lora_dropout": 0.0}}}
    a = build_trainer(make_cfg(**over), tmp_path / "a")
    ref = [a.train_step() for _ in range(2)]
    a.save()
    ref.append(a.train_step())
    a.close()
    resumed = make_cfg(**over)
    resumed.train.resume_from = str(tmp_path / "a" / "checkpoints")
    b = build_trainer(resumed, tmp_path / "b")
    assert b.step == 2
    m = b.train_step()
    b.close()
    for key in ("reward/mean", "loss/total", "grad_norm", "ess", "episode/response_tokens"):
        assert m[key] == pytest.approx(ref[2][key], rel=1e-5, abs=1e-7), key


def test_resume_into_the_same_run_dir_continues_each_log_without_duplicate_rows(tmp_path):
    """Issue 36.7: a run resumed from its step-2 checkpoint into its own run dir appended steps 3, 4 after the first
    run's 3, 4 (metrics.jsonl, samples.jsonl, eval_episodes.jsonl; the curve plotted x = 1, 2, 3, 4, 3, 4). Each log
    is cut to the checkpoint's step on resume."""
    import json

    over = {"train": {"steps": 4, "batch_size": 1}, "gconfig": {"n_samples": 2, "max_new_tokens": 4},
            "checkpoint": {"every": 2, "save_final": False}, "eval": {"every": 2, "n_problems": 1},
            "stats_logger": {"samples_per_step": 1}}
    run = tmp_path / "run"
    a = build_trainer(make_cfg(**over), run)
    try:
        a.fit()
    finally:
        a.close()

    def steps(name):
        return [json.loads(x)["step"] for x in (run / name).read_text().splitlines()]

    first = {name: steps(name) for name in ("metrics.jsonl", "samples.jsonl", "eval_episodes.jsonl")}
    assert first["metrics.jsonl"] == [1, 2, 3, 4] and first["eval_episodes.jsonl"] == [2, 4]
    resumed = make_cfg(**over)
    resumed.train.resume_from = str(run / "checkpoints" / "step_000002")
    b = build_trainer(resumed, run)
    try:
        assert b.step == 2
        b.fit()
    finally:
        b.close()
    for name, before in first.items():
        assert steps(name) == before, name  # the same steps once each, in order
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


def test_zero_variance_filter_skips_with_reason(tmp_path, gsm8k_dir):
    # GSM8K with format reward 0: a random tiny model is never right -> every group has zero variance
    cfg = make_cfg(econfig={"env_id": "GSM8K-v1", "format_reward": 0.0},
                   loss={"filter_zero_variance_groups": True}, train_dataset={"path": str(gsm8k_dir)},
                   gconfig={"n_samples": 2, "max_new_tokens": 8})
    trainer = build_trainer(cfg, tmp_path)
    m = trainer.train_step()
    trainer.close()
    assert m["groups/zero_variance_fraction"] == 1.0
    assert m["train/skipped"] == 1.0
    assert "zero-variance" in m["train/skip_reason"]


def test_bad_config_values_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="rollout.backend"):
        build_trainer(make_cfg(rollout={"backend": "tgi"}), tmp_path)
    with pytest.raises(ValueError, match="minibatch_size"):
        build_trainer(make_cfg(train={"minibatch_size": 5}), tmp_path)


def test_non_finite_loss_skips_the_update_with_a_reason(tmp_path, monkeypatch, caplog):
    import torch

    trainer = build_trainer(make_cfg(), tmp_path)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    real = trainer.loss_fn.forward

    def nan_loss(td, **kw):
        out = real(td, **kw)
        out["loss_objective"] = out["loss_objective"] * float("nan")
        return out

    monkeypatch.setattr(trainer.loss_fn, "forward", nan_loss)
    with caplog.at_level("WARNING"):
        m = trainer.train_step()
    trainer.close()
    assert m["train/skipped_minibatches"] == 1.0 and m["train/optimizer_steps"] == 0.0
    assert "non-finite loss" in caplog.text
    for n, p in trainer.model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_run_eta_counts_remaining_steps_and_one_final_evaluation():
    from torchrl_grpo.training.loop import run_eta_s

    assert run_eta_s(10.0, 3, eval_s=25.0, eval_at_end=True) == 55.0
    assert run_eta_s(10.0, 3, eval_s=25.0, eval_at_end=False) == 30.0
    assert run_eta_s(10.0, 0, eval_s=None, eval_at_end=True) == 0.0  # first eval not run: not counted


def test_fit_logs_the_run_eta_after_the_first_step(tmp_path, caplog):
    cfg = make_cfg(train={"steps": 2}, eval={"at_start": True, "at_end": True, "n_problems": 2})
    trainer = build_trainer(cfg, tmp_path)
    with caplog.at_level("INFO", logger="torchrl_grpo.training.grpo_trainer"):
        trainer.fit()
    trainer.close()
    eta = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ETA:")]
    assert len(eta) == 1 and "1 steps to go" in eta[0] and "final evaluation" in eta[0], eta
