"""Results scripts run from any checkout (issue 36): no machine's absolute paths in benchmarks/**/*.sh; the
checkout is found from the script's own location, everything else comes from variables."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "benchmarks").rglob("*.sh"))
# an absolute path into a machine's own tree: /work/..., /home/..., /tmp/..., /root/..., /Users/..., /mnt/..., /data/...
# (system paths such as /usr/bin/time or /proc/loadavg are the same everywhere and allowed)
ABSOLUTE = re.compile(r"(?<![\w.$}-])/(?:work|home|tmp|root|Users|mnt|data|scratch)/")


def machine_paths(text: str) -> list[str]:
    """Lines of a shell script (comments included: they are copied as commands) naming a machine-local path."""
    return [line.strip() for line in text.splitlines() if ABSOLUTE.search(line)]


def test_the_pattern_sees_a_machine_path_and_not_a_variable_or_a_system_path():
    assert machine_paths("out=/work/runs/s32/measure")
    assert machine_paths("(cd /work/${side}_tree && python x.py)")
    assert machine_paths('cp a "/home/me/x"')
    assert not machine_paths('out="${OUT:-$WORK/measure}"; /usr/bin/time -v x; cut -f1 /proc/loadavg')
    assert not machine_paths('REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"; ls $REPO/tmp/x')


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_results_script_names_one_machines_absolute_paths(script):
    found = machine_paths(script.read_text())
    assert not found, f"{script.relative_to(REPO)} names machine-local paths (use the script's location or a " \
                      f"variable): {found}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_results_script_parses(script):
    p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout")
def test_run_final_extracts_its_commit_and_writes_only_under_work_and_out(tmp_path):
    """run_final.sh from another cwd, with PY=true (every measurement a no-op): it resolves the checkout from its
    own path, extracts the commit into $WORK and writes its logs into $OUT, nothing in the checkout."""
    env = {**os.environ, "WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out"), "PY": "true"}
    env.pop("MEASURING_FLAG", None)
    p = subprocess.run(["bash", str(REPO / "benchmarks/results/layout_refactor_ratios/run_final.sh")], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert (tmp_path / "work" / "final_tree" / "benchmarks" / "quick_guard.py").is_file(), p.stderr
    assert (tmp_path / "out" / "qg_final_1.log").is_file() and (tmp_path / "out" / "tb_final.log").is_file()
    assert "logs in " + str(tmp_path / "out") in p.stdout
