"""benchmarks/experiments/tau2_mock_summary.py: the laptop tau2 recipe's table and PNG from run dirs (issue 48).

Fake run dirs (what `grpo.py` writes: `warm_start.json`, `metrics.jsonl`, `eval_episodes.jsonl`); no model.
"""
import json
from pathlib import Path

import pytest

from tests.bench_experiments import load

st = load("stats")
summary = load("tau2_mock_summary")


def _episodes(path: Path, step: int, solved: dict[str, bool], mode: str = "greedy") -> None:
    with path.open("a") as f:
        for tid, ok in solved.items():
            f.write(json.dumps({"step": step, "mode": mode, "task_id": tid, "reward": 1.0 if ok else 0.0}) + "\n")


def _recipe(tmp_path: Path, name: str, seed: int, sft: float, grpo: float) -> Path:
    d = tmp_path / name
    d.mkdir()
    ws = {"base": {"eval/accuracy": 0.0, "eval/n_tasks": 50.0}, "sft": {"eval/accuracy": sft, "eval/n_tasks": 200.0},
          "grpo": {"eval/accuracy": grpo, "eval/n_tasks": 200.0}, "wall_s": {"total": 600.0}}
    (d / "warm_start.json").write_text(json.dumps(ws))
    (d / "config.yaml").write_text(f"seed: {seed}\ntrain: {{steps: 8, batch_size: 8}}\ngconfig: {{n_samples: 8}}\n")
    return d


def test_the_across_seed_interval_is_mean_plus_minus_the_t_half_width(tmp_path):
    """Caught a bug: the line printed ``[mean, half-width]`` of :func:`stats.mean_ci` as if it were ``[lo, hi]``."""
    rows = [summary.recipe_row(_recipe(tmp_path, f"s{i}", i, 0.5, g)) for i, g in enumerate((0.55, 0.60, 0.65), 1)]
    md = summary.render(rows, [])
    m, hw = st.mean_ci([0.05, 0.10, 0.15])
    assert f"over 3 runs (seeds 1, 2, 3): mean {m:+.3f}, 95% t-interval [{m - hw:+.3f}, {m + hw:+.3f}]" in md, md


def _continued(tmp_path: Path) -> tuple[Path, Path]:
    start = _recipe(tmp_path, "start", 1, 0.5, 0.45)
    _episodes(start / "eval_episodes.jsonl", 0, {"t0": True, "t1": True, "t2": False, "t3": False})
    _episodes(start / "eval_episodes.jsonl", 8, {"t0": False, "t1": False, "t2": False, "t3": False})
    run = tmp_path / "kl1" / "run"
    run.mkdir(parents=True)
    metrics = [{"step": s, "reward/mean": r, "time/step_s": 100.0} for s, r in ((1, 0.5), (2, 0.75))]
    metrics.append({"step": 2, "eval/accuracy": 0.75, "eval/n_tasks": 4.0})
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics) + "\n")
    _episodes(run / "eval_episodes.jsonl", 2, {"t0": True, "t1": False, "t2": True, "t3": True})
    _episodes(run / "eval_episodes.jsonl", 2, {"t0": False, "t1": False, "t2": False, "t3": False}, mode="sampled")
    return start, run


def test_a_grpo_only_run_takes_base_and_sft_from_its_start_and_pairs_with_the_starts_first_greedy_step(tmp_path):
    start, run = _continued(tmp_path)
    row = summary.continued_row(start, run)
    assert row["base"] == (0.0, 50) and row["sft"] == (0.5, 200) and row["grpo"] == (0.75, 4)
    # SFT (start's step 0): t0, t1 solved; GRPO (run's last greedy step): t0, t2, t3 -> only SFT t1, only GRPO t2, t3
    assert row["paired"] == (1, 2) and row["seed"] is None  # a run dir from before grpo.py wrote config.yaml
    (run / "config.yaml").write_text("seed: 7\n")
    assert summary.continued_row(start, run)["seed"] == 7
    assert row["train_reward"] == [0.5, 0.75] and row["wall_min"] == {"grpo_phase": round(200 / 60, 1)}
    lo_g, _ = st.wilson(3, 4)
    assert row["disjoint"] == (lo_g > st.wilson(100, 200)[1])
    md = summary.render([row], [])
    assert "| kl1/run |" in md and "1 / 2 (p=1)" in md


def test_the_cli_writes_table_json_and_png_for_grpo_only_runs_and_refuses_half_an_option(tmp_path, capsys):
    start, run = _continued(tmp_path)
    stem = tmp_path / "out" / "table"
    assert summary.main(["--start", str(start), "--grpo", str(run), "--write", str(stem)]) == 0
    assert stem.with_suffix(".png").stat().st_size > 0
    saved = json.loads(stem.with_suffix(".json").read_text())
    assert saved["recipes"][0]["paired"] == [1, 2]
    with pytest.raises(SystemExit):
        summary.main(["--grpo", str(run)])
    with pytest.raises(SystemExit):
        summary.main([])


def test_a_grpo_only_run_without_an_evaluation_is_a_clear_error(tmp_path):
    start, run = _continued(tmp_path)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    with pytest.raises(ValueError, match="no eval/accuracy"):
        summary.continued_row(start, run)


def test_a_recipe_run_pairs_its_first_and_last_greedy_steps_and_ignores_sampled_rows(tmp_path):
    d = _recipe(tmp_path, "r", 1, 0.5, 0.75)
    assert summary.recipe_row(d)["paired"] is None  # no eval_episodes.jsonl: nothing to pair
    _episodes(d / "eval_episodes.jsonl", 0, {"t0": True, "t1": True, "t2": False, "t3": False})
    _episodes(d / "eval_episodes.jsonl", 8, {"t0": True, "t1": True, "t2": True, "t3": True}, mode="sampled")
    _episodes(d / "eval_episodes.jsonl", 16, {"t0": False, "t1": True, "t2": True, "t3": True})
    assert summary.recipe_row(d)["paired"] == (1, 2)  # only SFT: t0; only GRPO: t2, t3 (step 8 is sampled)
    e = _recipe(tmp_path, "e", 1, 0.5, 0.75)  # the end evaluated other tasks than the start: nothing shared
    _episodes(e / "eval_episodes.jsonl", 0, {"t0": True})
    _episodes(e / "eval_episodes.jsonl", 16, {"t9": True})
    assert summary.recipe_row(e)["paired"] is None
