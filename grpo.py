#!/usr/bin/env python
"""GRPO training entry point (sync mode; ``mode=async`` or ``grpo-async.py`` for the async trainer).

    python grpo.py                                   # SmolLM2-135M on Reasoning Gym chain_sum: learns in ~10 CPU min
    python grpo.py --config-name grpo_gsm8k          # GSM8K (grpo_tau2, grpo_ifeval, grpo_cl: the other envs)
    python grpo.py actor.path=Qwen/Qwen2.5-0.5B-Instruct train.steps=200 gconfig.n_samples=8
    python grpo.py --multirun optimizer.lr=1e-5,1e-6
    python grpo.py --config-name grpo_tau2 econfig.domain=telecom
    python grpo.py eval_only=true train.resume_from=outputs/.../checkpoints/step_000004
    python grpo.py --config-name grpo_cl cl.task_order=[airline,retail,telecom] cl.algorithm=replay   # continual

Outputs go to ``outputs/YYYY-MM-DD/HH-MM-SS/`` (``metrics.jsonl``, ``checkpoints/``, ``.hydra/config.yaml``).
Ctrl-C / SIGTERM finish the current step, checkpoint it and exit with 130 / 143 (a second signal stops at once;
see :mod:`torchrl_grpo.training.interrupt`); ``train.resume_from=<run>/checkpoints`` continues.
This file is
a shim: what it runs is :mod:`torchrl_grpo.cli`.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from torchrl_grpo.cli import evaluate_only, exit_code, run, run_trainer  # noqa: E402, F401  (registers the schema)


@hydra.main(version_base="1.3", config_path="configs", config_name="grpo_reasoning")
def main(cfg: DictConfig) -> None:
    run(cfg)  # torchrl_grpo.cli.run


if __name__ == "__main__":
    sys.exit(exit_code(main))  # 130 / 143 after SIGINT / SIGTERM (checkpoint.on_interrupt saves the last step)
