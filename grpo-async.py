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

# Decoupled-PPO truncation c (AReaL, arXiv:2505.24298, Eq. 5). Without it, one step of staleness at a high lr left
# ~80% of tokens clipped against the behaviour policy and learning stalled (tests/test_async_trainer.py).
DEFAULT_BEHAVIOUR_WEIGHT_CAP = 2.0


@hydra.main(version_base="1.3", config_path="configs", config_name="grpo_gsm8k")
def main(cfg: DictConfig) -> None:
    if cfg.mode != "async":
        raise SystemExit(f"grpo-async.py runs mode=async (got mode={cfg.mode}); use grpo.py for sync")
    run(cfg)


if __name__ == "__main__":
    # overrides (not assignments inside main) so that .hydra/config.yaml records them:
    # mode=async, and AReaL's decoupled objective unless the user chose a cap (null turns it off)
    given = lambda key: any(a.lstrip("+").startswith(key + "=") for a in sys.argv[1:])  # noqa: E731
    if not given("mode"):
        sys.argv.insert(1, "mode=async")
    if not given("loss.behaviour_weight_cap"):
        sys.argv.insert(1, f"loss.behaviour_weight_cap={DEFAULT_BEHAVIOUR_WEIGHT_CAP}")
    sys.exit(exit_code(main))  # 130 / 143 after SIGINT / SIGTERM, as grpo.py
