"""Every Gymnasium id the ``envs`` package registers documents the history of what its reward means.

Gymnasium's own envs end their class docstring with ``## Version History``: a few semantic bullets, one per
version (CartPole: ``* v1: Maximum number of steps increased from 200 to 500``, ``* v0: Initial versions
release``), not a commit log. Ours (module docstring of :mod:`envs`): an id's version is bumped whenever its reward
semantics change; its Version History has one bullet per version, oldest first,
``- v<N> (<YYYY-MM-DD>[, <sha>]): <what changed in rewards / observations / actions>`` (continuation lines
indented), the newest bullet's version equal to the id's ``-v<N>`` suffix. The sha is optional (an env arriving in
its own commit cannot name it); when given it must be a commit of this repository.

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
#: ``- v1 (2026-11-23): ...`` or ``- v1 (2026-11-23, ad0c272): ...``: one version's bullet.
_VERSION_RE = re.compile(r"^[ \t]*- v(\d+) \((\d{4}-\d{2}-\d{2})(?:, ([0-9a-f]{7,40}))?\): \S", re.MULTILINE)
#: any line opening a bullet (``-`` or ``*``): each must be a version's bullet
_BULLET_RE = re.compile(r"^[ \t]*[-*] ", re.MULTILINE)
#: lines (bullet + continuation) one version's entry may take: semantic bullets, not a commit log
MAX_LINES_PER_VERSION = 6


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


def _entries(history: str) -> list[tuple[int, str, str, int]]:
    """``(version, date, sha or "", number of non-blank lines)`` per bullet of a Version History body."""
    starts = list(_VERSION_RE.finditer(history))
    out = []
    for k, m in enumerate(starts):
        end = starts[k + 1].start() if k + 1 < len(starts) else len(history)
        lines = [ln for ln in history[m.start():end].splitlines() if ln.strip()]
        out.append((int(m.group(1)), m.group(2), m.group(3) or "", len(lines)))
    return out


@pytest.mark.parametrize("env_id", REGISTERED)
def test_version_history_has_one_dated_bullet_per_version(env_id):
    name, _ = _class_doc(env_id)
    history = _history(env_id)
    assert history is not None, f"{env_id}: {name}'s class docstring has no '## Version History' section"
    version = parse_env_id(env_id)[2]
    assert version is not None, f"{env_id}: a registered id carries a version (-vN)"
    entries = _entries(history)
    bullets = _BULLET_RE.findall(history)
    assert len(bullets) == len(entries), (
        f"{env_id}: every bullet of {name}'s Version History must read '- v<N> (<YYYY-MM-DD>[, <sha>]): <change>' "
        f"(one per version, not one per commit)")
    versions = [v for v, *_ in entries]
    assert versions == list(range(version + 1)), (
        f"{env_id}: {name}'s Version History lists versions {versions}; expected v0..v{version}, oldest first, "
        f"each once (the newest one is the id's -v{version})")
    dates = [datetime.date.fromisoformat(d) for _, d, _, _ in entries]
    assert dates == sorted(dates), f"{env_id}: versions are not dated oldest first: {entries}"
    long = [(v, n) for v, _, _, n in entries if n > MAX_LINES_PER_VERSION]
    assert not long, f"{env_id}: (version, lines) {long}: over {MAX_LINES_PER_VERSION} lines, a commit log?"


def _git_root() -> Path | None:
    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        return None
    return root


def test_version_history_shas_are_commits():
    """Every sha a Version History bullet names (optional) is a commit of this repository."""
    root = _git_root()
    if root is None:
        pytest.skip("not a git checkout")
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=root, capture_output=True,
                             text=True, check=False).stdout.strip()
    if shallow == "true":
        pytest.skip("shallow clone: older commits are absent")
    shas = sorted({sha for env_id in REGISTERED for _, _, sha, _ in _entries(_history(env_id) or "") if sha})
    for sha in shas:
        out = subprocess.run(["git", "cat-file", "-t", sha], cwd=root, capture_output=True, text=True, check=False)
        assert out.stdout.strip() == "commit", f"{sha} is not a commit of this repository"


def test_the_rule_reads_bullets_and_refuses_a_commit_log():
    """The parser on hand-made sections: an optional sha, continuation lines, and a per-commit log refused."""
    good = "\n- v0 (2026-11-22): released.\n- v1 (2026-11-23, ad0c272): no format credit;\n  more words.\n"
    assert [(v, d, s, n) for v, d, s, n in _entries(good)] == [
        (0, "2026-11-22", "", 1), (1, "2026-11-23", "ad0c272", 2)]
    log = "\n* v0: Initial release.\n    - 1ba233d (2026-11-22): released.\n"
    assert _entries(log) == [] and len(_BULLET_RE.findall(log)) == 2


@pytest.mark.parametrize("old, new", [("GSM8K-v0", "GSM8K-v1"), ("ReasoningGym-v0", "ReasoningGym-v1")])
def test_a_superseded_id_is_refused_naming_the_current_one(old, new):
    """Bumped ids (their Version History says why): the old one is not registered, and Gymnasium's own error names
    the current version instead of silently building the env with the new reward semantics."""
    assert old not in gym.registry and new in gym.registry
    with pytest.raises(gym.error.DeprecatedEnv, match=new):
        gym.make(old)
