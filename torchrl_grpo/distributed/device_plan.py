"""Device allocation plan: which process or actor runs what on which device, from one of two spellings.

Two spellings users know map to one :class:`AllocationPlan`:

* TorchRL's GRPO recipe keys (``sota-implementations/grpo``): ``train_model.num_devices``,
  ``inference_model.num_devices``, ``ref_model.num_devices`` — or an explicit ``devices=[...]`` list per role
  (device indices, e.g. ``train_model.devices=[0,1]``). Roles with a count get consecutive devices in the order
  train, inference, ref (inference first for an engine bound to the first visible GPU, below), after the devices
  named explicitly;
  a role with neither is *colocated* on the train devices.
* AReaL's ``allocation_mode`` string (Fu et al., 2025, arXiv:2505.24298, the released ``AllocationMode``):
  ``ENGINE:DIMS[+ENGINE:DIMS]``, e.g. ``vllm:d1+fsdp:d2`` (1 device for a vLLM engine, 2 for FSDP training, disjoint;
  it parses, but an engine bound to the first visible GPU, as in-process vLLM on CUDA, refuses it: see below).
  ``DIMS`` is ``d<dp>[t<tp>][p<pp>]``; the role uses ``dp * tp * pp`` devices. One training term alone
  (``fsdp:d2``) colocates inference on the training devices. Inference engines: :data:`INFERENCE_ENGINES`;
  training engines: :data:`TRAIN_ENGINES` (AReaL's ``sglang``/``megatron`` are named in the error as not available).

The two spellings are exclusive (an error if both are set). Nothing set: everything colocated on one device, the
default (``cuda:0`` where CUDA is present, else ``cpu:0``).

Devices present: CUDA devices ``cuda:0..n-1``; without CUDA, CPU *slots* ``cpu:0..k-1`` with ``k = os.cpu_count()``
(one process pinned per slot; gloo ranks and Ray actors each take one). The plan is validated against them: more
devices asked than present, a device index out of range, the same device named twice (within a role or across
roles), an unknown engine, a training world size that differs from the processes launched (``torchrun``), each raise
:class:`AllocationError` naming the keys in conflict.

An inference engine may be bound to the process's first visible GPU: the backend declares it in its
:class:`EnginePlacement` (``first_visible_gpu``; :mod:`torchrl_grpo.backends.factory` holds each backend's rule, and
the caller passes it as ``resolve_plan(inference_placement=...)``; vLLM declares it: ``vllm.LLM`` takes no device
index, and its engine runs in the trainer process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one worker). For such an
engine in the trainer process on CUDA (no Ray workers), an inference role given a *count* takes the first free
device (``cuda:0``) and train / ref the devices after it (``vllm:d1`` on 2 GPUs: vLLM on ``cuda:0``, training on
``cuda:1``). Where we diverge from AReaL, and why: AReaL runs its inference engines as server processes of their
own, so an engine can sit on any device; ours lives inside each training process, so a plan that would put it
anywhere but ``cuda:0`` is refused at resolve time (:class:`AllocationError`, naming the keys): explicit
``inference_model.devices`` other than ``[0]``, more than one inference device, inference colocated with a train
device other than ``cuda:0``, and any torchrun launch with more than one training process (each rank would build
its own engine on its ``cuda:0``). Such an engine on other devices: Ray rollout workers (``rollout.launcher=ray``,
one actor per GPU). CPU slots have no such constraint; an engine without the rule (transformers: its own copy goes
to any device) has none either.

The plan is pure data: :func:`resolve_plan` takes the device list, so it is tested without hardware; the trainer
prints :meth:`AllocationPlan.describe` at start and writes :meth:`AllocationPlan.to_dict` to ``run_dir/plan.json``.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

# the allocation_mode string is config: its engines (inference: the rollout backends; training: train.strategy-like)
# and its parser live in torchrl_grpo.config; what a run config asks for reaches this module as a PlanRequest of plain
# values (torchrl_grpo.assembly.devices.plan_request)
from torchrl_grpo.config.allocation_mode import AllocationError, parse_allocation_mode
from torchrl_grpo.config.choices import INFERENCE_ENGINES, TRAIN_ENGINES

__all__ = ["AllocationError", "AllocationPlan", "ANY_DEVICE", "EnginePlacement", "RolePlacement", "PlanRequest", "parse_allocation_mode",
           "resolve_plan", "detect_devices", "INFERENCE_ENGINES", "TRAIN_ENGINES", "ROLES"]

#: the roles a plan places, in allocation order
ROLES = ("train", "inference", "ref")


@dataclass(frozen=True)
class EnginePlacement:
    """The placement rule of a rollout engine, declared by its backend (:class:`torchrl_grpo.backends.factory.
    BackendSpec`) and given to :func:`resolve_plan` / :func:`torchrl_grpo.distributed.placement.placement_for` as a
    plain value.

    Attributes:
        first_visible_gpu: in the trainer process on CUDA the engine is built on the process's first visible GPU
            and cannot be given another (module docstring): the plan gives inference ``cuda:0`` first and refuses
            other devices, several inference devices and several training processes. ``False``: any device.
        reason: why, quoted in the refusals (e.g. ``"vllm.LLM takes no device index"``); required with
            ``first_visible_gpu``.

    Raises:
        ValueError: ``first_visible_gpu`` without a ``reason``.
    """

    first_visible_gpu: bool = False
    reason: str = ""

    def __post_init__(self) -> None:
        if self.first_visible_gpu and not self.reason:
            raise ValueError("EnginePlacement(first_visible_gpu=True) needs a reason (quoted in the refusals)")


#: the placement rule of an engine that may run on any device (transformers)
ANY_DEVICE = EnginePlacement()


@dataclass(frozen=True)
class RolePlacement:
    """Where one role runs.

    Attributes:
        role: ``train`` | ``inference`` | ``ref``.
        engine: the engine of the role (``ddp``/``fsdp``/``single`` for train, a rollout backend for inference,
            ``frozen`` for the KL reference).
        devices: device names, e.g. ``("cuda:0", "cuda:1")``.
        colocated_with: the role whose devices these are (``None``: its own devices).
        source: where the placement came from (``allocation_mode``, ``train_model.num_devices``, ``default`` ...).
        parallel: AReaL's parallel dims ``{"d": dp, "t": tp, "p": pp}`` (all 1 for the recipe keys).
    """

    role: str
    engine: str
    devices: tuple[str, ...]
    colocated_with: str | None = None
    source: str = "default"
    parallel: dict[str, int] = field(default_factory=lambda: {"d": 1, "t": 1, "p": 1})


@dataclass(frozen=True)
class AllocationPlan:
    """The resolved plan: one :class:`RolePlacement` per role, plus the processes that run them.

    Attributes:
        placements: ``{role: RolePlacement}`` for every role in :data:`ROLES`.
        available: the devices present when the plan was resolved.
        world_size: training processes (``torchrun`` ranks; 1 without it).
        rollout_workers: rollout actors (``rollout.num_workers``; 0: the rollout runs in the trainer process).
    """

    placements: dict[str, RolePlacement]
    available: tuple[str, ...]
    world_size: int = 1
    rollout_workers: int = 0

    @property
    def colocated(self) -> bool:
        """Every role on the training devices (the single-device default is one such plan)."""
        return all(p.colocated_with == "train" for r, p in self.placements.items() if r != "train")

    def train_device(self, rank: int) -> str:
        """The device of training rank ``rank`` (rank ``r`` takes the ``r``-th train device)."""
        return self.placements["train"].devices[rank % len(self.placements["train"].devices)]

    def worker_device(self, worker: int) -> str:
        """The device of rollout worker ``worker`` (round robin over the inference devices)."""
        devs = self.placements["inference"].devices
        return devs[worker % len(devs)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: placements, devices present, and which rank / worker runs on which device."""
        return {
            "available": list(self.available),
            "colocated": self.colocated,
            "world_size": self.world_size,
            "rollout_workers": self.rollout_workers,
            "placements": {r: {**asdict(p), "devices": list(p.devices)} for r, p in self.placements.items()},
            "processes": self.processes(),
        }

    def processes(self) -> list[dict[str, str]]:
        """One row per process/actor: ``{"name", "runs", "device"}``."""
        rows = [{"name": f"rank {r}", "runs": f"train ({self.placements['train'].engine})",
                 "device": self.train_device(r)} for r in range(self.world_size)]
        inf = self.placements["inference"]
        if self.rollout_workers:
            rows += [{"name": f"rollout worker {w}", "runs": f"inference ({inf.engine})",
                      "device": self.worker_device(w)} for w in range(self.rollout_workers)]
        else:
            rows.append({"name": "rank 0" if inf.colocated_with else "rollout engine",
                         "runs": f"inference ({inf.engine})", "device": ",".join(inf.devices)})
        ref = self.placements["ref"]
        rows.append({"name": "each rank" if ref.colocated_with else "ref engine", "runs": "reference (frozen)",
                     "device": ",".join(ref.devices)})
        return rows

    def describe(self) -> str:
        """A few lines for the start-up log."""
        lines = [f"allocation plan ({'colocated' if self.colocated else 'disjoint'}; present: "
                 f"{len(self.available)} x {self.available[0].split(':')[0]}):"]
        for p in self.placements.values():
            where = f"colocated with {p.colocated_with}" if p.colocated_with else f"from {p.source}"
            lines.append(f"  {p.role:<9} {p.engine:<12} {','.join(p.devices):<24} ({where})")
        for row in self.processes():
            lines.append(f"  - {row['name']}: {row['runs']} on {row['device']}")
        return "\n".join(lines)


