"""The last line of a grpo.py / sft.py run (issue 45, item 7): greedy accuracy (pass^1 on tau2) before -> after, n,
the Wilson 95% intervals and the run dir (torchrl_grpo/reporting/headline.py, torchrl_grpo/cli.result_line). The
end-to-end check (the line really is the last one grpo.py prints) is in tests/test_config_cli.py."""
from __future__ import annotations

import math

from omegaconf import OmegaConf

from torchrl_grpo.cli import result_line
from torchrl_grpo.reporting.headline import continual_headline, headline


def _wilson(p, n, z=1.959964):  # Wilson (1927), written out independently of the module
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return f"[{c - h:.3f}, {c + h:.3f}]"


def test_before_after_with_n_intervals_and_run_dir():
    line = headline({"eval/accuracy": 0.195, "eval/n_tasks": 200.0}, {"eval/accuracy": 0.555, "eval/n_tasks": 200.0},
                    "outputs/2026-11-28/12-00-00")
    assert line == (f"result: greedy accuracy 0.195 -> 0.555 (n=200; 95% Wilson {_wilson(0.195, 200)} -> "
                    f"{_wilson(0.555, 200)}); run dir: outputs/2026-11-28/12-00-00")
    assert "[0.146, 0.255]" in line  # the default run's published interval (README)


def test_one_evaluation_none_and_unknown_n():
    assert headline(None, {"eval/accuracy": 0.5, "eval/n_tasks": 4.0}, "r", label="pass^1 (greedy)") == (
        f"result: pass^1 (greedy) 0.500 (n=4; 95% Wilson {_wilson(0.5, 4)}); run dir: r")
    assert headline({}, None, "r").startswith("result: no evaluation in this run")
    assert headline({"eval/accuracy": 0.0}, {"eval/accuracy": 1.0}, "r") == (
        "result: greedy accuracy 0.000 -> 1.000 (n=?; 95% Wilson ? -> ?); run dir: r")


def _cfg(**kw):
    base = {"cl": {"task_order": None}, "econfig": {"env_id": "GSM8K-v1"}, "eval_only": False}
    return OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(kw))


def test_result_line_picks_the_run_kind_and_tau2_says_pass1():
    ev0, ev1 = {"eval/accuracy": 0.25, "eval/n_tasks": 4.0}, {"eval/accuracy": 0.75, "eval/n_tasks": 4.0}
    assert result_line(_cfg(), {"eval_start": ev0, "eval_end": ev1}, "d").startswith(
        "result: greedy accuracy 0.250 -> 0.750 (n=4;")
    tau2 = result_line(_cfg(econfig={"env_id": "tau2"}), {"eval_start": ev0, "eval_end": ev1}, "d")
    assert tau2.startswith("result: pass^1 (greedy) 0.250 -> 0.750")
    # no final evaluation: the `every` one merged into the last step's row closes the curve
    assert "0.250 -> 0.750" in result_line(_cfg(), {"eval_start": ev0, "last": {"loss/total": 1.0, **ev1}}, "d")
    assert result_line(_cfg(eval_only=True), ev1, "d").startswith("result: greedy accuracy 0.750 (n=4;")
    cl = result_line(_cfg(cl={"task_order": ["mock"]}), {"acc": 0.5, "bwt": -0.1, "fwt": 0.0}, "d")
    assert cl == "result: continual run ACC 0.500, BWT -0.100, FWT 0.000; run dir: d"
    assert continual_headline({"acc": 0.5}, "d") == "result: continual run ACC 0.500; run dir: d"
