"""Continual-learning metrics (torchrl_grpo.continual.transfer): transfer metrics on hand-made matrices, tables, plots."""
from __future__ import annotations

import json

import numpy as np
import pytest

from torchrl_grpo.continual import transfer as cl

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

R3 = [[0.5, 0.1, 0.0],
      [0.3, 0.6, 0.2],
      [0.2, 0.4, 0.7]]
B3 = [0.1, 0.05, 0.0]


def test_transfer_metrics_hand_computed_3x3():
    m = cl.transfer_metrics(R3, B3)
    # worked by hand from the formulas
    assert m["acc"] == pytest.approx((0.2 + 0.4 + 0.7) / 3)
    assert m["bwt"] == pytest.approx(((0.2 - 0.5) + (0.4 - 0.6)) / 2)  # -0.25
    assert m["fwt"] == pytest.approx(((0.1 - 0.05) + (0.2 - 0.0)) / 2)  # 0.125
    assert m["forgetting"] == pytest.approx(((0.5 - 0.2) + (0.6 - 0.4)) / 2)  # 0.25
    assert set(m) == {"acc", "bwt", "fwt", "forgetting"}


def test_forgetting_uses_the_best_earlier_score_not_the_diagonal():
    # domain 0 kept improving after its own task (0.5 -> 0.8), then dropped to 0.2: BWT compares with the
    # diagonal (0.5), forgetting with the best earlier row (0.8)
    R = [[0.5, 0.0, 0.0], [0.8, 0.6, 0.0], [0.2, 0.6, 0.9]]
    m = cl.transfer_metrics(R, [0.0, 0.0, 0.0])
    assert m["bwt"] == pytest.approx(((0.2 - 0.5) + (0.6 - 0.6)) / 2)
    assert m["forgetting"] == pytest.approx(((0.8 - 0.2) + (0.6 - 0.6)) / 2)
    assert m["fwt"] == pytest.approx(0.0)


def test_transfer_metrics_matches_a_loop_implementation_on_random_matrices():
    rng = np.random.default_rng(0)
    for T in (2, 3, 5):
        R, b = rng.random((T, T)), rng.random(T)
        bwt = sum(R[T - 1][i] - R[i][i] for i in range(T - 1)) / (T - 1)
        fwt = sum(R[i - 1][i] - b[i] for i in range(1, T)) / (T - 1)
        fg = sum(max(R[k][j] for k in range(T - 1)) - R[T - 1][j] for j in range(T - 1)) / (T - 1)
        m = cl.transfer_metrics(R.tolist(), b.tolist())
        assert m == pytest.approx({"acc": sum(R[T - 1]) / T, "bwt": bwt, "fwt": fwt, "forgetting": fg})


def test_single_task_has_no_transfer():
    assert cl.transfer_metrics([[0.7]], [0.2]) == {"acc": pytest.approx(0.7), "bwt": 0.0, "fwt": 0.0,
                                                   "forgetting": 0.0}


def test_all_zero_matrix():
    assert cl.transfer_metrics(np.zeros((4, 4)), np.zeros(4)) == {"acc": 0.0, "bwt": 0.0, "fwt": 0.0,
                                                                  "forgetting": 0.0}


@pytest.mark.parametrize("R,b,msg", [
    ([[0.1, 0.2]], [0.0, 0.0], "square"),
    ([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]], [0, 0, 0], "square"),
    ([], [], "square"),
    ([[0.1, 0.2], [0.3, 0.4]], [0.0], "one entry per domain"),
    ([[0.1, 0.2], [0.3, 0.4]], [0.0, 0.0, 0.0], "one entry per domain"),
    ([[0.1, float("nan")], [0.3, 0.4]], [0.0, 0.0], "finite"),
    ([[0.1, None], [0.3, 0.4]], [0.0, 0.0], "finite"),
])
def test_bad_shapes_raise(R, b, msg):
    with pytest.raises(ValueError, match=msg):
        cl.transfer_metrics(R, b)


def test_transfer_at_boundary_uses_the_leading_block():
    R = [[0.5, 0.1, 0.0], [0.3, 0.6, 0.2], [None, None, None]]
    assert cl.transfer_at_boundary(R, B3, 1) == pytest.approx(cl.transfer_metrics([[0.5, 0.1], [0.3, 0.6]], B3[:2]))
    assert cl.transfer_at_boundary(R, B3, 0)["bwt"] == 0.0
    with pytest.raises(ValueError, match="finite"):
        cl.transfer_at_boundary(R, B3, 2)
    with pytest.raises(ValueError, match="outside"):
        cl.transfer_at_boundary(R, B3, 3)


