"""From a run config to the objects a training loop runs: ``build(cfg, run_dir) -> Components``
(:mod:`torchrl_grpo.build.trainers` hands them to the loop: ``build_trainer(cfg, run_dir) -> trainer``).

Config flows one way, down this module: config -> :func:`build` -> components -> the trainer class
:func:`build_trainer` picks (:func:`trainer_class`). The loop (:mod:`torchrl_grpo.training.grpo_trainer`,
:mod:`torchrl_grpo.training.async_trainer`) receives what is built here and never reads a config section; everything
that knows about peft, vLLM, the concrete backends, env ids or the logger's settings lives here or below
(:func:`torchrl_grpo.backends.factory.backend_from_config`, :func:`torchrl_grpo.rollout.env_side.build_env_side`).

What :func:`build` makes, in order:

1. seeds (``seed``), the device (``train.device``);
2. the policy and its tokenizer (``actor.path``, unless given), gradient checkpointing, LoRA (peft, ``actor.peft``),
   dropout off (``train.disable_dropout``);
3. the KL reference (``loss.kl_coef > 0``): a frozen copy of the initial policy (on the plan's ref device), or with
   LoRA the same model with its adapter switched off — either way a context yielding the module to score with;
4. the rollout backend (``rollout.backend``: transformers colocated, or a copy with ``own_backend_copy`` or when the
   plan puts inference on another device; vLLM) — the plan's placement: :mod:`torchrl_grpo.distributed.placement`;
5. the env side (:func:`torchrl_grpo.rollout.env_side.build_env_side`, once per env config): the optional local LLM user, the train and eval
   collectors, the train task list and the eval task/baseline
   functions (the env decides which tasks are usable and what "doing nothing" is);
6. the loss, the optimizer (fused AdamW) and the LR schedule over trainer steps (:mod:`torchrl_grpo.training.optimizer`),
   the update (:mod:`torchrl_grpo.training.update`);
7. resume (``train.resume_from``: weights, optimizer, schedule, step; the backend synced to them) and the logger.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable

import torch
from omegaconf import OmegaConf

from torchrl_grpo.backends.base import RolloutBackend, SamplingConfig
from torchrl_grpo.backends.factory import backend_from_config
from torchrl_grpo.config import validate_config
from torchrl_grpo.rollout.env_side import EnvSide, build_env_side
from torchrl_grpo.seeding import seed_everything
from torchrl_grpo.training.components import Components, LoopSettings
from torchrl_grpo.training.optimizer import make_optimizer, make_scheduler
from torchrl_grpo.training.update import GRPOUpdate

__all__ = ["build", "Components", "LoopSettings", "EnvSide", "resolve_device", "max_staleness", "autocast_for"]
# seed_everything, make_scheduler and build_env_side, used here, are defined in torchrl_grpo.seeding,
# torchrl_grpo.training.optimizer and torchrl_grpo.rollout.env_side; the choice sets in torchrl_grpo.config.choices

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` (:data:`~torchrl_grpo.config.choices.DEVICES`) -> a device. Raises ValueError:
    ``cuda`` without a CUDA device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device=cuda but no CUDA device is available")
    return torch.device(name)


def autocast_for(device: torch.device) -> Callable[[], Any]:
    """The forward passes' autocast context factory: bf16 on CUDA, none elsewhere."""
    if device.type == "cuda":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext


def _reference(model: torch.nn.Module, peft: bool, placement=None) -> Callable[[], Any]:
    """The frozen KL reference as a context factory yielding the module to score with. With a
    :class:`~torchrl_grpo.distributed.placement.Placement` (full fine-tuning): the copy lives on ``placement.ref_device``, and on
    a disjoint CPU plan the scoring thread moves to the ref cores inside the context (:mod:`torchrl_grpo.distributed.placement`)."""
    if peft:  # LoRA: the reference is the base model, i.e. the adapter switched off

        @contextmanager
        def base_model():
            with model.disable_adapter():
                yield model

        return base_model
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    if placement is None or ("ref" not in placement.cores and placement.ref_device == placement.train_device):
        return lambda: nullcontext(ref)  # colocated: as before
    ref.to(placement.ref_device)

    @contextmanager
    def placed():
        with placement.on_cores("ref"):
            yield ref

    return placed