def detect_devices(device_type: str = "auto") -> list[str]:
    """The devices present: ``cuda:i`` for each CUDA device (``device_type`` ``auto``/``cuda``), else ``cpu:i`` per
    CPU core (see module docstring)."""
    import torch

    if device_type != "cpu" and torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return [f"cpu:{i}" for i in range(os.cpu_count() or 1)]


@dataclass(frozen=True)
class PlanRequest:
    """What a run asks of the devices, in either spelling (module docstring), as plain values.

    :func:`torchrl_grpo.assembly.devices.plan_request` reads it from a run config (``allocation_mode``,
    ``train_model`` / ``inference_model`` / ``ref_model``); tests write it by hand.

    Attributes:
        allocation_mode: AReaL's string (e.g. ``"vllm:d1+fsdp:d2"``), or None.
        num_devices: ``{role: count}`` of the recipe keys (0 or absent: not set).
        devices: ``{role: explicit device indices}`` of the recipe keys (empty or absent: not set).
    """

    allocation_mode: str | None = None
    num_devices: dict[str, int] = field(default_factory=dict)
    devices: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def role(self, role: str) -> tuple[int, list[int]]:
        """``(num_devices, devices)`` of ``role`` (``(0, [])``: not set)."""
        return int(self.num_devices.get(role, 0) or 0), [int(d) for d in self.devices.get(role, ()) or ()]


