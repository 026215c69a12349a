"""benchmarks/experiments/gsm8k_vs_trl.py (issue 14 s.1): the summary over fake results and the commands (no model
runs). Its statistics, prompt order and runner live in the shared harness: tests/test_experiments_harness.py."""
import json
from pathlib import Path

import pytest

from tests.bench_experiments import load

gt = load("gsm8k_vs_trl")

BUDGET = {"model": "m", "steps": 10, "prompts": 2, "samples": 8, "max_new_tokens": 256, "temperature": 1.0, "lr": 2e-5,
          "lora_r": 32, "lora_alpha": 64, "micro_batch": 4, "n_eval": 250, "max_context": 1024}


def _write(root: Path, arm: str, seed, acc: float, budget=BUDGET):
    d = root / ("base" if arm == "base" else f"{arm}/seed{seed}")
    d.mkdir(parents=True)
    res = {"arm": arm, "seed": seed, "budget": dict(budget), "eval": {"accuracy": acc, "n": 250}, "wall_s": 600.0,
           "train": [{"step": s, "reward": 0.1 * s} for s in range(1, 11)], "device": "cpu x2", "commit": "abc"}
    (d / "result.json").write_text(json.dumps(res))


def test_summary_table_verdict_and_plot(tmp_path):
    _write(tmp_path, "base", None, 0.2)
    for s, (a, b) in enumerate([(0.30, 0.21), (0.32, 0.20), (0.31, 0.22)], start=1):
        _write(tmp_path, "ours", s, a)
        _write(tmp_path, "trl", s, b)
    s = gt.summarise(tmp_path)
    assert s["arms"]["ours"]["seeds"] == [1, 2, 3] and s["arms"]["ours"]["change_mean"] == pytest.approx(0.11)
    assert s["ours_minus_trl"]["after_diff"] == pytest.approx(0.10) and s["ours_minus_trl"]["outside_noise"]
    md = gt.to_markdown(s, tmp_path)
    assert "outside noise" in md and "0.200 (50/250)" in md and md.count("| ours |") == 4
    png = gt.plot(tmp_path, tmp_path / "curve.png")
    assert png.stat().st_size > 1000


def test_one_seed_each_has_no_interval_and_is_not_called_a_difference(tmp_path):
    _write(tmp_path, "base", None, 0.2)
    _write(tmp_path, "ours", 1, 0.3)
    _write(tmp_path, "trl", 1, 0.2)
    s = gt.summarise(tmp_path)
    assert not s["ours_minus_trl"]["outside_noise"]
    assert "one seed: no interval" in gt.to_markdown(s, tmp_path) and "within noise" in gt.to_markdown(s, tmp_path)


def test_different_budgets_are_refused(tmp_path):
    _write(tmp_path, "base", None, 0.2)
    _write(tmp_path, "ours", 1, 0.3)
    _write(tmp_path, "trl", 1, 0.3, budget={**BUDGET, "steps": 20})
    with pytest.raises(ValueError, match="steps"):
        gt.summarise(tmp_path)


def _args(**kw):
    ap = gt.argparse.ArgumentParser()
    gt._add_budget(ap)
    return ap.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in kw.items()])


def test_every_grpo_call_evaluates_with_the_budgets_max_new_tokens():
    """The greedy eval generates up to gconfig.max_new_tokens: left at the config's default (128) it cut Qwen's
    reasoning and scored the base model 0.008 instead of ~0.19 (found in the first real run of this script)."""
    a = _args(max_new_tokens=256, backend="transformers")
    assert "gconfig.max_new_tokens=256" in gt._grpo_common(a)
    assert "rollout.vllm.max_model_len=1024" in gt._grpo_common(_args(backend="vllm"))


def test_resume_refuses_a_training_done_with_another_budget(tmp_path):
    a = _args(steps=10)
    done = {"budget": {**gt._budget(a), "steps": 20}, "train": [], "train_s": 1.0}
    with pytest.raises(ValueError, match="steps"):
        gt._trl_eval(a, tmp_path, done)
