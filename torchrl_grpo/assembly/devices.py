"""Phase 1 of :func:`torchrl_grpo.assembly.build`: where the run's processes, models and threads go.

:func:`plan_request` reads the device-plan keys of a run config into a
:class:`~torchrl_grpo.distributed.device_plan.PlanRequest` (plain values); :func:`setup_devices` joins the torchrun
group, resolves the plan on the devices present and places this process (:class:`Devices`).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from torchrl_grpo.backends.factory import backend_spec
from torchrl_grpo.config import train_strategy
from torchrl_grpo.distributed.data_parallel import DataParallel, init_data_parallel, is_data_parallel
from torchrl_grpo.distributed.device_plan import ROLES, AllocationPlan, PlanRequest, detect_devices, resolve_plan
from torchrl_grpo.distributed.placement import Placement, placement_for

__all__ = ["Devices", "plan_request", "resolve_device", "setup_devices"]

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` (:data:`~torchrl_grpo.config.choices.DEVICES`) -> a device. Raises ValueError:
    ``cuda`` without a CUDA device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device=cuda but no CUDA device is available")
    return torch.device(name)


def plan_request(cfg) -> PlanRequest:
    """The device-plan keys of a run config as a :class:`PlanRequest`: ``allocation_mode`` and, per role,
    ``{role}_model.num_devices`` / ``{role}_model.devices`` (a missing node or key: not set)."""
    def get(node, key, default=None):
        if node is None:
            return default
        return node.get(key, default) if hasattr(node, "get") else getattr(node, key, default)

    nodes = {r: get(cfg, f"{r}_model") for r in ROLES}
    return PlanRequest(allocation_mode=get(cfg, "allocation_mode"),
                       num_devices={r: int(get(n, "num_devices", 0) or 0) for r, n in nodes.items()},
                       devices={r: tuple(int(d) for d in (get(n, "devices") or ())) for r, n in nodes.items()})


@dataclass
class Devices:
    """This process's share of the run's devices.

    Attributes:
        device: this rank's training device (``cuda:LOCAL_RANK`` under torchrun on CUDA; ``cpu``).
        dp: the data-parallel group (:mod:`torchrl_grpo.distributed.data_parallel`; one rank without torchrun).
        plan: the resolved :class:`~torchrl_grpo.distributed.device_plan.AllocationPlan`.
        placement: where this process puts the KL reference, the rollout engine and its threads
            (:func:`torchrl_grpo.distributed.placement.placement_for`).
    """

    device: torch.device
    dp: DataParallel
    plan: AllocationPlan
    placement: Placement


def setup_devices(cfg) -> Devices:
    """Resolve ``train.device``, join the torchrun group (``train.strategy``, or the engine ``allocation_mode``
    names), resolve the device plan on the devices present (rank 0 logs it) and place this process.

    Raises:
        AllocationError (a ValueError): a plan that does not fit the devices or the launch.
        ValueError: ``cuda`` without CUDA; ``ddp``/``fsdp`` outside torchrun, or fewer tasks per step than ranks.
    """
    device = resolve_device(cfg.train.device)
    workers = cfg.rollout.num_workers if cfg.rollout.launcher == "ray" else 0
    strategy = train_strategy(cfg)  # train.strategy, or the training engine allocation_mode names
    world = int(os.environ.get("WORLD_SIZE", "1")) if is_data_parallel(strategy) else 1
    engine = backend_spec(cfg.rollout.backend).placement  # the backend's placement rule (backends/factory.py)
    plan = resolve_plan(plan_request(cfg), detect_devices(device.type), world_size=world, rollout_workers=workers,
                        train_engine=strategy, inference_engine=cfg.rollout.backend, inference_placement=engine)
    dp = init_data_parallel(strategy, device.type)
    if dp.world_size > cfg.train.batch_size:
        raise ValueError(f"train.batch_size={cfg.train.batch_size} tasks cannot give each of {dp.world_size} ranks "
                         f"a whole group: raise train.batch_size to >= {dp.world_size}")
    if dp.is_main:
        log.info("%s", plan.describe())
    if device.type == "cuda":  # this rank's device in the plan (cuda:0 by default; cuda:LOCAL_RANK under torchrun)
        device = torch.device(plan.train_device(dp.local_rank))
    placement = placement_for(plan, device=device, rank=dp.local_rank, peft=cfg.actor.peft.enable,
                              kl_coef=cfg.loss.kl_coef, backend=cfg.rollout.backend, launcher=cfg.rollout.launcher,
                              inference_placement=engine)
    return Devices(device=device, dp=dp, plan=plan, placement=placement)