def resolve_plan(request: PlanRequest, available: Sequence[str], *, world_size: int = 1, rollout_workers: int = 0,
                 train_engine: str = "single", inference_engine: str = "transformers",
                 inference_placement: EnginePlacement = ANY_DEVICE) -> AllocationPlan:
    """Resolve what a run asks for into a plan on the devices ``available``.

    The steps, each a function of its own: what each role asks for (:func:`_wanted`: one spelling, engines as
    configured), the explicit indices (:func:`_check_explicit_devices`) and the count (:func:`_check_device_count`)
    checked against the devices present, devices handed out (:func:`_place_roles`), one :class:`RolePlacement` per
    role (:func:`_role_placements`), the training ranks checked or spread (:func:`_train_over_ranks`), and the
    first-visible-GPU engine's constraint (:func:`_check_first_gpu_engine`).

    Args:
        request: the run's :class:`PlanRequest` (``allocation_mode``, or the recipe keys' counts / indices per role).
        available: the device names present (:func:`detect_devices`), all of one type.
        world_size: training processes launched (``WORLD_SIZE`` under torchrun).
        rollout_workers: rollout actors (``rollout.num_workers``).
        train_engine: the training engine of the run (:func:`torchrl_grpo.config.train_strategy`: ``single`` |
            ``ddp`` | ``fsdp``).
        inference_engine: the rollout backend of the config (``rollout.backend``).
        inference_placement: that backend's :class:`EnginePlacement`
            (``torchrl_grpo.backends.factory.backend_spec(name).placement``; default: no constraint).

    Returns:
        The :class:`AllocationPlan`.

    Raises:
        AllocationError: both spellings set; too many devices; an index out of range; a device in two roles;
            an unknown engine; a training world size other than the processes launched; an engine in
            ``allocation_mode`` other than the one configured (``rollout.backend`` / ``train.strategy``);
            an engine bound to the first visible GPU (``inference_placement.first_visible_gpu``), in process on
            CUDA, anywhere but ``cuda:0`` (module docstring).
    """
    available = tuple(available)
    if not available:
        raise AllocationError("no devices present")
    want = _wanted(request, train_engine, inference_engine)
    taken = _check_explicit_devices(want, available)
    _check_device_count(want, available, by_mode=bool(request.allocation_mode))
    # an in-process engine bound to the first visible GPU (in-process vLLM on CUDA): give it the first free device
    first_gpu = inference_placement.first_visible_gpu and not rollout_workers and _device_type(available) == "cuda"
    placed = _place_roles(want, available, taken, inference_first=first_gpu)
    placements = _role_placements(want, placed, available, world_size, train_engine, inference_engine)
    placements = _train_over_ranks(placements, want, available, world_size, train_engine)
    if first_gpu:
        _check_first_gpu_engine(placements, world_size, inference_engine, inference_placement.reason)
    return AllocationPlan(placements=placements, available=available, world_size=world_size,
                          rollout_workers=rollout_workers)


