"""Issue 43 (smaller): no script or test edits ``sys.path``. The instruments in ``benchmarks/`` import their shared
harness as the package ``experiments`` beside them (``from experiments.harness import ...``: ``python
benchmarks/<x>.py`` has ``benchmarks/`` first on ``sys.path``), the drivers in ``benchmarks/experiments/`` their
siblings by name (their own folder is first), tests load either by path (tests/bench_experiments.py); the package is
installed. gpu_table, rollout_bench and train_bench had gone back to ``sys.path.insert`` (issue 35).

Read from the AST: a call of a mutating ``list`` method on ``sys.path`` (``insert``, ``append``, ``extend``, ...), an
assignment or augmented assignment to ``sys.path`` or one of its items, or ``del`` of them. (``site.addsitedir``, the
standard way to add a site directory the user names on the command line, is not an edit of ours: train_bench's
``--append-sys-path``.)"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MUTATORS = {"insert", "append", "extend", "remove", "pop", "clear", "reverse", "sort", "__setitem__", "__iadd__"}


def _is_sys_path(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
            and node.value.id == "sys")


def _target_is_sys_path(t: ast.AST) -> bool:
    return _is_sys_path(t) or (isinstance(t, ast.Subscript) and _is_sys_path(t.value))


def sys_path_edits(source: str) -> list[int]:
    """Line numbers of the ``sys.path`` edits in ``source`` (module docstring)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                and _is_sys_path(node.func.value)):
            lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            if any(_target_is_sys_path(t) for t in targets):
                lines.append(node.lineno)
    return sorted(lines)


def _scripts():
    for top in ("benchmarks", "tests"):
        for path in sorted((REPO / top).rglob("*.py")):
            if "results" not in path.relative_to(REPO).parts:
                yield path


def test_the_rule_sees_each_kind_of_edit():
    src = ("import sys\nsys.path.insert(0, 'x')\nsys.path.append('y')\nsys.path.extend(['z'])\nsys.path[0] = 'w'\n"
           "sys.path += ['v']\nsys.path = ['u']\ndel sys.path[0]\nprint(sys.path[0])\nimport site\n"
           "site.addsitedir('t')\n")
    assert sys_path_edits(src) == [2, 3, 4, 5, 6, 7, 8]


def test_no_benchmark_or_test_edits_sys_path():
    found = {str(p.relative_to(REPO)): n for p in _scripts() if (n := sys_path_edits(p.read_text(encoding="utf-8")))}
    assert found == {}, f"sys.path edited at (file: lines) {found}: import the harness as experiments.harness"


@pytest.mark.parametrize("script", ["gpu_table.py"])
def test_an_instrument_imports_the_harness_from_its_own_command_line(script, tmp_path):
    """``python benchmarks/<x>.py --help`` from another directory: the harness is found with no path edit (gpu_table
    imports only the harness and the standard library; rollout_bench and train_bench, which load torch, do the same
    import)."""
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--help"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
