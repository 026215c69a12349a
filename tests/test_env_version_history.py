"""Every Gymnasium id the ``envs`` package registers documents the history of what its reward means.

Gymnasium's own envs end their class docstring with ``## Version History`` (CartPole: ``* v1: ...``,
``* v0: Initial versions release``). Our policy (module docstring of :mod:`envs`): an id's version is bumped
whenever its reward semantics change; each version's entry lists, oldest first, the commits that changed the
env's behaviour, each with its short sha and date and whether it changed the reward of an episode scored before.

The ids come from the registry (entry points under ``envs.``, compat ids included), so an id registered later is
checked without editing this file. Docstrings are read from the source (nothing is imported or built).
"""
from __future__ import annotations

import ast
import datetime
import re
import shutil
import subprocess
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.envs.registration import parse_env_id

import envs

gym.register_envs(envs)

REGISTERED = sorted(
    env_id for env_id, spec in gym.registry.items()
    if isinstance(spec.entry_point, str) and spec.entry_point.startswith("envs.")
)

_SECTION_RE = re.compile(r"^[ \t]*## Version History[ \t]*$(?P<body>.*?)(?=^[ \t]*## |\Z)", re.MULTILINE | re.DOTALL)
#: ``* v1: ...`` opens a version's entry (Gymnasium's format).
_VERSION_RE = re.compile(r"^[ \t]*\* v(\d+):", re.MULTILINE)
#: ``- abc1234 (2026-11-23): ...`` one change inside a version.
_CHANGE_RE = re.compile(r"^[ \t]*- ([0-9a-f]{7,40}) \((\d{4}-\d{2}-\d{2})\):", re.MULTILINE)


def _class_doc(env_id: str) -> tuple[str, str]:
    """``(class name, class docstring)`` of ``env_id``'s entry point, read from its source file (importing
    ``envs.reasoning_gym`` alone takes ~20 s on a loaded machine; the docstring needs no import)."""
    module, name = gym.registry[env_id].entry_point.split(":")
    root, *parts = module.split(".")
    assert root == "envs", module
    path = Path(envs.__file__).parent.joinpath(*parts[:-1], parts[-1] + ".py")
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return name, ast.get_docstring(node) or ""
    raise AssertionError(f"{env_id}: no class {name} in {path}")


def _history(env_id: str) -> str | None:
    m = _SECTION_RE.search(_class_doc(env_id)[1])
    return m.group("body") if m else None


def test_the_package_lists_are_registered():
    assert set(envs.ENV_IDS) | set(envs.COMPAT_IDS) <= set(REGISTERED)


def test_the_versioning_policy_is_stated_where_the_ids_are_registered():
    doc = " ".join((envs.__doc__ or "").split())
    assert "bumped whenever its reward semantics change" in doc
    assert "Version History" in doc


@pytest.mark.parametrize("env_id", REGISTERED)
def test_version_history_names_the_ids_version_with_dated_commits(env_id):
    name, _ = _class_doc(env_id)
    history = _history(env_id)
    assert history is not None, f"{env_id}: {name}'s class docstring has no '## Version History' section"
    version = parse_env_id(env_id)[2]
    assert version is not None, f"{env_id}: a registered id carries a version (-vN)"
    versions = [int(v) for v in _VERSION_RE.findall(history)]
    assert version in versions, f"{env_id}: Version History of {name} has no '* v{version}:' entry"
    assert max(versions) == version, (
        f"{env_id}: Version History of {name} describes v{max(versions)}, later than the registered id")
    changes = _CHANGE_RE.findall(history)
    assert changes, f"{env_id}: Version History of {name} lists no '- <sha> (<date>):' change"
    dates = [datetime.date.fromisoformat(d) for _, d in changes]
    assert dates == sorted(dates), f"{env_id}: changes are not listed oldest first: {changes}"


def _git_root() -> Path | None:
    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        return None
    return root


def test_version_history_commits_exist_with_their_dates():
    """Every sha a Version History names is a commit of this repository, authored on the date written beside it."""
    root = _git_root()
    if root is None:
        pytest.skip("not a git checkout")
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=root, capture_output=True,
                             text=True, check=False).stdout.strip()
    if shallow == "true":
        pytest.skip("shallow clone: older commits are absent")
    changes = sorted({c for env_id in REGISTERED for c in _CHANGE_RE.findall(_history(env_id) or "")})
    assert changes
    out = subprocess.run(["git", "log", "--no-walk=unsorted", "--format=%h %ad", "--date=short", "--abbrev=7",
                          *[sha for sha, _ in changes]], cwd=root, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    found = dict(line.split() for line in out.stdout.splitlines())
    for sha, date in changes:
        match = [d for h, d in found.items() if h.startswith(sha) or sha.startswith(h)]
        assert match, f"{sha} is not a commit of this repository"
        assert match[0] == date, f"{sha} is dated {match[0]}, the Version History says {date}"


@pytest.mark.parametrize("old, new", [("GSM8K-v0", "GSM8K-v1"), ("ReasoningGym-v0", "ReasoningGym-v1")])
def test_a_superseded_id_is_refused_naming_the_current_one(old, new):
    """Bumped ids (their Version History says why): the old one is not registered, and Gymnasium's own error names
    the current version instead of silently building the env with the new reward semantics."""
    assert old not in gym.registry and new in gym.registry
    with pytest.raises(gym.error.DeprecatedEnv, match=new):
        gym.make(old)
