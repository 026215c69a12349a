"""Phases 5-6 of :func:`torchrl_grpo.assembly.build`: the optimisation side of a step, and resume.

- :func:`build_optimisation`: the loss (``loss.*``, scored under :func:`torchrl_grpo.assembly.rollout_side.loss_sampling`
  of the run's sampling), the fused AdamW and the LR schedule over trainer steps (``optimizer.*``,
  :mod:`torchrl_grpo.training.optimizer`);
- :func:`resume`: weights, optimizer, schedule and step from ``train.resume_from``, the backend synced to them;
- :func:`build_update`: the :class:`~torchrl_grpo.training.update.GRPOUpdate` (``train.*`` micro-batching,
  ``loss.anchor``), after resume (it continues the optimizer-step count).
"""
from __future__ import annotations

import inspect
import logging
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch

from torchrl_grpo.backends.base import RolloutBackend, SamplingConfig
from torchrl_grpo.assembly.devices import Devices
from torchrl_grpo.assembly.policy import Policy
from torchrl_grpo.assembly.rollout_side import loss_sampling
from torchrl_grpo.objectives.loss import GRPOLoss
from torchrl_grpo.objectives.loss_interface import PolicyLoss
from torchrl_grpo.training.checkpoint import load_checkpoint
from torchrl_grpo.training.optimizer import make_optimizer, make_scheduler
from torchrl_grpo.training.update import GRPOUpdate

__all__ = ["Optimisation", "autocast_for", "build_optimisation", "resume", "build_update", "loss_settings",
           "LOSS_KEYS_ELSEWHERE"]

log = logging.getLogger(__name__)


def autocast_for(device: torch.device) -> Callable[[], Any]:
    """The forward passes' autocast context factory: bf16 on CUDA, none elsewhere."""
    if device.type == "cuda":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext


#: ``loss.*`` keys read by other parts of the run (advantages, the group filter, the update's anchor), not arguments of
#: the loss module; every other ``loss.*`` key is one (:func:`loss_settings`; tests/test_loss_interface.py checks the split).
LOSS_KEYS_ELSEWHERE = ("adv_scale", "adv_baseline", "filter_zero_variance_groups", "anchor")

#: :class:`GRPOLoss` arguments the run derives from other sections (the sampling settings, the episode budget), never
#: from ``loss.*``.
_DERIVED = ("actor", "max_tokens", "temperature", "top_p", "top_k")


def loss_settings(section) -> dict[str, Any]:
    """The ``loss.*`` values :class:`~torchrl_grpo.objectives.loss.GRPOLoss` takes, by name: every key of
    ``section`` but :data:`LOSS_KEYS_ELSEWHERE` (a loss option added to the config section and to the loss's
    keyword arguments needs no edit here).

    Raises:
        ValueError: a ``loss.*`` key that is neither a loss argument nor read elsewhere (a config key nothing reads).
    """
    params = set(inspect.signature(GRPOLoss.__init__).parameters) - set(_DERIVED)
    out, unknown = {}, []
    for key in section:
        if key in params:
            out[key] = section[key]
        elif key not in LOSS_KEYS_ELSEWHERE:
            unknown.append(key)
    if unknown:
        raise ValueError(f"loss.{unknown[0]} is neither an argument of GRPOLoss nor read elsewhere "
                         f"({', '.join(LOSS_KEYS_ELSEWHERE)})")
    return out


@dataclass
class Optimisation:
    """The loss (a :class:`~torchrl_grpo.objectives.loss_interface.PolicyLoss`), the optimizer and its LR schedule
    of a run."""

    loss_fn: PolicyLoss
    optimizer: torch.optim.Optimizer
    scheduler: Any


def build_optimisation(cfg, model: torch.nn.Module, device: torch.device, sampling: SamplingConfig) -> Optimisation:
    """The loss (``loss.*``, :func:`loss_settings`; at most ``sampling.max_new_tokens * econfig.max_turns`` response tokens per episode,
    scored under :func:`~torchrl_grpo.assembly.rollout_side.loss_sampling` ``(sampling)``), the optimizer (``optimizer.*``)
    and the schedule over ``train.steps``. Build it on the (sharded, if FSDP) policy.

    Raises:
        ValueError: values the loss, optimizer or scheduler refuse.
    """
    scored = loss_sampling(sampling)
    loss_fn = GRPOLoss(model, **loss_settings(cfg.loss), max_tokens=sampling.max_new_tokens * cfg.econfig.max_turns,
                       temperature=scored.temperature, top_p=scored.top_p, top_k=scored.top_k)
    o = cfg.optimizer
    optimizer = make_optimizer(model, device, lr=o.lr, beta1=o.beta1, beta2=o.beta2, eps=o.eps,
                               weight_decay=o.weight_decay)
    scheduler = make_scheduler(optimizer, o.scheduler, o.warmup_steps, cfg.train.steps)
    return Optimisation(loss_fn=loss_fn, optimizer=optimizer, scheduler=scheduler)


def resume(cfg, model: torch.nn.Module, opt: Optimisation, backend: RolloutBackend) -> tuple[int, int]:
    """``train.resume_from`` (null: a fresh run, ``(0, 0)``): load weights, optimizer and schedule, sync the backend
    to the loaded weights. Returns ``(start_step, optimizer_steps)``.

    Raises:
        FileNotFoundError: a missing checkpoint (:func:`torchrl_grpo.training.checkpoint.load_checkpoint`).
    """
    if not cfg.train.resume_from:
        return 0, 0
    state = load_checkpoint(cfg.train.resume_from, model=model, optimizer=opt.optimizer, scheduler=opt.scheduler)
    start_step = int(state["step"])
    optimizer_steps = int(state.get("extra", {}).get("optimizer_steps", 0))
    backend.sync_from(model)
    log.info("resumed from %s at step %d", state["path"], start_step)
    return start_step, optimizer_steps


def build_update(cfg, policy: Policy, opt: Optimisation, devices: Devices, backend: RolloutBackend,
                 optimizer_steps: int) -> GRPOUpdate:
    """The update of a step (``train.ppo_epochs`` / ``minibatch_size`` / ``micro_batch_size`` (0: no count limit) /
    ``max_tokens_per_mb`` (an int, or ``auto``: resolved per minibatch from the device's memory,
    :func:`torchrl_grpo.training.micro_batch.auto_token_budget`) / ``shared_prefix``, ``optimizer.max_grad_norm``,
    ``loss.anchor``, ``seed``); exact
    log-probs when the backend reports them; counting optimizer steps from ``optimizer_steps`` (resume)."""
    t = cfg.train
    return GRPOUpdate(policy.model, opt.loss_fn, opt.optimizer, reference=policy.reference, device=devices.device,
                      autocast=autocast_for(devices.device), ppo_epochs=t.ppo_epochs, minibatch_size=t.minibatch_size,
                      micro_batch_size=t.micro_batch_size, max_tokens_per_mb=t.max_tokens_per_mb,
                      max_grad_norm=cfg.optimizer.max_grad_norm, anchor=cfg.loss.anchor, shared_prefix=t.shared_prefix,
                      exact_log_probs=bool(getattr(backend, "exact_log_probs", False)), seed=cfg.seed,
                      optimizer_steps=optimizer_steps, dp=devices.dp)
