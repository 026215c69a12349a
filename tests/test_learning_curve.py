"""The run's learning curve PNG (torchrl_grpo.reporting.learning_curve) and its Wilson intervals."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchrl_grpo.reporting.learning_curve import plot_learning_curve, wilson_interval

PNG = b"\x89PNG\r\n\x1a\n"


def test_wilson_interval_matches_the_formula_and_bounds():
    lo, hi = wilson_interval(29 / 150, 150)  # the GSM8K seed table: 0.193 (29/150) [0.138, 0.264]
    assert round(lo, 3) == 0.138 and round(hi, 3) == 0.264
    assert wilson_interval(0.0, 10)[0] == 0.0 and wilson_interval(1.0, 10)[1] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        wilson_interval(0.5, 0)


def test_plot_from_metrics_jsonl(tmp_path):
    rows = [{"step": 0, "eval/accuracy": 0.2}] + [
        {"step": s, "reward/mean": 0.1 * s, "episode/truncated_fraction": 0.5} for s in range(1, 5)
    ] + [{"step": 4, "eval/accuracy": 0.3, "eval/pass^4": 0.1}]
    m = tmp_path / "metrics.jsonl"
    m.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = plot_learning_curve(m, tmp_path / "lc.png", n_eval=50)
    assert out.read_bytes()[:8] == PNG and out.stat().st_size > 5000
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"step": 0, "load_time_s": 1.0}) + "\n")
    assert plot_learning_curve(empty, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 0}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        plot_learning_curve(bad, tmp_path / "x.png")
    # the CLI redraws it into the run dir
    p = subprocess.run([sys.executable, "-m", "torchrl_grpo.reporting.learning_curve", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == PNG


def test_an_sft_run_draws_its_loss_and_a_lone_evaluation_shows_its_interval(tmp_path, monkeypatch):
    # sft.py logs sft/nll (no reward/mean) and one evaluation at its end: the training panel was empty and the
    # Wilson band of a single point had no width (nothing visible)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figs.append(fig), real_close(fig)))
    rows = [{"step": s, "sft/nll": 1.0 / s} for s in range(1, 6)] + [{"step": 5, "eval/accuracy": 0.37}]
    m = tmp_path / "metrics.jsonl"
    m.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert plot_learning_curve(m, tmp_path / "lc.png", n_eval=200) is not None
    left, right = figs[-1].axes
    assert [ln.get_label() for ln in left.lines] == ["SFT loss (sft/nll)"]
    assert len(right.containers) == 1  # the lone point's interval, as an error bar
    (lo, hi), = [seg[:, 1] for seg in right.containers[0].lines[2][0].get_segments()]
    assert (round(lo, 3), round(hi, 3)) == tuple(round(x, 3) for x in wilson_interval(0.37, 200))
    # without n_eval (the CLI redraw of a run made with output_dir=, which has no .hydra/): the logged eval/n_tasks
    m.write_text("\n".join(json.dumps(r) for r in rows[:-1] + [{**rows[-1], "eval/n_tasks": 200.0}]) + "\n")
    assert plot_learning_curve(m, tmp_path / "lc2.png") is not None
    assert len(figs[-1].axes[1].containers) == 1