@dataclass(frozen=True)
class _Want:
    """What the run asks for one role: its engine (None: the configured one), ``n`` devices, the explicit indices
    ``idx`` (empty: a count), the key it came from and AReaL's parallel dims."""

    engine: str | None
    n: int
    idx: tuple[int, ...]
    source: str
    parallel: dict[str, int]


def _device_type(available: Sequence[str]) -> str:
    return available[0].split(":")[0]


def _wanted(request: PlanRequest, train_engine: str, inference_engine: str) -> dict[str, _Want]:
    """Step 1: ``{role: _Want}`` for the roles the request sets, from exactly one spelling.

    Raises:
        AllocationError: both spellings set; a bad ``allocation_mode`` or engine; a count that disagrees with the
            role's index list.
    """
    mode = request.allocation_mode
    specs = {r: request.role(r) for r in ROLES}
    recipe_set = [f"{r}_model.{'devices' if d else 'num_devices'}" for r, (n, d) in specs.items() if n or d]
    if mode and recipe_set:
        raise AllocationError(f"allocation_mode={mode!r} and {', '.join(recipe_set)} are both set: use one spelling")
    if mode:
        return _wanted_from_mode(mode, train_engine, inference_engine)
    want = {}
    for role, (n, idx) in specs.items():
        if idx and n and n != len(idx):
            raise AllocationError(f"{role}_model.num_devices={n} but {role}_model.devices={idx} "
                                  f"lists {len(idx)} devices")
        if n or idx:
            want[role] = _Want(None, len(idx) or n, tuple(idx), f"{role}_model.{'devices' if idx else 'num_devices'}",
                               {"d": len(idx) or n, "t": 1, "p": 1})
    return want


