"""benchmarks/experiments/default_run_seeds.py (issue 26 s.2): before/after extraction and the summary over fake runs
(no model)."""
import json
from pathlib import Path

import pytest

from tests.bench_experiments import load

drs = load("default_run_seeds")


def _fake_run(root: Path, seed: int, before: float, after: float, n: int = 200) -> None:
    d = root / f"seed{seed}"
    d.mkdir(parents=True)
    rows = [{"step": 0, "eval/accuracy": before, "eval/n_tasks": n}]
    rows += [{"step": s, "reward/mean": 0.1 * s} for s in (1, 2)]
    rows += [{"step": 2, "eval/accuracy": after, "eval/n_tasks": n}]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    res = {"seed": seed, **drs.run_result(d), "wall_s": 600.0, "loadavg_start": [0.1, 0, 0], "loadavg_end": [2.0, 0, 0]}
    (d / "result.json").write_text(json.dumps(res))


def test_run_result_takes_the_first_and_last_evaluation_and_the_train_rewards(tmp_path):
    _fake_run(tmp_path, 1, 0.2, 0.5)
    r = json.loads((tmp_path / "seed1" / "result.json").read_text())
    assert r["before"] == {"step": 0, "accuracy": 0.2, "n": 200} and r["after"]["accuracy"] == 0.5
    assert [t["reward"] for t in r["train"]] == pytest.approx([0.1, 0.2])


def test_a_run_without_two_evaluations_is_refused(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/accuracy": 0.2, "eval/n_tasks": 10}) + "\n")
    with pytest.raises(RuntimeError, match="before and after"):
        drs.run_result(tmp_path)


def test_summary_says_which_seeds_moved_outside_their_wilson_intervals(tmp_path):
    _fake_run(tmp_path, 1, 0.20, 0.50)   # 0.2 [0.149, 0.263] vs 0.5 [0.431, 0.569]: disjoint
    _fake_run(tmp_path, 2, 0.20, 0.24)   # overlapping
    s = drs.summarise(tmp_path)
    assert [x["disjoint"] for x in s["runs"]] == [True, False]
    assert s["change_mean"] == pytest.approx(0.17)
    drs.write_outputs(tmp_path / "out" / "default_run", drs.to_markdown(s), s, lambda p: drs.plot(tmp_path, p))
    assert (tmp_path / "out" / "default_run.png").stat().st_size > 0
    assert "| 1 | 0.200" in (tmp_path / "out" / "default_run.md").read_text()
