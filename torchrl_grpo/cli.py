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

__all__ = ["run", "run_async", "run_sft", "run_sft_then_grpo", "run_trainer", "evaluate_only", "exit_code", "result_line"]

register_configs()  # the structured schema every entry script's Hydra config is checked against
log = logging.getLogger("grpo")


def run_trainer(trainer_cls: type | None, cfg: DictConfig,
                action: Callable[[Any], dict] = lambda trainer: trainer.fit(), *, report: bool = True) -> dict:
    """Build the trainer (:func:`torchrl_grpo.assembly.build_trainer`; ``trainer_cls`` None: the one the config asks
    for, :func:`torchrl_grpo.assembly.trainer_class`) under the signal handlers (SIGINT / SIGTERM -> TrainingInterrupted,
    from model loading to ``close()``), run ``action(trainer)``, always close it (joins an async rollout thread, shuts
    the rollout engine down). The run dir is ``output_dir``, else Hydra's (``outputs/YYYY-MM-DD/HH-MM-SS/``).
    ``report``: log the run's last line (:func:`result_line`); a phase of a longer run (:func:`run_sft_then_grpo`)
    leaves it to the whole run.

    Raises:
        TrainingInterrupted: SIGINT / SIGTERM (after the checkpoint of the last completed step).
        ValueError, FileNotFoundError: a bad config, missing data or model (:func:`torchrl_grpo.assembly.build`).
    """
    from torchrl_grpo.assembly import build_trainer

    run_dir = _run_dir(cfg)
    with handle_signals():
        trainer = build_trainer(cfg, run_dir, trainer_cls=trainer_cls)
        try:
            result = action(trainer)
        finally:
            trainer.close()
    log.info("done: %s", json.dumps(result, default=str)[:2000])
    if report and int(os.environ.get("RANK", "0")) == 0:  # torchrun: rank 0 speaks for the run
        log.info("%s", result_line(cfg, result, run_dir))
    return result


def _run_dir(cfg: DictConfig) -> str:
    """``output_dir``, else Hydra's run dir."""
    if cfg.output_dir:
        return str(cfg.output_dir)
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir


def _phase_config(cfg: DictConfig, **updates: Any) -> DictConfig:
    """A copy of ``cfg`` with dotted keys set (the schema's keys only: a typo raises)."""
    from omegaconf import OmegaConf

    out = cfg.copy()
    for key, value in updates.items():
        OmegaConf.update(out, key, value, merge=False)
    return out


def run_sft_then_grpo(cfg: DictConfig) -> dict:
    """``grpo.py`` with ``sft.before_grpo=true`` (``--config-name grpo_tau2_mock``): a supervised warm start, then
    GRPO from it, in one run dir.

    1. SFT (:class:`torchrl_grpo.training.sft_trainer.SFTTrainer`) in ``<run_dir>/sft``: ``sft.epochs`` over the
       gold demonstrations of the first ``sft.limit`` train tasks at ``sft.lr`` (null: ``optimizer.lr``; the whole
       split's first tasks: ``train_dataset.start`` / ``max_intents`` select the GRPO phase's tasks only), after
       scoring the base model on the first ``sft.base_eval_problems`` valid tasks (0: not scored); writes
       ``<run_dir>/sft/sft_model``.
    2. GRPO (the trainer the config asks for) from ``<run_dir>/sft/sft_model`` in ``<run_dir>``, evaluated on the
       first ``eval.n_problems`` valid tasks at its start (the SFT model) and end (``eval.at_start`` /
       ``eval.at_end``): ``<run_dir>/eval_episodes.jsonl`` (the base model's rows: ``<run_dir>/sft/``).
    3. ``<run_dir>/learning_curve.png`` (the three scores against wall time, Wilson 95% bars), ``warm_start.json``
       (the three evaluations and the phases' wall seconds) and the last line
       (:func:`torchrl_grpo.reporting.headline.warm_start_headline`)::

           result: pass^1 base B (n=50) -> SFT S -> GRPO G (n=200; 95% Wilson [..] -> [..]); run dir: ...

    Returns:
        ``{"base": metrics | None, "sft": ..., "grpo": ..., "sft_phase": <SFT summary>, "grpo_phase": <GRPO summary>,
        "wall_s": {...}}``.

    Raises:
        ValueError: what :func:`run_trainer` raises for either phase's config.
    """
    import time

    from torchrl_grpo.reporting.headline import plot_warm_start, warm_start_headline
    from torchrl_grpo.training.sft_trainer import SFTTrainer

    run_dir = _run_dir(cfg)
    sft_dir = os.path.join(run_dir, "sft")
    s = cfg.sft
    t0 = time.perf_counter()
    sft_cfg = _phase_config(
        cfg, output_dir=sft_dir, **{
            "eval.at_start": s.base_eval_problems > 0, "eval.at_end": False, "eval.every": 0,
            "eval.n_problems": s.base_eval_problems or cfg.eval.n_problems, "sft.save_model": True,
            "train_dataset.limit": s.limit if s.limit is not None else cfg.train_dataset.limit,
            "train_dataset.start": 0, "train_dataset.max_intents": None,
            "optimizer.lr": s.lr if s.lr is not None else cfg.optimizer.lr,
            "checkpoint.every": 0, "checkpoint.save_final": False})
    log.info("sft.before_grpo: SFT phase in %s, then GRPO from %s/sft_model", sft_dir, sft_dir)
    sft_summary = run_trainer(SFTTrainer, sft_cfg, report=False)
    t_sft = time.perf_counter() - t0
    grpo_cfg = _phase_config(cfg, output_dir=run_dir, **{"actor.path": os.path.join(sft_dir, "sft_model")})
    grpo_summary = run_trainer(None, grpo_cfg, report=False)
    t_all = time.perf_counter() - t0
    base, sft_m = sft_summary.get("eval_start"), grpo_summary.get("eval_start")
    grpo_m = _final_evaluation(grpo_summary)
    out = {"base": base, "sft": sft_m, "grpo": grpo_m, "sft_phase": sft_summary, "grpo_phase": grpo_summary,
           "wall_s": {"sft_phase": t_sft, "grpo_phase": t_all - t_sft, "total": t_all}}
    try:
        with open(os.path.join(run_dir, "warm_start.json"), "w") as f:
            json.dump({k: out[k] for k in ("base", "sft", "grpo", "wall_s")}, f, indent=1, default=str)
        plot_warm_start([("base", 0.0, base), ("SFT (GRPO start)", t_sft / 60, sft_m), ("GRPO", t_all / 60, grpo_m)],
                        os.path.join(run_dir, "learning_curve.png"),
                        title=f"{cfg.econfig.env_id}/{cfg.econfig.domain} {cfg.valid_dataset.split}: base -> SFT -> GRPO")
    except OSError as e:  # a full disk must not hide the result
        log.warning("could not write warm_start.json / learning_curve.png: %s", e)
    if int(os.environ.get("RANK", "0")) == 0:
        log.info("%s", warm_start_headline(base, sft_m, grpo_m, run_dir))
    return out


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
    return headline(result.get("eval_start"), _final_evaluation(result), run_dir, label=label)


def _final_evaluation(summary: dict) -> dict | None:
    """A run's last evaluation: ``eval_end``, else the ``every`` one merged into ``last``, else None."""
    last = summary.get("last") or {}
    return summary.get("eval_end") or (last if "eval/accuracy" in last else None)


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
    if cfg.sft.before_grpo:  # SFT warm start, then GRPO from it (configs/grpo_tau2_mock.yaml)
        return run_sft_then_grpo(cfg)
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
