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
from torchrl_grpo.training.interrupt import exit_code, handle_signals  # noqa: E402

register_configs()
log = logging.getLogger("grpo")


def run_trainer(trainer_cls, cfg: DictConfig, action=lambda trainer: trainer.fit()) -> dict:
    """Build the trainer (:func:`torchrl_grpo.build.build_trainer`; ``trainer_cls`` None: the one the config asks
    for, :func:`torchrl_grpo.build.trainer_class`) under the signal handlers (SIGINT / SIGTERM -> TrainingInterrupted,
    from model loading to ``close()``), run ``action(trainer)``, always close it (joins an async rollout thread, shuts
    the rollout engine down). Also the body of ``sft.py``."""
    from torchrl_grpo.build import build_trainer

    run_dir = cfg.output_dir or HydraConfig.get().runtime.output_dir
    with handle_signals():
        trainer = build_trainer(cfg, run_dir, trainer_cls=trainer_cls)
        try:
            result = action(trainer)
        finally:
            trainer.close()
    log.info("done: %s", json.dumps(result, default=str)[:2000])
    return result


def evaluate_only(trainer) -> dict:
    """``eval_only=true``: evaluate the loaded weights once (``train.resume_from``'s, else ``actor.path``'s) and log
    the result; nothing is trained. grpo.py and sft.py."""
    if not trainer.cfg.train.resume_from:
        log.warning("eval_only without train.resume_from: evaluating the initial weights of %s",
                    trainer.cfg.actor.path)
    result = trainer.evaluate()
    trainer.logger.log(result, step=trainer.step)
    return result


def run(cfg: DictConfig) -> dict:
    """The trainer the config asks for (:func:`torchrl_grpo.build.trainer_class`): continual (``cl.task_order``, e.g.
    ``--config-name grpo_cl``), async (``mode=async``) or sync GRPO."""
    if cfg.cl.task_order:  # a continual run: torchrl_grpo.continual.trainer
        return run_trainer(None, cfg, lambda trainer: trainer.train())
    return run_trainer(None, cfg, evaluate_only if cfg.eval_only else lambda trainer: trainer.fit())


@hydra.main(version_base="1.3", config_path="configs", config_name="grpo_reasoning")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    sys.exit(exit_code(main))  # 130 / 143 after SIGINT / SIGTERM (checkpoint.on_interrupt saves the last step)