def _data_parallel_and_plan(cfg, device: torch.device):
    """Join the torchrun group (``train.strategy``, :mod:`torchrl_grpo.distributed.data_parallel`) and resolve the device plan
    (:mod:`torchrl_grpo.distributed.device_plan`) on the devices present; rank 0 logs it.

    Raises:
        AllocationError (a ValueError): a plan that does not fit the devices or the launch.
        ValueError: ``ddp``/``fsdp`` outside torchrun, or fewer tasks per step than ranks.
    """
    from torchrl_grpo.distributed.device_plan import detect_devices, resolve_plan, train_strategy
    from torchrl_grpo.distributed.data_parallel import init_data_parallel, is_data_parallel

    workers = cfg.rollout.num_workers if cfg.rollout.launcher == "ray" else 0
    strategy = train_strategy(cfg)  # train.strategy, or the training engine allocation_mode names
    world = int(os.environ.get("WORLD_SIZE", "1")) if is_data_parallel(strategy) else 1
    plan = resolve_plan(cfg, detect_devices(device.type), world_size=world, rollout_workers=workers,
                        train_engine=strategy, inference_engine=cfg.rollout.backend)
    dp = init_data_parallel(strategy, device.type)
    if dp.world_size > cfg.train.batch_size:
        raise ValueError(f"train.batch_size={cfg.train.batch_size} tasks cannot give each of {dp.world_size} ranks "
                         f"a whole group: raise train.batch_size to >= {dp.world_size}")
    if dp.is_main:
        log.info("%s", plan.describe())
    return dp, plan


def _rank_run_dir(dp, run_dir) -> Path:
    """Rank 0's run dir on rank 0; a throwaway dir on other ranks (whatever they would write, e.g. the data and
    model sources, stays out of the run's files; their checkpoints and metrics are not written at all)."""
    if dp.is_main:
        return Path(run_dir)
    import tempfile

    return Path(tempfile.mkdtemp(prefix=f"grpo-rank{dp.rank}-"))


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


