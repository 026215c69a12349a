"""What the entry scripts run: ``grpo.py`` (:func:`run`), ``grpo-async.py`` (:func:`run_async`) and ``sft.py``
(:func:`run_sft`). The root scripts are shims that only hold Hydra's ``@hydra.main`` (its ``config_path`` and the
job name ``grpo`` / ``grpo-async`` / ``sft`` come from the script's own location and name) and call these.

With :mod:`torchrl_grpo.config` and :mod:`torchrl_grpo.assembly`, the only module that reads the config object: it picks
the run (continual, async, sync, SFT, ``eval_only``), the run dir (``output_dir``, else Hydra's), and builds the trainer
with :func:`torchrl_grpo.assembly.build_trainer` under the signal handlers. Every run ends with one line saying what it
learned (:func:`result_line`)::

    result: greedy accuracy 0.195 -> 0.555 (n=200; 95% Wilson [0.146, 0.255] -> [0.486, 0.622]); run dir: outputs/...

Exit codes (:func:`torchrl_grpo.training.interrupt.exit_code`): 130 / 143 after SIGINT / SIGTERM (the last completed
step is checkpointed, ``checkpoint.on_interrupt``).
"""
from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any, Callable

from omegaconf import DictConfig

from torchrl_grpo.config import register_configs
from torchrl_grpo.reporting.headline import continual_headline, headline
from torchrl_grpo.training.interrupt import exit_code, handle_signals

__all__ = ["run", "run_async", "run_sft", "run_trainer", "evaluate_only", "exit_code", "result_line"]

register_configs()  # the structured schema every entry script's Hydra config is checked against
log = logging.getLogger("grpo")


def run_trainer(trainer_cls: type | None, cfg: DictConfig,
                action: Callable[[Any], dict] = lambda trainer: trainer.fit()) -> dict:
    """Build the trainer (:func:`torchrl_grpo.assembly.build_trainer`; ``trainer_cls`` None: the one the config asks
    for, :func:`torchrl_grpo.assembly.trainer_class`) under the signal handlers (SIGINT / SIGTERM -> TrainingInterrupted,
    from model loading to ``close()``), run ``action(trainer)``, always close it (joins an async rollout thread, shuts
    the rollout engine down). The run dir is ``output_dir``, else Hydra's (``outputs/YYYY-MM-DD/HH-MM-SS/``).

    Raises:
        TrainingInterrupted: SIGINT / SIGTERM (after the checkpoint of the last completed step).
        ValueError, FileNotFoundError: a bad config, missing data or model (:func:`torchrl_grpo.assembly.build`).
    """
    from torchrl_grpo.assembly import build_trainer

    run_dir = cfg.output_dir
    if not run_dir:
        from hydra.core.hydra_config import HydraConfig

        run_dir = HydraConfig.get().runtime.output_dir
    with handle_signals():
        trainer = build_trainer(cfg, run_dir, trainer_cls=trainer_cls)
        try:
            result = action(trainer)
        finally:
            trainer.close()
    log.info("done: %s", json.dumps(result, default=str)[:2000])
    if int(os.environ.get("RANK", "0")) == 0:  # torchrun: rank 0 speaks for the run
        log.info("%s", result_line(cfg, result, run_dir))
    return result


def result_line(cfg: DictConfig, result: dict, run_dir: str) -> str:
    """The run's last line (:mod:`torchrl_grpo.reporting.headline`): greedy accuracy (pass^1 on tau2) before ->
    after with n and Wilson 95% intervals, and the run dir. ``result`` is what the run returned: the summary of
    :func:`torchrl_grpo.training.loop.run_loop` (``eval_start`` / ``eval_end``; a run without a final evaluation
    ends on the ``every`` one merged into ``last``), the metrics of ``eval_only``, or a continual run's summary."""
    if cfg.cl.task_order:
        return continual_headline(result, run_dir)
    label = "pass^1 (greedy)" if str(cfg.econfig.env_id).startswith("tau2") else "greedy accuracy"
    if cfg.eval_only:
        return headline(None, result, run_dir, label=label)
    after = result.get("eval_end") or (result.get("last") if "eval/accuracy" in (result.get("last") or {}) else None)
    return headline(result.get("eval_start"), after, run_dir, label=label)


def evaluate_only(trainer, cfg: DictConfig) -> dict:
    """``eval_only=true``: evaluate the loaded weights once (``train.resume_from``'s, else ``actor.path``'s) and log
    the result; nothing is trained. grpo.py and sft.py."""
    if not cfg.train.resume_from:
        log.warning("eval_only without train.resume_from: evaluating the initial weights of %s", cfg.actor.path)
    result = trainer.evaluate()
    trainer.logger.log(result, step=trainer.step)
    return result


def run(cfg: DictConfig) -> dict:
    """``grpo.py``: the trainer the config asks for (:func:`torchrl_grpo.assembly.trainer_class`): continual
    (``cl.task_order``, e.g. ``--config-name grpo_cl``), async (``mode=async``) or sync GRPO; ``eval_only=true``
    evaluates only."""
    if cfg.cl.task_order:  # a continual run: torchrl_grpo.continual.trainer
        return run_trainer(None, cfg, lambda trainer: trainer.train())
    if cfg.eval_only:
        return run_trainer(None, cfg, functools.partial(evaluate_only, cfg=cfg))
    return run_trainer(None, cfg)


def run_async(cfg: DictConfig) -> dict:
    """``grpo-async.py``: exactly ``grpo.py mode=async``.

    Raises:
        SystemExit: the composed config is not ``mode=async`` (``mode=sync``, or a sync config such as
            ``--config-name grpo_tau2``).
    """
    if cfg.mode != "async":
        raise SystemExit(f"grpo-async.py runs mode=async (got mode={cfg.mode}); use grpo.py for sync, or an async "
                         f"config (--config-name <name>_async, e.g. grpo_tau2_async)")
    return run(cfg)


def run_sft(cfg: DictConfig) -> dict:
    """``sft.py``: the SFT recipe (:class:`torchrl_grpo.training.sft_trainer.SFTTrainer`); with ``eval_only=true``
    only the evaluation of ``actor.path`` (e.g. a written ``sft_model``; or ``train.resume_from``'s weights)."""
    from torchrl_grpo.training.sft_trainer import SFTTrainer

    if cfg.eval_only:
        return run_trainer(SFTTrainer, cfg, functools.partial(evaluate_only, cfg=cfg))
    return run_trainer(SFTTrainer, cfg)
