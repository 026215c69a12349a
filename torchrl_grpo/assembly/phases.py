"""From a run config to the objects a training loop runs: ``build(cfg, run_dir) -> Components``
(:mod:`torchrl_grpo.assembly.trainers` hands them to the loop: ``build_trainer(cfg, run_dir) -> trainer``).

Config flows one way: config -> the phases of :func:`build` -> components -> the trainer class. The loops
(:mod:`torchrl_grpo.training`) and every layer below this package receive plain values and objects; they never read
a config section. :func:`build` is a list of named phases, each a function of its own module, testable alone:

============================  ==========================================================  =========================
phase                         what                                                        config read
============================  ==========================================================  =========================
devices.setup_devices         device, torchrun group, device plan, this process placed    train, rollout, *_model
records.prepare_run           run dir, plan.json, seeds, data checked, data_sources.json  seed, econfig, *_dataset
policy.build_policy           load (model_source.json), grad. checkpointing, LoRA, KL     actor, loss.kl_coef,
                              reference, dropout off, broadcast                           train.disable_dropout
rollout.sampling_config       the run's one SamplingConfig (every other is a replace)     gconfig
rollout.backend_from_config   the rollout engine (a full copy when needed)                rollout, actor, seed
policy.shard_policy           FSDP2 shards, after the full copies                         (the plan)
env_side.build_env_side       local user, train / eval collectors, task lists             econfig, *_dataset, eval
optimisation.build_optim...   loss, optimizer, LR schedule                                loss, optimizer, train
optimisation.resume           weights, optimizer, schedule, step; backend synced          train.resume_from
rollout.ray_collector         Ray actors replace the train collector (launcher=ray)       rollout, train.device
optimisation.build_update     the GRPOUpdate                                              train, loss, optimizer
make_logger / loop_settings   logger, LoopSettings                                        stats_logger, eval, ...
============================  ==========================================================  =========================

The order of the side effects that matter: seeds before the model loads; data checked before the model loads; the
KL reference copied before dropout is disabled; the full copies (KL reference, rollout engine) before FSDP sharding,
sharding before the optimizer; resume before the Ray workers get the policy's weights and before the update
(optimizer-step count).
"""
from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import OmegaConf

from torchrl_grpo.backends.base import RolloutBackend, SamplingConfig
from torchrl_grpo.assembly.devices import Devices, resolve_device, setup_devices
from torchrl_grpo.assembly.environments import build_env_side
from torchrl_grpo.assembly.optimisation import autocast_for, build_optimisation, build_update, resume
from torchrl_grpo.assembly.policy import build_policy, is_sharded, shard_policy
from torchrl_grpo.assembly.records import prepare_run
from torchrl_grpo.assembly.rollout_side import backend_from_config, ray_collector, sampling_config
from torchrl_grpo.config import validate_config
from torchrl_grpo.distributed.data_parallel import NullLogger
from torchrl_grpo.reporting.stats_logger import StatsLogger
from torchrl_grpo.rollout.env_side import EnvSide
from torchrl_grpo.training.components import Components, LoopSettings

__all__ = ["build", "Components", "LoopSettings", "EnvSide", "resolve_device", "max_staleness", "autocast_for",
           "make_logger", "loop_settings"]

log = logging.getLogger(__name__)


def max_staleness(cfg) -> int:
    """``train.max_staleness`` of an async run: null means 1 (AReaL's one-step-off pipeline). Sync runs never read
    it (:func:`torchrl_grpo.config.validate_config` refuses it there)."""
    return 1 if cfg.train.max_staleness is None else int(cfg.train.max_staleness)


def _check_async(cfg, backend) -> None:
    if backend is not None and getattr(backend, "share_module", False):
        raise ValueError("async mode needs a rollout backend with its own weights (share_module=False)")
    if cfg.loss.behaviour_weight_cap is None and max_staleness(cfg) > 0:
        log.warning("async mode with loss.behaviour_weight_cap=null: stale batches get the untruncated behaviour "
                    "weight pi_prox/pi_behav (high variance); AReaL's cap ~2 is the tested setting")


def make_logger(cfg, run_dir: Path, devices: Devices):
    """Rank 0: the :class:`~torchrl_grpo.reporting.stats_logger.StatsLogger` (``stats_logger.*``; console,
    ``metrics.jsonl``, wandb; resuming with ``train.resume_from``); other ranks: a
    :class:`~torchrl_grpo.distributed.data_parallel.NullLogger`."""
    if not devices.dp.is_main:
        return NullLogger()
    s = cfg.stats_logger
    return StatsLogger(run_dir, OmegaConf.to_container(cfg, resolve=True), wandb_mode=s.wandb.mode,
                       project=s.wandb.project, entity=s.wandb.entity, name=s.wandb.name, console=s.console,
                       resume=bool(cfg.train.resume_from))


