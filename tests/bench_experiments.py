"""Load the experiment drivers of ``benchmarks/experiments/`` in tests the way their command line does.

``python benchmarks/experiments/<driver>.py`` has its own folder first on ``sys.path``, so a driver imports its
siblings as ``from harness import ...`` / ``from stats import ...``. Tests load the siblings once under those names
(``sys.modules``), then the driver, without editing ``sys.path``.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXPERIMENTS = Path(__file__).resolve().parents[1] / "benchmarks" / "experiments"
#: the drivers' shared modules, in import order (harness and stats import nothing of each other)
SHARED = ("stats", "harness")


def _exec(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # before exec: dataclasses / pickling look the module up by name
    spec.loader.exec_module(mod)
    return mod


def load(name: str) -> ModuleType:
    """``benchmarks/experiments/<name>.py`` as a module (its shared siblings loaded first, each once)."""
    for dep in SHARED:
        if dep not in sys.modules or not str(getattr(sys.modules[dep], "__file__", "")).startswith(str(EXPERIMENTS)):
            _exec(dep)
    return sys.modules[name] if name in SHARED else _exec(name)
