"""The metrics sink's resume rule (issue 36.7): StatsLogger.rewind(step) cuts every step-indexed log of the run dir
to the checkpoint's step, atomically, and later rows append after it."""
from __future__ import annotations

import json
import os

import pytest

from torchrl_grpo.reporting import stats_logger as sl
from torchrl_grpo.reporting.stats_logger import RUN_LOGS, StatsLogger, truncate_jsonl


def _steps(path):
    return [json.loads(x)["step"] for x in path.read_text().splitlines()]


def test_rewind_cuts_each_log_after_the_step_and_the_next_rows_follow(tmp_path):
    lg = StatsLogger(tmp_path, wandb_mode="disabled", console=False)
    for s in range(0, 5):
        lg.log({"loss/total": float(s)}, step=s)
        lg.log_samples([{"text": f"a{s}"}, {"text": f"b{s}"}], step=s)
        lg.log_samples([{"reward": 1.0}], step=s, name="eval_episodes.jsonl")
    assert lg.rewind(2) == {"metrics.jsonl": 2, "samples.jsonl": 4, "eval_episodes.jsonl": 2}
    lg.log({"loss/total": 3.5}, step=3)  # the resumed run's next row, through the reopened handle
    lg.log_samples([{"text": "c3"}], step=3)
    lg.close()
    assert _steps(tmp_path / "metrics.jsonl") == [0, 1, 2, 3]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["loss/total"] == 3.5
    assert _steps(tmp_path / "samples.jsonl") == [0, 0, 1, 1, 2, 2, 3]
    assert _steps(tmp_path / "eval_episodes.jsonl") == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(RUN_LOGS)  # no temporary file left


def test_truncate_keeps_rows_byte_for_byte_drops_torn_lines_and_leaves_a_clean_file_alone(tmp_path):
    p = tmp_path / "metrics.jsonl"
    rows = [b'{"step": 1, "x": 1.25}\n', b'{"step":2,"y":"k"}\n', b'{"step": 3}\n', b'{"ste']  # killed mid-write
    p.write_bytes(b"".join(rows))
    assert truncate_jsonl(p, 2) == 2
    assert p.read_bytes() == rows[0] + rows[1]
    mtime = os.stat(p).st_mtime_ns
    assert truncate_jsonl(p, 2) == 0 and os.stat(p).st_mtime_ns == mtime  # nothing to cut: not rewritten
    assert truncate_jsonl(tmp_path / "missing.jsonl", 2) == 0
    assert truncate_jsonl(p, 0) == 2 and p.read_bytes() == b""


def test_a_failed_rewrite_leaves_the_log_unchanged(tmp_path, monkeypatch):
    p = tmp_path / "metrics.jsonl"
    data = b'{"step": 1}\n{"step": 2}\n'
    p.write_bytes(data)

    def boom(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(sl.os, "replace", boom)
    with pytest.raises(OSError, match="disk gone"):
        truncate_jsonl(p, 1)
    assert p.read_bytes() == data and [x.name for x in tmp_path.iterdir()] == ["metrics.jsonl"]
