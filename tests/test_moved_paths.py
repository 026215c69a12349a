"""The one-release aliases of the old flat module paths (:mod:`torchrl_grpo._moved`)."""
from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings

import pytest

from torchrl_grpo import _moved


def test_an_old_path_is_the_new_module_with_its_own_spec():
    sys.modules.pop("torchrl_grpo.advantage", None)
    with pytest.warns(DeprecationWarning, match="torchrl_grpo.objectives.advantage"):
        old = importlib.import_module("torchrl_grpo.advantage")
    new = importlib.import_module("torchrl_grpo.objectives.advantage")
    assert old is new and new.__spec__.name == "torchrl_grpo.objectives.advantage"


def test_interleaved_alias_imports_keep_each_modules_spec():
    """Two threads importing two old paths at once: the import system may run create_module of both before
    exec_module of either (each old name has its own import lock). The finder kept the new module's spec in one
    attribute between the two calls, so the first module got the second's spec (``__spec__.name`` of another module:
    reload and pickling by spec break). Forced interleaving here, no threads or timing."""
    finder = _moved._Alias()
    names = ["torchrl_grpo.loss", "torchrl_grpo.collector"]
    specs = [importlib.util.spec_from_loader(n, finder) for n in names]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        modules = [finder.create_module(s) for s in specs]  # both created ...
        for m in reversed(modules):  # ... then executed in the other order
            m.__spec__ = specs[modules.index(m)]  # what the import system does between the two calls
            finder.exec_module(m)
    assert [m.__spec__.name for m in modules] == ["torchrl_grpo.objectives.loss", "torchrl_grpo.rollout.collector"]
