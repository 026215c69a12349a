"""Seeding of the process-global random number generators (Python's, NumPy's, torch's).

A module of its own at the bottom of the package (the ``reporting`` / ``models`` layer of
``tests/test_import_graph.py``): the trainer's build (:func:`torchrl_grpo.assembly.build`) and each Ray rollout worker
(:mod:`torchrl_grpo.rollout.ray_workers`) seed the same way from ``seed``.
"""
from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["seed_everything"]


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global RNGs (NumPy's with ``seed mod 2**32``, its accepted range)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
