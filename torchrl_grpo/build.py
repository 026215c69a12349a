"""From a run config to the objects a training loop runs: ``build(cfg, run_dir) -> Components``.

Config flows one way, down this module: config -> :func:`build` -> components. The loop
(:mod:`torchrl_grpo.training.grpo_trainer`, :mod:`torchrl_grpo.training.async_trainer`) receives what is built here and never reads a config
section; everything that knows about peft, vLLM, the concrete backends, env ids or the logger's settings lives here.

What :func:`build` makes, in order:

1. seeds (``seed``), the device (``train.device``);
2. the policy and its tokenizer (``actor.path``, unless given), gradient checkpointing, LoRA (peft, ``actor.peft``),
   dropout off (``train.disable_dropout``);
3. the KL reference (``loss.kl_coef > 0``): a frozen copy of the initial policy (on the plan's ref device), or with
   LoRA the same model with its adapter switched off — either way a context yielding the module to score with;
4. the rollout backend (``rollout.backend``: transformers colocated, or a copy with ``own_backend_copy`` or when the
   plan puts inference on another device; vLLM) — the plan's placement: :mod:`torchrl_grpo.distributed.placement`;
5. the env side (:func:`build_env_side`, once per env config): the optional local LLM user, the train and eval
   collectors, the train task list and the eval task/baseline
   functions (the env decides which tasks are usable and what "doing nothing" is);
6. the loss, the optimizer (fused AdamW), the LR schedule over trainer steps, the update (:mod:`torchrl_grpo.training.update`);
7. resume (``train.resume_from``: weights, optimizer, schedule, step; the backend synced to them) and the logger.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import os
import random
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from omegaconf import OmegaConf

from torchrl_grpo.backends.base import RolloutBackend, SamplingConfig
from torchrl_grpo.backends.factory import BACKENDS, make_backend
from torchrl_grpo.training.update import GRPOUpdate

__all__ = ["build", "build_env_side", "EnvSide", "Components", "LoopSettings", "seed_everything", "make_scheduler", "resolve_device", "DEVICES",
           "SCHEDULERS", "BACKENDS"]

#: ``train.device`` values (:func:`resolve_device`).
DEVICES = ("auto", "cpu", "cuda")
#: ``optimizer.scheduler`` values (:func:`make_scheduler`).
SCHEDULERS = ("constant", "cosine", "linear")

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global RNGs."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` -> a device. Raises ValueError: ``cuda`` without a CUDA device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device=cuda but no CUDA device is available")
    return torch.device(name)


def make_scheduler(opt: torch.optim.Optimizer, kind: str, warmup: int, total: int):
    """LR schedule over *trainer steps* (``train.steps``), stepped once per trainer step whatever the number of
    optimizer steps it took: zero-variance filtering and skipped minibatches change that number from step to step,
    so a schedule counted in planned optimizer steps never reached its end (a linear schedule stopped at half its
    decay with half the groups filtered).

    Raises:
        ValueError: ``kind`` not in :data:`SCHEDULERS`.
    """
    if kind not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {kind!r}")

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


@dataclass(frozen=True)
class LoopSettings:
    """The plain settings a training loop reads (copied from the config by :func:`build`)."""

    steps: int  # train.steps
    batch_size: int  # tasks per step
    n_samples: int  # episodes per task (group size)
    seed: int
    adv_scale: str  # loss.adv_scale (torchrl_grpo.objectives.advantage)
    adv_baseline: str  # loss.adv_baseline
    filter_zero_variance_groups: bool
    max_new_tokens: int  # gconfig.max_new_tokens (truncation warning)
    samples_per_step: int  # episodes decoded into samples.jsonl per step
    eval_every: int
    eval_at_start: bool
    eval_at_end: bool
    eval_n_problems: int
    eval_greedy: bool
    eval_pass_k: int
    checkpoint_every: int
    checkpoint_keep_last: int
    checkpoint_save_final: bool
    checkpoint_on_interrupt: bool
    progress_bar: bool
    max_staleness: int  # async only (build.max_staleness)
    config_yaml: str  # the resolved config, stored with every checkpoint
    partial_rollout_chunk: int = 0  # async only: tokens between checks for new weights (0: off)


@dataclass
class Components:
    """Everything a training loop needs, built by :func:`build`.

    ``collector`` / ``eval_collector`` sample train / greedy-eval episodes with ``backend``; ``train_tasks`` are the
    usable train task indices; ``eval_tasks()`` lists the first usable eval tasks and ``eval_baseline(tasks)`` scores
    the env's do-nothing action on them (``{}`` for envs without one); ``update`` is the optimizer side of a step.
    """

    model: torch.nn.Module
    tokenizer: Any
    backend: RolloutBackend
    sampling: SamplingConfig
    user_fn: Any  # local LLM user (None unless econfig.user / user_llm is "local")
    collector: Any
    eval_collector: Any
    train_tasks: list[int]
    eval_tasks: Callable[[], list[int]]
    eval_baseline: Callable[[list[int]], dict[str, float]]
    loss_fn: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    update: GRPOUpdate
    logger: Any
    device: torch.device
    settings: LoopSettings
    run_dir: Path
    start_step: int = 0
    load_time_s: float = 0.0
    dp: Any = None  # torchrl_grpo.distributed.data_parallel.DataParallel (None: one process)
    plan: Any = None  # torchrl_grpo.distributed.device_plan.AllocationPlan
    placement: Any = None  # torchrl_grpo.distributed.placement.Placement (this process's part of the plan, applied)


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


def _build_backend(cfg, model, tokenizer, own_copy: bool, device: torch.device | None = None) -> RolloutBackend:
    r = cfg.rollout
    if r.backend not in BACKENDS:
        raise ValueError(f"config rollout.backend={r.backend!r} is not one of {BACKENDS}")
    path = None
    if r.backend == "vllm":
        from torchrl_grpo.models import resolve_model_path

        path = resolve_model_path(cfg.actor.path).path
    return make_backend(r.backend, model, tokenizer, own_copy=own_copy, device=device, max_batch_size=r.max_batch_size,
                        model_path=path, seed=cfg.seed, vllm_dtype=r.vllm.dtype, max_model_len=r.vllm.max_model_len,
                        check_sync_every=r.vllm.check_sync_every,
                        gpu_memory_utilization=r.vllm.gpu_memory_utilization, push_weights=cfg.actor.peft.enable)


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


@dataclass
class EnvSide:
    """The env half of a run for one environment config (:func:`build_env_side`): the train and eval collectors on
    a shared backend, the usable train task indices, the first ``eval.n_problems`` usable eval tasks
    (``eval_tasks()``, computed once) and the do-nothing baseline on a task list (``eval_baseline(tasks)``, once per
    list; ``{}`` for envs without one). A continual run holds one per domain
    (:mod:`torchrl_grpo.continual.trainer`)."""

    user_fn: Any  # local LLM user (None unless econfig.user / user_llm is "local")
    collector: Any
    eval_collector: Any
    train_tasks: list[int]
    _eval_tasks: Callable[[], list[int]]
    _baseline: Callable[[list[int]], dict[str, float]]
    _cache: dict = field(default_factory=dict)

    def eval_tasks(self) -> list[int]:
        if "tasks" not in self._cache:
            self._cache["tasks"] = self._eval_tasks()
        return self._cache["tasks"]

    def eval_baseline(self, tasks: list[int]) -> dict[str, float]:
        key = ("baseline", tuple(tasks))
        if key not in self._cache:
            self._cache[key] = self._baseline(tasks)
        return self._cache[key]

    def close(self) -> None:
        self.collector.close()
        self.eval_collector.close()


def build_env_side(cfg, backend: RolloutBackend, tokenizer, sampling: SamplingConfig) -> EnvSide:
    """The collectors and task lists of ``cfg``'s environment (``econfig``, ``train_dataset``, ``valid_dataset``,
    ``eval.n_problems``) on an existing backend; a local tau2 user (``econfig.user=local``) is built on it too.

    Raises:
        ValueError: an empty train split, bad env settings (:func:`torchrl_grpo.rollout.env_side.env_kwargs_from_config`).
    """
    from torchrl_grpo.rollout.collector import GroupCollector
    from torchrl_grpo.rollout.env_side import env_kwargs_from_config, make_env_fn, tau2_user, usable_task_indices
    from torchrl_grpo.rollout.evaluation import do_nothing_baseline

    g = cfg.gconfig
    user_fn = None
    if tau2_user(cfg.econfig) == "local":
        from torchrl_grpo.rollout.local_user import LocalUser

        user_fn = LocalUser(backend, tokenizer, SamplingConfig(max_new_tokens=g.max_new_tokens, temperature=0.7,
                                                               seed=cfg.seed))
    env_id, kw = env_kwargs_from_config(cfg, cfg.train_dataset.split, cfg.train_dataset.path, user_fn=user_fn)
    collector = GroupCollector(make_env_fn(env_id, **kw), backend, tokenizer, sampling, max_turns=cfg.econfig.max_turns,
                               max_context_tokens=cfg.rollout.max_context_tokens, seed=cfg.seed, user_batcher=user_fn)
    train_tasks = usable_task_indices(collector.probe_env, cfg.train_dataset.limit)
    if len(train_tasks) < 1:
        raise ValueError(f"train split {cfg.train_dataset.split!r} of {env_id} has no tasks")
    vid, vkw = env_kwargs_from_config(cfg, cfg.valid_dataset.split, cfg.valid_dataset.path or cfg.train_dataset.path,
                                      user_fn=user_fn)
    eval_collector = GroupCollector(make_env_fn(vid, **vkw), backend, tokenizer, sampling,
                                    max_turns=cfg.econfig.max_turns, max_context_tokens=cfg.rollout.max_context_tokens,
                                    seed=cfg.seed + 1, user_batcher=user_fn)
    n_eval = cfg.eval.n_problems
    return EnvSide(user_fn=user_fn, collector=collector, eval_collector=eval_collector, train_tasks=train_tasks,
                   _eval_tasks=lambda: usable_task_indices(eval_collector.probe_env, n_eval),
                   _baseline=lambda tasks: do_nothing_baseline(make_env_fn(vid, **vkw), tasks))


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
    from torchrl_grpo.config import validate_config
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
    backend = backend or _build_backend(cfg, model, tokenizer, own_copy=own_copy,
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
    params = [p for p in model.parameters() if p.requires_grad]
    o = cfg.optimizer
    # fused AdamW: one kernel over all parameters (0.48 -> 0.07 s per step on SmolLM2-135M, CPU)
    fused = device.type in ("cpu", "cuda") and all(p.is_floating_point() for p in params)
    optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay,
                                  fused=fused or None)
    scheduler = make_scheduler(optimizer, o.scheduler, o.warmup_steps, cfg.train.steps)
    start_step, optimizer_steps = 0, 0
    if cfg.train.resume_from:
        state = load_checkpoint(cfg.train.resume_from, model=model, optimizer=optimizer, scheduler=scheduler)
        start_step = int(state["step"])
        optimizer_steps = int(state.get("extra", {}).get("optimizer_steps", 0))
        backend.sync_from(model)
        log.info("resumed from %s at step %d", state["path"], start_step)
    if cfg.rollout.launcher == "ray":  # rollout on Ray actors, each with its own backend and envs (ray_rollout.py)
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
