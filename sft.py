#!/usr/bin/env python
"""Supervised fine-tuning before RL (SFT on gold demonstrations, then RFT rounds): the warm start of a GRPO run.

    python sft.py --config-name sft_tau2 econfig.domain=retail          # SFT on retail's gold actions
    python sft.py --config-name sft_tau2 sft.rft_rounds=2                # ... then 2 rounds of rejection sampling
    python grpo.py --config-name grpo_tau2 actor.path=<run>/sft_model    # GRPO from the fine-tuned model
    python sft.py --config-name sft_tau2 eval_only=true actor.path=<run>/sft_model   # evaluate only

Same config schema as grpo.py (:class:`torchrl_grpo.config.GRPOConfig`, the ``sft`` section); the recipe is
:class:`torchrl_grpo.training.sft_trainer.SFTTrainer`. Outputs: ``metrics.jsonl`` (``sft/*``, ``demo/*``, ``rft/*``, ``eval/*``),
``learning_curve.png`` and ``sft_model/`` (merged weights + tokenizer) under ``outputs/YYYY-MM-DD/HH-MM-SS/``.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from torchrl_grpo.cli import exit_code, run_sft  # noqa: E402  (registers the config schema)

run = run_sft  # the recipe, as callers (tests) name it: torchrl_grpo.cli.run_sft


@hydra.main(version_base="1.3", config_path="configs", config_name="sft_tau2")
def main(cfg: DictConfig) -> None:
    run_sft(cfg)


if __name__ == "__main__":
    sys.exit(exit_code(main))  # 130 / 143 after SIGINT / SIGTERM
