#!/usr/bin/env python
"""Asynchronous GRPO entry point: ``grpo.py`` with ``mode=async`` (see :mod:`torchrl_grpo.async_trainer`).

Rollouts for the next step are generated while the trainer updates on the current one; a batch is trained at most
``train.max_staleness`` policy versions after the one that generated it (AReaL's staleness bound).

    python grpo-async.py                                          # GSM8K, SmolLM2-135M, staleness 1, cap 2.0
    python grpo-async.py train.max_staleness=2 loss.behaviour_weight_cap=5.0
    python grpo-async.py --config-name grpo_tau2 econfig.domain=mock
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from grpo import run  # noqa: E402  (registers the config schema)
from torchrl_grpo.interrupt import exit_code  # noqa: E402


@hydra.main(version_base="1.3", config_path="configs", config_name="grpo_gsm8k")
def main(cfg: DictConfig) -> None:
    if cfg.mode != "async":
        raise SystemExit(f"grpo-async.py runs mode=async (got mode={cfg.mode}); use grpo.py for sync")
    run(cfg)


if __name__ == "__main__":
    # an override (not an assignment inside main) so that .hydra/config.yaml records mode=async; AReaL's decoupled
    # objective (loss.behaviour_weight_cap, default 2.0 in the schema) applies to every stale batch on its own
    if not any(a.lstrip("+").startswith("mode=") for a in sys.argv[1:]):
        sys.argv.insert(1, "mode=async")
    sys.exit(exit_code(main))  # 130 / 143 after SIGINT / SIGTERM, as grpo.py