def loop_settings(cfg, sampling: SamplingConfig) -> LoopSettings:
    """The plain settings a loop reads: ``train.*``, ``gconfig.n_samples``, ``loss.adv_*``, ``eval.*``,
    ``checkpoint.*``, ``stats_logger.*``; ``max_new_tokens`` from the run's one ``sampling``; the resolved config
    as YAML (stored with every checkpoint)."""
    t, e, c, s = cfg.train, cfg.eval, cfg.checkpoint, cfg.stats_logger
    return LoopSettings(
        steps=t.steps, batch_size=t.batch_size, n_samples=cfg.gconfig.n_samples, seed=cfg.seed,
        adv_scale=cfg.loss.adv_scale, adv_baseline=cfg.loss.adv_baseline,
        filter_zero_variance_groups=cfg.loss.filter_zero_variance_groups, max_new_tokens=sampling.max_new_tokens,
        samples_per_step=s.samples_per_step, eval_every=e.every, eval_at_start=e.at_start, eval_at_end=e.at_end,
        eval_n_problems=e.n_problems, eval_greedy=e.greedy, eval_pass_k=e.pass_k, checkpoint_every=c.every,
        checkpoint_keep_last=c.keep_last, checkpoint_save_final=c.save_final, checkpoint_on_interrupt=c.on_interrupt,
        progress_bar=s.progress_bar, max_staleness=max_staleness(cfg), partial_rollout_chunk=t.partial_rollout_chunk,
        config_yaml=OmegaConf.to_yaml(cfg, resolve=True), final_model=c.final_model,
    )


def build(cfg, run_dir: str | Path, *, model=None, tokenizer=None, backend: RolloutBackend | None = None,
          own_backend_copy: bool = False) -> Components:
    """Build the components of a GRPO run from its config: the phases of the module docstring, in that order.

    Args:
        cfg: the config (an OmegaConf node of :class:`torchrl_grpo.config.GRPOConfig`).
        run_dir: output directory (``metrics.jsonl``, ``samples.jsonl``, ``checkpoints/``); created.
        model / tokenizer: optional preloaded policy (tests, notebooks); otherwise loaded from ``actor.path``.
        backend: optional rollout backend; otherwise built from ``rollout.backend``.
        own_backend_copy: the rollout engine must not share the training module (async mode): the transformers
            backend gets a merged copy; a given backend must have ``share_module=False``.

    Raises:
        ValueError: bad config values, a preloaded model without its tokenizer, an empty train split, a malformed
            GSM8K row (``file:line``; the data is checked before the model loads, see
            :func:`torchrl_grpo.assembly.environments.check_data`).
        FileNotFoundError: missing data or checkpoint.
    """
    validate_config(cfg)
    if own_backend_copy:
        _check_async(cfg, backend)
    devices = setup_devices(cfg)
    run_dir = prepare_run(cfg, run_dir, devices)
    policy = build_policy(cfg, devices, run_dir, model=model, tokenizer=tokenizer)
    sampling = sampling_config(cfg)
    # async, inference on another GPU, or FSDP: the rollout engine needs full weights, the trainer holds shards
    own_copy = own_backend_copy or devices.placement.own_inference_copy or is_sharded(devices)
    backend = backend or backend_from_config(
        cfg, policy.model, policy.tokenizer, own_copy=own_copy,
        device=devices.placement.inference_device if devices.placement.own_inference_copy else None)
    policy = shard_policy(policy, devices)  # after the full copies (KL reference, rollout engine) are taken
    side = build_env_side(cfg, backend, policy.tokenizer, sampling)
    opt = build_optimisation(cfg, policy.model, devices.device, sampling)
    start_step, optimizer_steps = resume(cfg, policy.model, opt, backend)
    if cfg.rollout.launcher == "ray":  # rollout on Ray actors, each with its own backend and envs
        side.collector.close()
        side.collector = ray_collector(cfg, sampling, local_backend=backend)
        if start_step or cfg.actor.peft.enable:  # the actors loaded actor.path: give them the policy's weights
            side.collector.update_policy_weights_(policy.model)
    update = build_update(cfg, policy, opt, devices, backend, optimizer_steps)
    return Components(
        model=policy.model, tokenizer=policy.tokenizer, backend=backend, sampling=sampling, env_side=side,
        loss_fn=opt.loss_fn, optimizer=opt.optimizer, scheduler=opt.scheduler, update=update,
        logger=make_logger(cfg, run_dir, devices), device=devices.device,
        settings=loop_settings(cfg, sampling), run_dir=run_dir, start_step=start_step,
        load_time_s=policy.load_time_s, dp=devices.dp, plan=devices.plan, placement=devices.placement,
    )