def _wanted_from_mode(mode: str, train_engine: str, inference_engine: str) -> dict[str, _Want]:
    """:func:`_wanted` for AReaL's ``allocation_mode``: each term's engine must be the one configured."""
    want = {role: _Want(engine, dims["d"] * dims["t"] * dims["p"], (), f"allocation_mode={mode}", dims)
            for role, (engine, dims) in parse_allocation_mode(mode).items()}
    eng = want["inference"].engine if "inference" in want else None
    if eng is not None and eng != inference_engine:
        raise AllocationError(f"allocation_mode={mode!r} names inference engine {eng!r} but "
                              f"rollout.backend={inference_engine!r}")
    eng = want["train"].engine
    if eng != "single" and eng != train_engine:
        raise AllocationError(f"allocation_mode={mode!r} names training engine {eng!r} but "
                              f"train.strategy={train_engine!r}: set train.strategy={eng} (or leave it "
                              f"at single: the mode's engine is then used)")
    return want


def _check_explicit_devices(want: dict[str, _Want], available: tuple[str, ...]) -> dict[int, str]:
    """Step 2: every explicit index present and named once. Returns ``{index: the key that named it}``."""
    taken: dict[int, str] = {}
    for w in want.values():
        for i in w.idx:
            if not 0 <= i < len(available):
                raise AllocationError(f"{w.source}={list(w.idx)}: device {i} is not present ({len(available)} "
                                      f"{_device_type(available)} device(s): {', '.join(available)})")
            if i in taken:
                what = "twice" if taken[i] == w.source else f"in both {taken[i]} and {w.source}"
                raise AllocationError(f"device {i} ({available[i]}) is named {what}: roles cannot share an "
                                      f"explicit device (leave a role unset to colocate it with train)")
            taken[i] = w.source
    return taken


def _check_device_count(want: dict[str, _Want], available: tuple[str, ...], *, by_mode: bool) -> None:
    """Step 3: the roles together ask for no more devices than are present."""
    total = sum(w.n for w in want.values())
    if total > len(available):
        parts = " + ".join(f"{r if by_mode else w.source.split('=')[0]}: {w.n}" for r, w in want.items())
        raise AllocationError(f"the plan asks for {total} devices ({parts}) but {len(available)} "
                              f"{_device_type(available)} device(s) are present ({', '.join(available)})")


def _place_roles(want: dict[str, _Want], available: tuple[str, ...], taken: dict[int, str], *,
                 inference_first: bool) -> dict[str, tuple[str, ...]]:
    """Step 4: the devices of each role that asks for some: its explicit ones, or the next free ones in role order
    (inference first with ``inference_first``)."""
    free = [i for i in range(len(available)) if i not in taken]
    placed: dict[str, tuple[str, ...]] = {}
    for role in (("inference", "train", "ref") if inference_first else ROLES):
        if role not in want:
            continue
        w = want[role]
        if w.idx:
            placed[role] = tuple(available[i] for i in w.idx)
        else:
            placed[role], free = tuple(available[i] for i in free[: w.n]), free[w.n:]
    return placed


def _role_placements(want: dict[str, _Want], placed: dict[str, tuple[str, ...]], available: tuple[str, ...],
                     world_size: int, train_engine: str, inference_engine: str) -> dict[str, RolePlacement]:
    """Step 5: one :class:`RolePlacement` per role; a role that asked for nothing is colocated with train."""
    train_dev = placed.get("train", (available[0],))
    engines = {"train": train_engine, "inference": inference_engine, "ref": "frozen"}
    placements: dict[str, RolePlacement] = {}
    for role in ROLES:
        w = want.get(role)
        eng = (w.engine if w else None) or engines[role]
        if role == "train" and eng == "single" and world_size > 1:
            eng = train_engine
        if role in placed:
            placements[role] = RolePlacement(role, eng, placed[role], None, w.source, dict(w.parallel))
        else:
            placements[role] = RolePlacement(role, eng, train_dev, None if role == "train" else "train", "default")
    return placements


