#!/usr/bin/env python
"""Supervised fine-tuning before RL (SFT on gold demonstrations, then RFT rounds): the warm start of a GRPO run.

    python sft.py --config-name sft_tau2 econfig.domain=retail          # SFT on retail's gold actions
    python sft.py --config-name sft_tau2 sft.rft_rounds=2                # ... then 2 rounds of rejection sampling
    python grpo.py --config-name grpo_tau2 actor.path=<run>/sft_model    # GRPO from the fine-tuned model

Same config schema as grpo.py (:class:`torchrl_grpo.config.GRPOConfig`, the ``sft`` section); the recipe is
:class:`torchrl_grpo.sft.SFTTrainer`. Outputs: ``metrics.jsonl`` (``sft/*``, ``demo/*``, ``rft/*``, ``eval/*``),
``learning_curve.png`` and ``sft_model/`` (merged weights + tokenizer) under ``outputs/YYYY-MM-DD/HH-MM-SS/``.
"""
from __future__ import annotations

import json
import logging
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from torchrl_grpo.config import register_configs  # noqa: E402
from torchrl_grpo.interrupt import exit_code, handle_signals  # noqa: E402

register_configs()
log = logging.getLogger("sft")


def run(cfg: DictConfig) -> dict:
    from torchrl_grpo.sft import SFTTrainer

    run_dir = cfg.output_dir or HydraConfig.get().runtime.output_dir
    with handle_signals():
        trainer = SFTTrainer(cfg, run_dir)
        try:
            result = trainer.fit()
        finally:
            trainer.close()
    log.info("done: %s", json.dumps(result, default=str)[:2000])
    return result


@hydra.main(version_base="1.3", config_path="configs", config_name="sft_tau2")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    sys.exit(exit_code(main))  # 130 / 143 after SIGINT / SIGTERM
