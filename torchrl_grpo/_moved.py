"""Old import paths, kept one release (issue 27): the flat modules of ``torchrl_grpo`` before the subpackages.

``import torchrl_grpo.trainer`` (or ``from torchrl_grpo.trainer import GRPOTrainer``) still works: a meta-path finder
installed by ``torchrl_grpo/__init__.py`` serves each old name below as the *same module object* as its new home
(so ``monkeypatch.setattr("torchrl_grpo.trainer.x", ...)`` patches the real module), with a ``DeprecationWarning``.
Three old names became packages: ``torchrl_grpo.config`` re-exports its schema; ``torchrl_grpo.distributed`` and
``torchrl_grpo.continual`` forward a missing attribute to their old module's new home (:func:`forward`).

This is the one place the old paths are listed; they go in the next release.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

#: old module (under torchrl_grpo) -> new module (under torchrl_grpo)
MOVED = {
    "stats_logger": "reporting.stats_logger", "learning_curve": "reporting.learning_curve",
    "allocation": "distributed.device_plan", "placement": "distributed.placement",
    "advantage": "objectives.advantage", "sampling": "objectives.sampling", "shared_prefix": "objectives.shared_prefix",
    "log_probs": "objectives.log_probs", "loss": "objectives.loss",
    "weight_sync": "backends.weight_sync",
    "chat_tokens": "rollout.chat_tokens", "collector": "rollout.collector", "episode_stats": "rollout.episode_stats",
    "evaluation": "rollout.evaluation", "local_user": "rollout.local_user", "demonstrations": "rollout.demonstrations",
    "env_factory": "rollout.env_side", "ray_rollout": "rollout.ray_workers",
    "update": "training.update", "micro_batch": "training.micro_batch", "dropout": "training.dropout",
    "checkpoint": "training.checkpoint", "interrupt": "training.interrupt", "trainer": "training.grpo_trainer",
    "async_trainer": "training.async_trainer", "sft": "training.sft_trainer",
    "continual_trainer": "continual.trainer", "cl_algorithms": "continual.algorithms", "cl_domains": "continual.domains",
    "trajectory_buffer": "continual.trajectory_buffer",
}
#: old modules whose name is now a package: the package forwards missing attributes to this module
PACKAGE_FORWARD = {"distributed": "distributed.data_parallel", "continual": "continual.transfer"}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``torchrl_grpo.<old>`` as the new module itself (one object, two names in ``sys.modules``).

    The new module's own spec is kept per module name between ``create_module`` and ``exec_module`` (the import
    system overwrites ``__spec__`` in between): two threads importing two old paths at once each get their own."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, fullname, path=None, target=None):
        head, _, leaf = fullname.partition(".")
        if head == "torchrl_grpo" and leaf in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = "torchrl_grpo." + MOVED[spec.name.partition(".")[2]]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes in the next release", DeprecationWarning,
                      stacklevel=2)
        module = importlib.import_module(new)
        self._specs[module.__name__] = module.__spec__  # the import system overwrites __spec__: put it back below
        return module

    def exec_module(self, module):
        spec = self._specs.pop(module.__name__, None)  # already executed under its new name: only its spec returns
        if spec is not None:
            module.__spec__ = spec


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())


def forward(package: str):
    """A module ``__getattr__`` for ``package`` (``torchrl_grpo.distributed`` / ``.continual``): an attribute the
    package lacks is looked up in the old module's new home, with a ``DeprecationWarning``.

    Raises:
        AttributeError: neither the package nor that module has it.
    """
    target = "torchrl_grpo." + PACKAGE_FORWARD[package.partition(".")[2]]

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        mod = importlib.import_module(target)
        try:
            value = getattr(mod, name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        warnings.warn(f"{package}.{name} moved to {target}.{name}; the old path goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return value

    return __getattr__
