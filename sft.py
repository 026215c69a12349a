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

from grpo import evaluate_only, run_trainer  # noqa: E402  (registers the config schema)
from torchrl_grpo.training.interrupt import exit_code  # noqa: E402


def run(cfg: DictConfig) -> dict:
    """The SFT recipe (:meth:`torchrl_grpo.training.sft_trainer.SFTTrainer.fit`); with ``eval_only=true`` only the evaluation of
    ``actor.path`` (e.g. a written ``sft_model``; or ``train.resume_from``'s weights), as in grpo.py."""
    from torchrl_grpo.training.sft_trainer import SFTTrainer

    return run_trainer(SFTTrainer, cfg, evaluate_only if cfg.eval_only else lambda trainer: trainer.fit())


@hydra.main(version_base="1.3", config_path="configs", config_name="sft_tau2")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    sys.exit(exit_code(main))  # 130 / 143 after SIGINT / SIGTERM
