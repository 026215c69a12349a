"""torchrl_grpo: GRPO for LLM agents on TorchRL.

The public API, imported lazily (``import torchrl_grpo`` loads no torch)::

    from torchrl_grpo import GRPOTrainer, AsyncGRPOTrainer, GRPOLoss, GroupCollector, GRPOConfig

The package by folder, lower layers first (imports only point down; ``tests/test_import_graph.py`` enforces it):
``config/`` (schema, choice sets, validation; a leaf), ``reporting/`` and ``model_store/``, ``distributed/``,
``objectives/``, ``backends/``, ``rollout/``, ``training/``, ``continual/``, then ``assembly/`` (config ->
components) and ``cli.py`` (what the entry scripts run). CHANGELOG.md lists the module paths that moved.
"""
from __future__ import annotations

import importlib

#: public name -> module that defines it
_API = {
    "GRPOConfig": "torchrl_grpo.config",
    "GRPOTrainer": "torchrl_grpo.training.grpo_trainer",
    "AsyncGRPOTrainer": "torchrl_grpo.training.async_trainer",
    "SFTTrainer": "torchrl_grpo.training.sft_trainer",
    "ContinualTrainer": "torchrl_grpo.continual.trainer",
    "GRPOLoss": "torchrl_grpo.objectives.loss",
    "GroupCollector": "torchrl_grpo.rollout.collector",
    "GRPOUpdate": "torchrl_grpo.training.update",
}

__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'torchrl_grpo' has no attribute {name!r}")
