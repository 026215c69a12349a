"""The session-end check of tests/conftest.py: the tests leave no new git-ignored files in the checkout (issue 36:
an SFT test on tau2 mock left a Hydra run dir under outputs/)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO, checkout_ignored_paths, checkout_root_strays

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def test_new_ignored_outputs_are_seen_and_caches_are_not(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("outputs/\n__pycache__/\n.pytest_cache/\n")
    assert checkout_ignored_paths(tmp_path) == set()
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"x")
    (tmp_path / ".pytest_cache").mkdir()
    (tmp_path / ".pytest_cache" / "README.md").write_text("x")
    assert checkout_ignored_paths(tmp_path) == set()
    (tmp_path / "outputs" / "2026-11-26" / "16-22-00" / ".hydra").mkdir(parents=True)
    (tmp_path / "outputs" / "2026-11-26" / "16-22-00" / "sft.log").write_text("x")
    assert checkout_ignored_paths(tmp_path) == {"outputs/2026-11-26/16-22-00/sft.log"}


def test_outside_a_git_checkout_the_check_is_off(tmp_path):
    assert checkout_ignored_paths(tmp_path / "nothing-here") is None


def test_the_check_runs_on_this_checkout():
    """The session-end comparison has a baseline here (conftest's pytest_sessionstart recorded one)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    assert isinstance(checkout_ignored_paths(), set)


def test_a_stray_file_in_the_checkout_root_is_seen(tmp_path):
    """What a codeio snippet left in the root (issue 42): an untracked file (or folder) at the top, not ignored; new
    source files there (someone's work in the shared checkout) and untracked files below the top are not counted."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("outputs/\n")
    subprocess.run(["git", "add", ".gitignore"], cwd=tmp_path, check=True)
    assert checkout_root_strays(tmp_path) == set()
    (tmp_path / "tool.py").write_text("x")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("x")
    subprocess.run(["git", "add", "docs/index.md"], cwd=tmp_path, check=True)  # a tracked folder
    (tmp_path / "docs" / "page.md").write_text("x")
    (tmp_path / "docs" / "data.csv").write_text("x")
    assert checkout_root_strays(tmp_path) == set()
    (tmp_path / "sailor_performance.csv").write_text("x")
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "a").write_text("x")
    assert checkout_root_strays(tmp_path) == {"sailor_performance.csv", "index/"}