def _train_over_ranks(placements: dict[str, RolePlacement], want: dict[str, _Want], available: tuple[str, ...],
                      world_size: int, train_engine: str) -> dict[str, RolePlacement]:
    """Step 6: a training role the plan sets must have one device per launched process; one it does not set is
    spread over ``world_size`` devices (round robin), the roles colocated with it following."""
    n_train = len(placements["train"].devices)
    if "train" in want and world_size != n_train:
        raise AllocationError(f"{want['train'].source} gives training {n_train} device(s) but {world_size} "
                              f"training process(es) were launched: start torchrun --nproc_per_node={n_train} "
                              f"(train.strategy={train_engine if train_engine != 'single' else 'ddp'}) or "
                              f"change the plan")
    if "train" in want or world_size <= 1:
        return placements
    dtype = _device_type(available)
    if world_size > len(available) and dtype != "cpu":  # CPU slots may be shared (oversubscribed) by ranks
        raise AllocationError(f"{world_size} training processes but {len(available)} {dtype} device(s) present")
    devs = tuple(available[i % len(available)] for i in range(world_size))
    out = dict(placements)
    out["train"] = RolePlacement("train", train_engine, devs, None, "WORLD_SIZE", {"d": world_size, "t": 1, "p": 1})
    for role in ("inference", "ref"):
        if out[role].colocated_with == "train":
            out[role] = RolePlacement(role, out[role].engine, devs, "train")
    return out


def _check_first_gpu_engine(placements: dict[str, RolePlacement], world_size: int, engine: str,
                            reason: str) -> None:
    """Refuse a plan that would need an in-process engine bound to the first visible GPU (``engine``, because
    ``reason``) anywhere but ``cuda:0`` (see :func:`resolve_plan`)."""
    inf, train = placements["inference"], placements["train"]
    keys = inf.source if inf.source != "default" else "inference_model"
    first_gpu = (f"rollout.backend={engine} in-process builds its engine on the process's first visible GPU "
                 f"(cuda:0; {reason})")
    if world_size > 1:
        devs = train.devices if inf.colocated_with else inf.devices
        where = ", ".join(f"rank {r} on {devs[r % len(devs)]}" for r in range(world_size))
        raise AllocationError(
            f"rollout.backend={engine} runs one in-process engine per training process, each built on its "
            f"process's first visible GPU (cuda:0; {reason}), but {world_size} training processes "
            f"(torchrun) were launched (inference: {where}): the engines of ranks past 0 cannot be placed there, "
            f"or would share cuda:0 with rank 0's. Train in one process (python grpo.py rollout.backend={engine} "
            f"allocation_mode={engine}:d1: {engine} on cuda:0, training on cuda:1), or use "
            f"rollout.backend=transformers with torchrun")
    if inf.colocated_with is None and len(inf.devices) > 1:
        raise AllocationError(
            f"{keys} gives inference {len(inf.devices)} devices ({','.join(inf.devices)}) but {first_gpu} "
            f"and runs one engine on one GPU: give inference 1 device ({engine}:d1), or run {engine} on Ray workers "
            f"(rollout.launcher=ray rollout.num_workers={len(inf.devices)})")
    if inf.devices[0] != "cuda:0":
        what = (f"inference is colocated with train on {inf.devices[0]} ({train.source})" if inf.colocated_with
                else f"{keys} puts inference on {inf.devices[0]}")
        raise AllocationError(
            f"{what} but {first_gpu}: leave device 0 to inference (a count, e.g. "
            f"inference_model.num_devices=1, takes it), list that GPU first with CUDA_VISIBLE_DEVICES, or use "
            f"rollout.launcher=ray")
