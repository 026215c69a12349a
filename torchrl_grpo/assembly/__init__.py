"""From a run config to what runs: the only layer (with :mod:`torchrl_grpo.config` and :mod:`torchrl_grpo.cli`) that
reads the config object.

- :func:`build` (:mod:`torchrl_grpo.assembly.phases`): config -> :class:`~torchrl_grpo.training.components.Components`;
- :func:`build_trainer` / :func:`trainer_class` (:mod:`torchrl_grpo.assembly.trainers`): the loop the config asks for,
  built on them.
"""
from __future__ import annotations

from torchrl_grpo.assembly.phases import (Components, EnvSide, LoopSettings, autocast_for, build, max_staleness,
                                           resolve_device)
from torchrl_grpo.assembly.trainers import build_trainer, trainer_class

__all__ = ["build", "build_trainer", "trainer_class", "Components", "LoopSettings", "EnvSide", "resolve_device",
           "max_staleness", "autocast_for"]
