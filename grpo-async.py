#!/usr/bin/env python
"""Asynchronous GRPO entry point: exactly ``grpo.py mode=async`` (see :mod:`torchrl_grpo.training.async_trainer`).

Rollouts for the next step are generated while the trainer updates on the current one; a batch is trained at most
``train.max_staleness`` policy versions after the one that generated it (AReaL's staleness bound).

The primary configs are ``configs/<name>_async.yaml``: ``configs/<name>.yaml`` with the ``mode`` group set to
``async`` (``configs/mode/async.yaml``), so the composed config, ``.hydra/config.yaml`` and Hydra's recorded choices
are those of ``grpo.py --config-name <name> mode=async``; the command line is passed to Hydra untouched.

    python grpo-async.py                               # Reasoning Gym chain_sum, SmolLM2-135M, staleness 1, cap 2.0
    python grpo-async.py train.max_staleness=2 loss.behaviour_weight_cap=5.0
    python grpo-async.py --config-name grpo_tau2_async econfig.domain=mock

Raises:
    SystemExit: the composed config is not ``mode=async`` (``mode=sync``, or a sync config such as
        ``--config-name grpo_tau2``): use ``grpo.py`` for sync, or the ``_async`` config.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from torchrl_grpo.cli import exit_code, run_async  # noqa: E402  (registers the config schema)


@hydra.main(version_base="1.3", config_path="configs", config_name="grpo_reasoning_async")
def main(cfg: DictConfig) -> None:
    run_async(cfg)  # torchrl_grpo.cli.run_async


if __name__ == "__main__":
    sys.exit(exit_code(main))  # 130 / 143 after SIGINT / SIGTERM, as grpo.py
