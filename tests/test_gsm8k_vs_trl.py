"""benchmarks/gsm8k_vs_trl.py (issue 14 s.1): the statistics and the summary over fake results (no model runs)."""
import importlib.util
import json
import math
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "gsm8k_vs_trl.py"
_spec = importlib.util.spec_from_file_location("gsm8k_vs_trl", _PATH)
gt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gt)

BUDGET = {"model": "m", "steps": 10, "prompts": 2, "samples": 8, "max_new_tokens": 256, "temperature": 1.0, "lr": 2e-5,
          "lora_r": 32, "lora_alpha": 64, "micro_batch": 4, "n_eval": 250, "max_context": 1024}


def test_t_quantiles_tabulated_interpolated_and_refused():
    assert gt.t95(2) == 4.303 and gt.t95(30) == 2.042 and gt.t95(100) == 1.96
    assert gt.t95(2.5) == pytest.approx((4.303 + 3.182) / 2)
    assert gt.t95(22) == pytest.approx(2.086 + (2.060 - 2.086) * 2 / 5)
    with pytest.raises(ValueError, match="degree"):
        gt.t95(0.5)


def test_mean_and_welch_intervals_by_hand():
    m, h = gt.mean_ci([0.2, 0.3, 0.25])
    sd = math.sqrt(((0.2 - 0.25) ** 2 + (0.05) ** 2) / 2)
    assert m == pytest.approx(0.25) and h == pytest.approx(4.303 * sd / math.sqrt(3))
    assert math.isnan(gt.mean_ci([0.2])[1])
    # equal n and variances: Welch df = 2(n-1) = 4, se = sqrt(2 s^2 / n)
    d, h = gt.welch_ci([0.3, 0.4, 0.35], [0.2, 0.3, 0.25])
    assert d == pytest.approx(0.1) and h == pytest.approx(2.776 * math.sqrt(2 * 0.0025 / 3))
    assert math.isnan(gt.welch_ci([0.3], [0.2, 0.3])[1])


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


@pytest.mark.parametrize("seed", [1, 2, 3, 17])
def test_trl_gets_the_same_prompts_in_the_same_order_as_our_trainer(seed):
    from types import SimpleNamespace

    from torchrl_grpo.training.grpo_trainer import GRPOTrainer

    fake = SimpleNamespace(settings=SimpleNamespace(batch_size=2, seed=seed), train_tasks=list(range(7473)))
    ours = [t["index"] for step in range(10) for t in GRPOTrainer.tasks_for_step(fake, step)]
    assert gt.trl_prompt_order(seed, 7473, 20) == ours
    with pytest.raises(ValueError, match="one epoch"):
        gt.trl_prompt_order(seed, 10, 20)


@pytest.mark.parametrize("cores", [None, "0"])
def test_run_logged_names_the_failed_script_and_keeps_the_log(tmp_path, cores):
    """A failing stage raises with the script's name (also when pinned by taskset) and the log's tail."""
    import shutil
    import sys
    from types import SimpleNamespace

    if cores and shutil.which("taskset") is None:
        pytest.skip("taskset not installed")
    script = tmp_path / "failing_stage.py"
    script.write_text("print('step 1 ok')\nraise SystemExit(3)\n")
    log = tmp_path / "run.log"
    with pytest.raises(RuntimeError, match=r"failing_stage\.py exited 3") as e:
        gt.run_logged(SimpleNamespace(cores=cores, threads=0), [sys.executable, str(script)], log)
    assert "step 1 ok" in str(e.value)
    assert log.read_text().startswith("$ ") and "step 1 ok" in log.read_text()