def build(cfg, run_dir: str | Path, *, model=None, tokenizer=None, backend: RolloutBackend | None = None,
          own_backend_copy: bool = False) -> Components:
    """Build the components of a GRPO run from its config (see the module docstring for what and in which order).

    Args:
        cfg: the config (an OmegaConf node of :class:`torchrl_grpo.config.GRPOConfig`).
        run_dir: output directory (``metrics.jsonl``, ``samples.jsonl``, ``checkpoints/``); created.
        model / tokenizer: optional preloaded policy (tests, notebooks); otherwise loaded from ``actor.path``.
        backend: optional rollout backend; otherwise built from ``rollout.backend``.
        own_backend_copy: the rollout engine must not share the training module (async mode): the transformers
            backend gets a merged copy; a given backend must have ``share_module=False``.

    Raises:
        ValueError: bad config values, a preloaded model without its tokenizer, an empty train split, a malformed
            GSM8K row (``file:line``; the data is checked before the model loads, see ``env_factory.check_data``).
        FileNotFoundError: missing data or checkpoint.
    """
    from torchrl_grpo.training.checkpoint import load_checkpoint
    from torchrl_grpo.training.dropout import disable_dropout
    from torchrl_grpo.objectives.loss import GRPOLoss
    from torchrl_grpo.models import load_model_and_tokenizer
    from torchrl_grpo.reporting.stats_logger import StatsLogger

    validate_config(cfg)
    if own_backend_copy:
        _check_async(cfg, backend)
    device = resolve_device(cfg.train.device)
    dp, plan = _data_parallel_and_plan(cfg, device)
    if device.type == "cuda":  # this rank's device in the plan (cuda:0 by default; cuda:LOCAL_RANK under torchrun)
        device = torch.device(plan.train_device(dp.local_rank))
    from torchrl_grpo.distributed.placement import placement_for  # where this process puts the ref copy, the rollout engine, its threads

    placement = placement_for(plan, device=device, rank=dp.local_rank, peft=cfg.actor.peft.enable,
                              kl_coef=cfg.loss.kl_coef, backend=cfg.rollout.backend, launcher=cfg.rollout.launcher)
    run_dir = _rank_run_dir(dp, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if dp.is_main:
        (run_dir / "plan.json").write_text(json.dumps({**plan.to_dict(), "applied": placement.to_dict()},
                                                      indent=1) + "\n")
    seed_everything(cfg.seed)
    from torchrl_grpo.rollout.env_side import check_data  # the data is checked before the model loads: a bad path fails in a second

    sources = check_data(cfg)
    if sources:  # .hydra/config.yaml keeps the unresolved path (null = $GSM8K_DATA_DIR, else the packaged copy)
        (run_dir / "data_sources.json").write_text(json.dumps(sources, indent=1) + "\n")
    t0 = time.perf_counter()
    if model is None:
        model, tokenizer = load_model_and_tokenizer(cfg.actor.path, dtype=cfg.actor.dtype, device=device)
        from torchrl_grpo.models import resolve_model_path  # cached by now: records what actor.path resolved to

        src = resolve_model_path(cfg.actor.path)
        (run_dir / "model_source.json").write_text(json.dumps(
            {"spec": src.spec, "kind": src.kind, "path": src.path, "gguf_file": src.gguf_file}, indent=1) + "\n")
    elif tokenizer is None:
        raise ValueError("a preloaded model needs its tokenizer")
    load_time_s = time.perf_counter() - t0
    max_pos = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(max_pos, int) and cfg.rollout.max_context_tokens > max_pos:
        log.warning("rollout.max_context_tokens=%d exceeds the trained context of %s (%d positions): longer "
                    "episodes run on extrapolated positions (RoPE) or fail (absolute positions); lower it or pick "
                    "a longer-context model", cfg.rollout.max_context_tokens, cfg.actor.path, max_pos)
    model.to(device)
    if cfg.actor.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if cfg.actor.peft.enable:
        from peft import LoraConfig, get_peft_model

        p = cfg.actor.peft
        target = p.target_modules if isinstance(p.target_modules, str) else list(p.target_modules)
        model = get_peft_model(model, LoraConfig(r=p.r, lora_alpha=p.lora_alpha, lora_dropout=p.lora_dropout,
                                                 target_modules=target, task_type="CAUSAL_LM"))
    reference = None
    if cfg.loss.kl_coef > 0:  # the copy is taken before dropout is disabled, as the policy was at start
        reference = _reference(model, peft=cfg.actor.peft.enable, placement=placement)
    if cfg.train.disable_dropout:  # see torchrl_grpo/training/dropout.py: dropout alone moved on-policy ratios to 1.14
        disable_dropout(model)
    dp.broadcast_module(model)  # every rank starts from rank 0's weights (LoRA's random init included)
    sharded = plan.placements["train"].engine == "fsdp"  # FSDP2 (torchrl_grpo/distributed/data_parallel.py)
    # async, inference on another GPU, or FSDP: the rollout engine needs full weights, the trainer holds shards
    own_copy = own_backend_copy or placement.own_inference_copy or sharded
    backend = backend or backend_from_config(cfg, model, tokenizer, own_copy=own_copy,
                                             device=placement.inference_device if placement.own_inference_copy else None)
    if sharded:  # after the full copies (KL reference, rollout engine) are taken; before the optimizer
        from torchrl_grpo.distributed.data_parallel import shard_model

        model = shard_model(model, dp)
    g = cfg.gconfig
    sampling = SamplingConfig(max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_p=g.top_p, top_k=g.top_k)
    side = build_env_side(cfg, backend, tokenizer, sampling)
    n_eval = cfg.eval.n_problems
    greedy = g.temperature <= 0  # greedy rollouts report the raw softmax: no truncation then (see loss.py)
    loss_fn = GRPOLoss(
        model, clip_eps_low=cfg.loss.clip_eps_low, clip_eps_high=cfg.loss.clip_eps_high,
        kl_coef=cfg.loss.kl_coef, entropy_coef=cfg.loss.entropy_coef, aggregation=cfg.loss.aggregation,
        max_tokens=g.max_new_tokens * cfg.econfig.max_turns, temperature=1.0 if greedy else g.temperature,
        top_p=1.0 if greedy else g.top_p, top_k=0 if greedy else g.top_k,
        behaviour_weight_cap=cfg.loss.behaviour_weight_cap, behaviour_weight_mode=cfg.loss.behaviour_weight_mode,
    )
    o = cfg.optimizer
    optimizer = make_optimizer(model, device, lr=o.lr, beta1=o.beta1, beta2=o.beta2, eps=o.eps,
                               weight_decay=o.weight_decay)
    scheduler = make_scheduler(optimizer, o.scheduler, o.warmup_steps, cfg.train.steps)
    start_step, optimizer_steps = 0, 0
    if cfg.train.resume_from:
        state = load_checkpoint(cfg.train.resume_from, model=model, optimizer=optimizer, scheduler=scheduler)
        start_step = int(state["step"])
        optimizer_steps = int(state.get("extra", {}).get("optimizer_steps", 0))
        backend.sync_from(model)
        log.info("resumed from %s at step %d", state["path"], start_step)
    if cfg.rollout.launcher == "ray":  # rollout on Ray actors, each with its own backend and envs (ray_workers.py)
        from torchrl_grpo.rollout.ray_workers import RayRolloutCollector

        side.collector.close()
        side.collector = RayRolloutCollector(cfg, cfg.rollout.num_workers, local_backend=backend,
                                             max_restarts=cfg.rollout.max_worker_restarts,
                                             worker_timeout_s=cfg.rollout.worker_timeout_s)
        if start_step or cfg.actor.peft.enable:  # the actors loaded actor.path: give them the policy's weights
            side.collector.update_policy_weights_(model)
    t = cfg.train
    update = GRPOUpdate(model, loss_fn, optimizer, reference=reference, device=device, autocast=autocast_for(device),
                        ppo_epochs=t.ppo_epochs, minibatch_size=t.minibatch_size, micro_batch_size=t.micro_batch_size,
                        max_tokens_per_mb=t.max_tokens_per_mb, max_grad_norm=o.max_grad_norm, anchor=cfg.loss.anchor,
                        shared_prefix=t.shared_prefix,
                        exact_log_probs=bool(getattr(backend, "exact_log_probs", False)), seed=cfg.seed,
                        optimizer_steps=optimizer_steps, dp=dp)
    s = cfg.stats_logger
    if dp.is_main:
        logger = StatsLogger(run_dir, OmegaConf.to_container(cfg, resolve=True), wandb_mode=s.wandb.mode,
                             project=s.wandb.project, entity=s.wandb.entity, name=s.wandb.name, console=s.console,
                             resume=bool(cfg.train.resume_from))
    else:
        from torchrl_grpo.distributed.data_parallel import NullLogger

        logger = NullLogger()
    e, c = cfg.eval, cfg.checkpoint
    settings = LoopSettings(
        steps=t.steps, batch_size=t.batch_size, n_samples=g.n_samples, seed=cfg.seed, adv_scale=cfg.loss.adv_scale,
        adv_baseline=cfg.loss.adv_baseline, filter_zero_variance_groups=cfg.loss.filter_zero_variance_groups,
        max_new_tokens=g.max_new_tokens, samples_per_step=s.samples_per_step, eval_every=e.every,
        eval_at_start=e.at_start, eval_at_end=e.at_end, eval_n_problems=n_eval, eval_greedy=e.greedy,
        eval_pass_k=e.pass_k, checkpoint_every=c.every,
        checkpoint_keep_last=c.keep_last, checkpoint_save_final=c.save_final, checkpoint_on_interrupt=c.on_interrupt,
        progress_bar=s.progress_bar, max_staleness=max_staleness(cfg), partial_rollout_chunk=t.partial_rollout_chunk,
        config_yaml=OmegaConf.to_yaml(cfg, resolve=True),
    )
    return Components(
        model=model, tokenizer=tokenizer, backend=backend, sampling=sampling, user_fn=side.user_fn,
        collector=side.collector, eval_collector=side.eval_collector, train_tasks=side.train_tasks,
        eval_tasks=side.eval_tasks, eval_baseline=side.eval_baseline,
        loss_fn=loss_fn, optimizer=optimizer, scheduler=scheduler, update=update, logger=logger, device=device,
        settings=settings, run_dir=run_dir, start_step=start_step, load_time_s=load_time_s, dp=dp, plan=plan,
        placement=placement,
    )
