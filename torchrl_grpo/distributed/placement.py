"""Apply a device plan in this process: where the KL reference and the in-process rollout engine live, and which CPU
cores the trainer and rollout threads run on.

:mod:`torchrl_grpo.distributed.device_plan` resolves *what* runs *where* (:class:`~torchrl_grpo.distributed.device_plan.AllocationPlan`);
:func:`placement_for` turns that plan into the :class:`Placement` of one process (one torchrun rank), which
:func:`torchrl_grpo.assembly.build` and the trainers apply:

=========  =========================================================  ==============================================
role       GPU (``cuda:i``)                                           CPU (``cpu:i`` = core ``i``)
=========  =========================================================  ==============================================
train      the rank's device (as before)                              the trainer thread is pinned to the train core
inference  in-process transformers backend: its own frozen copy of    sync: the trainer thread moves to the
           the policy on that device, synced by weight copy across    inference cores for each collect / evaluation
           devices (``make_backend(own_copy=True, device=...)``);     and back; async: the rollout thread is pinned
           an engine bound to the first visible GPU (vLLM): refused   to the inference cores for its whole life
           unless on ``cuda:0`` (below)
ref        full fine-tuning: the frozen copy lives on that device;    the thread moves to the ref cores while it
           ref log-probs are computed there and returned as before    computes the ref log-probs, and back
=========  =========================================================  ==============================================

A role colocated with train (the default, and every role of a colocated plan) changes nothing: no extra copy, no
affinity change. Several devices for a role in-process (``inference_model.num_devices=2`` without Ray workers):
rank ``r`` takes the ``r``-th (round robin) on GPU; on CPU the thread may run on all of the role's cores.

CPU pinning is ``os.sched_setaffinity`` on the calling thread (Linux: affinity is per thread, ``pid=0`` is the
calling thread; the thread's id is kept so the trainer thread's mask is restored on ``close``). The kernel's view
after each pin (``Cpus_allowed_list`` of ``/proc/thread-self/status``) is logged and kept in
:attr:`Placement.affinity`. Threads a thread starts inherit its mask, so torch's OpenMP workers started *after* a
pin run on the pinned cores, those started before keep theirs: set ``OMP_NUM_THREADS`` to the cores of a role (the
benchmarks run one thread per role). Without ``os.sched_setaffinity`` (macOS, Windows) nothing is pinned and this is
logged once. ``rollout.launcher=ray``: the rollout runs on Ray actors, not in this process, so the inference
placement is not applied here (Ray places the actors).

Refused at start (:class:`~torchrl_grpo.distributed.device_plan.AllocationError`, naming the keys):

* ``actor.peft.enable=true`` with ``ref_model`` on its own device(s) and ``loss.kl_coef > 0``: LoRA's reference is
  the policy itself with its adapter switched off (no copy: that is why it is free), so it lives wherever the policy
  does; honouring the plan would mean a second full copy of the base model, the cost LoRA avoids, and ignoring it
  would leave ``plan.json`` stating a placement that is not the run's.
* an in-process engine bound to the first visible GPU (its backend's
  :class:`~torchrl_grpo.distributed.device_plan.EnginePlacement` says ``first_visible_gpu``: ``rollout.backend=vllm``,
  whose ``vllm.LLM`` takes no device index) on GPU with the inference role on a device other than ``cuda:0``: it
  cannot be placed on ``cuda:k`` from here. Put it first with ``CUDA_VISIBLE_DEVICES`` (e.g.
  ``CUDA_VISIBLE_DEVICES=1,0`` and ``inference_model.devices=[0]``) or run it on Ray workers
  (``rollout.launcher=ray``). :func:`~torchrl_grpo.distributed.device_plan.resolve_plan` already gives such an engine
  ``cuda:0`` and refuses the plans that cannot (torchrun ranks included); this check stays for a plan resolved
  with another ``inference_placement`` than the backend built.

``ref_model`` on its own device with ``loss.kl_coef=0`` (no reference model): a warning; the device stays idle.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchrl_grpo.distributed.device_plan import ANY_DEVICE, AllocationError, AllocationPlan, EnginePlacement

__all__ = ["Placement", "pinning_available", "placement_for", "thread_cpus"]

log = logging.getLogger(__name__)
_warned_unavailable = False


def pinning_available() -> bool:
    """Whether this platform pins threads (``os.sched_setaffinity``: Linux)."""
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def thread_cpus() -> str | None:
    """The kernel's view of the calling thread's allowed CPUs (``Cpus_allowed_list``, e.g. ``"0"`` or ``"0-1"``),
    or None where ``/proc`` does not say (non-Linux)."""
    for path in ("/proc/thread-self/status", f"/proc/self/task/{threading.get_native_id()}/status"):
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith("Cpus_allowed_list"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            continue
    return None


def _cores(devices) -> frozenset[int]:
    return frozenset(int(d.split(":")[1]) for d in devices)


@dataclass
class Placement:
    """Where this process's roles run (see the module docstring).

    Attributes:
        train_device / inference_device / ref_device: torch devices of the roles (all ``cpu`` on CPU).
        cores: ``{role: frozenset of core indices}`` for ``train`` / ``inference`` / ``ref`` on a disjoint CPU plan;
            empty otherwise (nothing is pinned).
        affinity: the kernel's view (``Cpus_allowed_list``) after each pin, by role: ``train`` (trainer thread),
            ``inference`` (rollout thread, or the trainer thread during a collect), ``ref``.
    """

    train_device: torch.device
    inference_device: torch.device
    ref_device: torch.device
    cores: dict[str, frozenset[int]] = field(default_factory=dict)
    affinity: dict[str, str] = field(default_factory=dict)
    _saved: tuple[int, set[int]] | None = None  # (native thread id, mask) of the trainer thread before its pin

    @property
    def own_inference_copy(self) -> bool:
        """The in-process rollout engine needs its own copy of the policy (its device is not train's)."""
        return self.inference_device != self.train_device

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``plan.json`` (``applied``)."""
        return {"train_device": str(self.train_device), "inference_device": str(self.inference_device),
                "ref_device": str(self.ref_device), "inference_copy": self.own_inference_copy,
                "cpu_cores": {r: sorted(c) for r, c in self.cores.items()} or None,
                "pinning": "on" if self.cores and pinning_available() else "off"}

    def _set(self, role: str) -> bool:
        global _warned_unavailable
        if role not in self.cores:
            return False
        if not pinning_available():
            if not _warned_unavailable:
                log.warning("placement: os.sched_setaffinity is not available on this platform: threads are not "
                            "pinned to the planned cores %s", {r: sorted(c) for r, c in self.cores.items()})
                _warned_unavailable = True
            return False
        os.sched_setaffinity(0, self.cores[role])
        self.affinity[role] = thread_cpus() or ",".join(map(str, sorted(self.cores[role])))
        return True

    def pin_thread(self, role: str) -> None:
        """Pin the calling thread to ``role``'s cores for good (``train``: the trainer thread, whose previous mask
        :meth:`release` restores; ``inference``: the async rollout thread). No-op without cores for ``role``."""
        prev = os.sched_getaffinity(0) if role == "train" and pinning_available() and role in self.cores else None
        if self._set(role):
            if prev is not None and self._saved is None:
                self._saved = (threading.get_native_id(), prev)
            log.info("placement: %s thread pinned to cores %s (kernel: Cpus_allowed_list %s)",
                     "trainer" if role == "train" else "rollout" if role == "inference" else role,
                     sorted(self.cores[role]), self.affinity[role])

    @contextmanager
    def on_cores(self, role: str) -> Iterator[None]:
        """Run the block with the calling thread on ``role``'s cores, then put its previous mask back.
        No-op without cores for ``role``."""
        if role not in self.cores or not pinning_available():
            yield
            return
        prev = os.sched_getaffinity(0)
        self._set(role)
        try:
            yield
        finally:
            os.sched_setaffinity(0, prev)

    def release(self) -> None:
        """Give the trainer thread back the mask it had before :meth:`pin_thread` ``("train")``."""
        if self._saved is not None:
            tid, mask = self._saved
            self._saved = None
            try:
                os.sched_setaffinity(tid, mask)
            except OSError:  # the thread has ended
                pass


def _keys(p) -> str:
    return p.source if p.source != "default" else f"{p.role}_model"


def placement_for(plan: AllocationPlan, *, device: torch.device, rank: int = 0, peft: bool = False,
                  kl_coef: float = 0.0, backend: str = "transformers", launcher: str = "local",
                  inference_placement: EnginePlacement = ANY_DEVICE) -> Placement:
    """This process's :class:`Placement` under ``plan``.

    Args:
        plan: the resolved plan (:func:`torchrl_grpo.distributed.device_plan.resolve_plan`).
        device: the training device of this rank (``cuda:i`` or ``cpu``).
        rank: this process's local rank (picks its train device and, round robin, its inference / ref device).
        peft: ``actor.peft.enable`` (the reference is the adapter-disabled policy).
        kl_coef: ``loss.kl_coef`` (0: no reference model).
        backend: ``rollout.backend``; launcher: ``rollout.launcher`` (``ray``: inference is not in this process).
        inference_placement: the backend's :class:`~torchrl_grpo.distributed.device_plan.EnginePlacement`
            (``torchrl_grpo.backends.factory.backend_spec(backend).placement``; default: no constraint).

    Returns:
        The placement; on a colocated plan every device is ``device`` and no core is pinned.

    Raises:
        AllocationError: the refused combinations of the module docstring, naming the keys.
    """
    pl = plan.placements
    ref, inf = pl["ref"], pl["inference"]
    if ref.colocated_with is None and kl_coef > 0 and peft:
        raise AllocationError(
            f"{_keys(ref)} puts the KL reference on {','.join(ref.devices)} but actor.peft.enable=true: LoRA's "
            f"reference is the policy with its adapter off (the same module, on the train device {device}); unset "
            f"{ref.source} (or set loss.kl_coef=0, or train without LoRA for a separate reference copy)")
    if ref.colocated_with is None and kl_coef <= 0:
        log.warning("%s places a reference model but loss.kl_coef=0: there is none; %s stays idle", _keys(ref),
                    ",".join(ref.devices))
    in_process = launcher != "ray" and not plan.rollout_workers
    if device.type != "cuda":
        cores: dict[str, frozenset[int]] = {}
        if not plan.colocated and plan.available[0].startswith("cpu"):
            train = _cores([plan.train_device(rank)])
            cores = {"train": train,
                     "inference": train if inf.colocated_with or not in_process else _cores(inf.devices),
                     "ref": train if ref.colocated_with or kl_coef <= 0 else _cores(ref.devices)}
        return Placement(device, device, device, cores)
    inf_dev = device if inf.colocated_with or not in_process else torch.device(inf.devices[rank % len(inf.devices)])
    ref_dev = device if ref.colocated_with or kl_coef <= 0 else torch.device(ref.devices[rank % len(ref.devices)])
    if (inference_placement.first_visible_gpu and in_process and inf.colocated_with is None
            and inf_dev != torch.device("cuda:0")):
        raise AllocationError(
            f"{_keys(inf)} puts inference on {inf_dev} but rollout.backend={backend} runs in this process, where it "
            f"builds its engine on the first visible GPU (cuda:0; {inference_placement.reason}): list that GPU "
            f"first with CUDA_VISIBLE_DEVICES and place inference on device 0, or use rollout.launcher=ray")
    return Placement(device, inf_dev, ref_dev)