def test_banner_and_tables():
    s = cl.format_banner(1, ["airline", "retail", "telecom"], [[0.34, 0.12, 0.0], [0.29, 0.31, 0.0], [None] * 3],
                         [0.3, 0.1, 0.0], steps=100)
    lines = s.splitlines()
    assert lines[0] == lines[2] == "=" * 80
    assert lines[1] == "Task 1: RETAIL   (after 100 steps; airline 0.34 -> 0.29, retail 0.12 -> 0.31, telecom 0.00)"
    first = cl.format_banner(0, ["a", "b"], [[0.5, 0.2], [None, None]], [0.1, 0.0], steps=3)
    assert "a 0.10 -> 0.50, b 0.20" in first
    table = cl.format_matrix(["a", "b"], [[0.5, 0.2], [None, None]], [0.1, 0.0])
    assert "untrained (b)" in table and "0: a" in table and "-" in table.splitlines()[-1]
    assert cl.format_matrix(["a", "b"], [[0.5, 0.2], None], [0.1, 0.0]) == table  # an unfinished row may be None
    assert "bwt" in cl.format_transfer(cl.transfer_metrics(R3, B3))


def _metrics(finished: bool = True) -> dict:
    m = {
        "task_order": ["mock", "telecom"], "algorithm": "sequential", "metric": "reward_mean", "boundaries": [2, 4],
        "R": [[0.5, 0.1], [0.3, 0.6]] if finished else [[0.5, 0.1], None], "b": [0.1, 0.0],
        "base/eval": [{"step": 0, "domain": "mock", "reward_mean": 0.1}, {"step": 0, "domain": "telecom",
                                                                           "reward_mean": 0.0}],
        "task_0/train": [{"step": 1, "domain": "mock", "reward_mean": 0.2, "loss": 0.1},
                         {"step": 2, "domain": "mock", "reward_mean": 0.4, "loss": 0.0}],
        "task_0/eval": [{"step": 2, "domain": "mock", "reward_mean": 0.5}, {"step": 2, "domain": "telecom",
                                                                             "reward_mean": 0.1}],
        "task_1/train": [{"step": 3, "domain": "telecom", "reward_mean": 0.0}, {"step": 4, "domain": "telecom",
                                                                                  "reward_mean": None}],
        "task_1/eval": [{"step": 4, "domain": "mock", "reward_mean": 0.3}, {"step": 4, "domain": "telecom",
                                                                             "reward_mean": 0.6}],
        "transfer": [],
    }
    if finished:
        m["summary"] = cl.transfer_metrics(m["R"], m["b"])
    return m


@pytest.mark.parametrize("finished", [True, False])
def test_plot_run_writes_pngs(tmp_path, finished):
    paths = cl.plot_run(tmp_path, _metrics(finished))
    assert [p.name for p in paths] == [cl.LEARNING_CURVES_PNG, cl.ACCURACY_MATRIX_PNG]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 2000


def test_cli_redraws_from_metrics_json(tmp_path, capsys):
    (tmp_path / cl.METRICS_JSON).write_text(json.dumps(_metrics()))
    assert cl.main(["plot", str(tmp_path)]) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(tmp_path / cl.LEARNING_CURVES_PNG), str(tmp_path / cl.ACCURACY_MATRIX_PNG)]
    assert (tmp_path / cl.ACCURACY_MATRIX_PNG).read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(FileNotFoundError, match="metrics.json"):
        cl.main(["plot", str(tmp_path / "nope")])


def test_plots_go_to_wandb_when_it_is_on(tmp_path):
    import wandb

    from torchrl_grpo.reporting.stats_logger import StatsLogger

    class FakeRun:
        calls = []

        def log(self, data, step):
            self.calls.append((data, step))

    logger = StatsLogger(tmp_path, wandb_mode="disabled", console=False)
    logger.log_images({"cl/accuracy_matrix": tmp_path / "none.png"}, step=1)  # no wandb: nothing, no error
    logger._wandb = FakeRun()
    paths = cl.plot_run(tmp_path, _metrics())
    logger.log_images({"cl/learning_curves": paths[0], "cl/accuracy_matrix": paths[1]}, step=4)
    (data, step), = FakeRun.calls
    assert step == 4 and set(data) == {"cl/learning_curves", "cl/accuracy_matrix"}
    assert all(isinstance(v, wandb.Image) for v in data.values())
    logger._wandb = None
    logger.close()
