"""Installing beside what users have (issue 45): pyproject.toml declares ranges (no ``==``), so ``pip install -e .``
keeps a torch the user already has; CI's exact versions live in constraints/ci.txt, which .ci/run and the README's
install line pass with ``-c``."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (CI's)

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints" / "ci.txt"


def _freeze_direct():
    spec = importlib.util.spec_from_file_location("freeze_direct", ROOT / "constraints" / "freeze_direct.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, ver = line.partition("==")
            assert sep and ver and not re.search(r"[<>!~,;\s]", ver), f"not an exact pin: {line!r}"
            pins[name.lower().replace("_", "-")] = ver
    return pins


def test_library_requirements_are_ranges_not_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + [r for items in project["optional-dependencies"].values() for r in items]
    pinned = [r for r in reqs if "==" in r or "===" in r]
    assert not pinned, f"exact pins belong in constraints/ci.txt, not pyproject.toml: {pinned}"
    torch = next(r for r in project["dependencies"] if re.match(r"torch\b(?!rl)", r))
    assert torch.startswith("torch>="), torch  # a lower bound only: any newer build the user has is kept


def test_every_package_pyproject_names_is_pinned_for_ci():
    pins, named = _pins(), _freeze_direct().named_packages()
    assert "torch" in named and "vllm" not in named  # vLLM extras live in their own venv
    missing = [n for n in named if n not in pins]
    assert not missing, f"constraints/ci.txt lacks {missing}: python constraints/freeze_direct.py > constraints/ci.txt"
    assert pins["torch"] == "2.13.0"  # no local label: the CPU and the CUDA build both satisfy it


def test_ci_and_the_readme_install_with_the_constraints():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r'pip install [^\n]*-e "\.\[dev\]" -c constraints/ci\.txt', ci), "CI installs without them"
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[dev]" -c constraints/ci.txt' in readme
