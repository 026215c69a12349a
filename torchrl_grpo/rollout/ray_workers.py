"""Ray rollout workers: ``python grpo.py rollout.launcher=ray rollout.num_workers=N`` (extra ``[ray]``).

Each worker is a Ray actor (:class:`RolloutWorker`, ``num_cpus=1``, or ``num_gpus=1`` on CUDA) that holds its own
rollout backend (transformers, or vLLM where installed, on its own copy of the policy) and its own envs (a
:class:`torchrl_grpo.rollout.collector.GroupCollector`). It builds them in its own process with a *recipe*: a
picklable callable ``recipe(device) -> (backend, collector)`` handed down by the build
(:func:`torchrl_grpo.assembly.rollout_side.worker_rollout` on the run config as plain containers, with the run's one
``SamplingConfig``), so this module never reads the config. The trainer talks to them through
:class:`RayRolloutCollector`, which has the collector interface the loop uses (``collect``, ``last_stats``,
``update_policy_weights_``, ``close``), so :mod:`torchrl_grpo.training.grpo_trainer` is unchanged. Ray is local
(``ray.init(num_cpus=...)``) or a cluster: ``RAY_ADDRESS=<head>:6379`` (``ray.init()`` connects to it).

One step:

1. **Dispatch whole groups.** The step's tasks are dealt round robin (worker ``w`` gets tasks ``w, w + N, ...``);
   each worker runs all ``n_samples`` episodes of its tasks, so a group never spans workers and its advantages
   are computed on one worker's episodes. Worker ``w`` seeds its collection with ``step * N + w`` (unique streams).
   The batches come back whole (one Ray object each), their group ids are made global, and they are concatenated in
   task order with a ``worker`` column [B] long (which actor sampled the episode).
2. **Fault tolerance.** A worker that dies (``RayActorError``: killed, OOM, node lost) before returning its batch is
   replaced by a new actor, which receives the current weights before its tasks are dispatched again. A batch is
   all or nothing — a dead worker's partial episodes never reach the trainer — so no group is trained twice or
   half. ``rollout/worker_restarts`` counts replacements over the run; past ``rollout.max_worker_restarts`` the
   step raises.
3. **Weight sync** after each optimizer step (:meth:`RayRolloutCollector.update_policy_weights_`): the policy's
   weights under HF names, LoRA merged (:func:`torchrl_grpo.backends.weight_sync.export_hf_weights`), are put once in Ray's
   object store (``ray.put``: zero-copy shared memory for actors on the same node, one transfer per node otherwise)
   and each worker's backend loads them (``RolloutBackend.load_weights``; vLLM: ``reload_weights``).
   :meth:`RayRolloutCollector.worker_digests` lets a test (or ``check_sync=True``) prove that every worker holds the
   trainer's weights after a sync.

What we took from TorchRL 0.14.1 and why not more: ``torchrl.collectors.distributed.RayCollector`` and
``torchrl.collectors.llm.RayLLMCollector`` run remote collectors that each iterate on their own (``frames_per_batch``
/ ``dialog_turns_per_batch``) and are pulled with ``next()``; there is no way to hand a worker *this step's* tasks,
so the trainer could not deal whole prompt groups per step, and neither restarts a dead actor nor re-dispatches its
share (``_sync_iterator`` waits on every actor and an actor error ends the iteration). Their weight path
(``torchrl.weight_update`` schemes: ``TensorDict.from_module(policy)`` pushed into a remote ``nn.Module`` policy, or
vLLM's NCCL group for ``RayLLMCollector``) targets a policy module, while our workers sync through the backend's
own ``load_weights`` (which also covers vLLM's ``reload_weights`` on CPU). So we use Ray itself (actors,
``ray.put``/``ray.get``, ``ray.wait``) and the *same* worker-side collector class
(:class:`~torchrl_grpo.rollout.collector.GroupCollector`, a TorchRL ``BaseCollector``); the GPU path for vLLM engines on
their own devices is TorchRL's ``torchrl.weight_update.llm`` NCCL broadcast (documented in the README, not wired).
"""
from __future__ import annotations

import hashlib
import logging
import time
from typing import Any, Callable

import torch
from tensordict import TensorDict

from torchrl_grpo.backends.weight_sync import export_hf_weights
from torchrl_grpo.config.choices import LAUNCHERS  # rollout.launcher: in the trainer process, or Ray actors
from torchrl_grpo.rollout.collector import _items

__all__ = ["LAUNCHERS", "RolloutWorker", "RayRolloutCollector", "weights_digest"]

log = logging.getLogger(__name__)


def weights_digest(weights) -> str:
    """sha256 over ``(name, dtype, shape, bytes)`` of ``(name, tensor)`` pairs, sorted by name (fp32 bytes)."""
    h = hashlib.sha256()
    for name, t in sorted(((n, t.detach().to("cpu", torch.float32).contiguous()) for n, t in weights),
                          key=lambda x: x[0]):
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def _assigned_cpus() -> float:
    """CPUs Ray assigned to the current actor (1 outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    except Exception:  # noqa: BLE001 - not in a Ray worker
        return 1.0


class RolloutWorker:
    """One rollout actor's state: a backend on its own copy of the policy and a collector over its own envs.

    Args:
        recipe: ``recipe(device) -> (backend, collector)``, run in this actor's process (module docstring;
            :func:`torchrl_grpo.assembly.rollout_side.worker_rollout`): the backend must take weights by ``load_weights``.
        worker_id: its index (logged with the episodes).
        device: ``cpu`` (the actor then uses the CPUs Ray assigned it) or ``cuda`` (its GPU).
    """

    def __init__(self, recipe: Callable[[str], tuple[Any, Any]], worker_id: int, device: str = "cpu") -> None:
        if device == "cpu":  # use the CPUs Ray gave this actor, not the driver's OMP_NUM_THREADS (oversubscription)
            torch.set_num_threads(max(1, int(_assigned_cpus())))
        self.worker_id = worker_id
        self.backend, self.collector = recipe(device)

    def collect(self, tasks: list[dict], n_samples: int, step: int) -> tuple[TensorDict, dict[str, float]]:
        """``GroupCollector.collect`` on this worker's tasks; returns the batch and its stats."""
        td = self.collector.collect(tasks, n_samples, step=step)
        return td, dict(self.collector.last_stats)

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> int:
        """Load the trainer's weights into the backend and take the trainer's policy version. Returns it."""
        self.backend.load_weights(weights)
        self.backend.policy_version = version
        return version

    def digest(self) -> str:
        """:func:`weights_digest` of the backend's module (transformers backends)."""
        return weights_digest(self.backend.model.named_parameters())

    def pid(self) -> int:
        import os

        return os.getpid()


class RayRolloutCollector:
    """The trainer-side handle on ``num_workers`` :class:`RolloutWorker` actors (module docstring).

    Args:
        recipe: what each actor runs to build its backend and collector (:class:`RolloutWorker`), picklable.
        num_workers: actors to start.
        device: the training device setting (``train.device``: ``cpu`` | ``cuda`` | ``auto``): actors take a GPU
            each where CUDA is present and ``device`` is not ``cpu``, else a CPU each.
        local_backend: the trainer's own backend (evaluation; its version follows every sync).
        max_restarts: replacements of dead workers allowed over the run.
        worker_timeout_s: the longest a step waits for the next worker batch (``rollout.worker_timeout_s``), and
            for a worker to load weights; past it the step raises naming the workers still out (a hung env, user
            simulator or engine would otherwise stall the run forever: ``ray.wait`` has no timeout by default).
        check_sync: after every sync, compare each worker's :func:`weights_digest` with the trainer's export
            (a RuntimeError on mismatch; transformers workers only).
        ray_init: keyword arguments of ``ray.init`` when Ray is not running yet (``RAY_ADDRESS`` picks a cluster).

    Raises:
        ImportError: ray not installed (``pip install -e ".[ray]"``).
        ValueError: ``num_workers < 1``, ``worker_timeout_s <= 0``, or more workers than the Ray cluster has CPUs
            (GPUs on CUDA).
    """

    def __init__(self, recipe: Callable[[str], tuple[Any, Any]], num_workers: int, *, device: str = "auto",
                 local_backend=None, max_restarts: int = 3, check_sync: bool = False, ray_init: dict | None = None,
                 worker_timeout_s: float = 3600.0) -> None:
        try:
            import ray
        except ImportError as e:  # pragma: no cover - depends on the extra
            raise ImportError('rollout.launcher=ray needs Ray: pip install -e ".[ray]"') from e

        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not worker_timeout_s > 0:
            raise ValueError(f"worker_timeout_s must be > 0, got {worker_timeout_s}")
        self.worker_timeout_s = float(worker_timeout_s)
        self._ray = ray
        if not ray.is_initialized():
            ray.init(**(ray_init or {}))
        self.recipe = recipe
        self.num_workers, self.max_restarts, self.check_sync = num_workers, max_restarts, check_sync
        self.local_backend = local_backend
        gpu = torch.cuda.is_available() and device != "cpu"
        self.worker_device = "cuda" if gpu else "cpu"
        need = "GPU" if gpu else "CPU"
        have = ray.cluster_resources().get(need, 0)
        if have < num_workers:  # the actors would wait for resources forever
            raise ValueError(f"rollout.num_workers={num_workers} actors need {num_workers} {need}s but the Ray cluster "
                             f"has {have:g}: lower rollout.num_workers or add nodes (ray start --address=...)")
        self._actor_cls = ray.remote(num_cpus=0 if gpu else 1, num_gpus=1 if gpu else 0)(RolloutWorker)
        self.workers = [self._start(w) for w in range(num_workers)]
        self.restarts = 0
        self.policy_version = 0
        self._weights_ref = None  # the last synced weights in the object store (for replacements)
        self._digest: str | None = None
        self.last_stats: dict[str, float] = {}

    def _hung_message(self, workers: list[int], what: str) -> str:
        return (f"rollout worker(s) {workers} {what} within {self.worker_timeout_s:g} s (rollout.worker_timeout_s): "
                f"a hung env, user simulator or engine; raise rollout.worker_timeout_s if batches are that slow")

    def _start(self, w: int):
        return self._actor_cls.options(name=None).remote(self.recipe, w, self.worker_device)

    def _replace(self, w: int, err: Exception) -> None:
        self.restarts += 1
        log.warning("rollout worker %d died (%s): replacing it (restart %d of at most %d)", w,
                    type(err).__name__, self.restarts, self.max_restarts)
        if self.restarts > self.max_restarts:
            raise RuntimeError(f"rollout worker {w} died and rollout.max_worker_restarts={self.max_restarts} "
                               f"replacements are used up") from err
        try:
            self._ray.kill(self.workers[w])
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.workers[w] = self._start(w)
        if self._weights_ref is not None:
            from ray.exceptions import GetTimeoutError

            try:
                self._ray.get(self.workers[w].load_weights.remote(self._weights_ref, self.policy_version),
                              timeout=self.worker_timeout_s)
            except GetTimeoutError as e:
                raise RuntimeError(self._hung_message([w], "(a replacement) did not load the weights")) from e

    # ------------------------------------------------------------------ collection
    def collect(self, tasks: list[dict], n_samples: int, *, step: int = 0, sampling=None) -> TensorDict:
        """Roll out ``n_samples`` episodes of each task on the workers (whole groups per worker).

        Returns:
            The :class:`~torchrl_grpo.rollout.collector.GroupCollector` batch of all tasks, in task order
            (``group_id`` = the task's position in ``tasks``), plus ``worker`` [B] long.

        Raises:
            RuntimeError: more worker deaths than ``max_restarts``; no worker batch came back for
                ``worker_timeout_s`` seconds (the message names the workers still out).
        """
        if sampling is not None:
            raise ValueError("RayRolloutCollector collects training batches only (evaluation runs locally)")
        from ray.exceptions import ActorDiedError, RayActorError

        t0 = time.perf_counter()
        n = self.num_workers
        shares = {w: list(range(w, len(tasks), n)) for w in range(n) if w < len(tasks)}
        pending = {w: self.workers[w].collect.remote([tasks[i] for i in idx], n_samples, step * n + w)
                   for w, idx in shares.items()}
        results: dict[int, tuple[TensorDict, dict]] = {}
        while pending:
            ready, _ = self._ray.wait(list(pending.values()), num_returns=1, timeout=self.worker_timeout_s)
            if not ready:
                raise RuntimeError(self._hung_message(sorted(pending), "returned no batch"))
            w = next(k for k, ref in pending.items() if ref == ready[0])
            try:
                results[w] = self._ray.get(pending.pop(w))
            except (RayActorError, ActorDiedError) as err:  # all or nothing: its groups go again, once
                self._replace(w, err)
                idx = shares[w]
                pending[w] = self.workers[w].collect.remote([tasks[i] for i in idx], n_samples, step * n + w)
        parts = []
        for w, idx in shares.items():
            td, _ = results[w]
            td["group_id"] = torch.tensor(idx, dtype=torch.long)[td["group_id"]]  # worker-local -> task position
            td["worker"] = torch.full((td.shape[0],), w, dtype=torch.long)
            parts.append(td)
        order = torch.argsort(torch.cat([p["group_id"] for p in parts]), stable=True)
        batch = _concat(parts, order)  # in task order
        wall = time.perf_counter() - t0
        stats = [results[w][1] for w in shares]
        gen_tokens = sum(s.get("rollout/generated_tokens", 0.0) for s in stats)
        self.last_stats = {
            "rollout/time_s": wall,
            "rollout/generate_time_s": max(s.get("rollout/generate_time_s", 0.0) for s in stats),
            "rollout/env_time_s": max(s.get("rollout/env_time_s", 0.0) for s in stats),
            "rollout/generated_tokens": gen_tokens,
            "rollout/tokens_per_s": gen_tokens / wall if wall > 0 else 0.0,
            "rollout/episodes": float(batch.shape[0]),
            "rollout/workers": float(len(shares)),
            "rollout/worker_restarts": float(self.restarts),
        }
        return batch

    # ------------------------------------------------------------------ weights
    def update_policy_weights_(self, policy_or_weights: torch.nn.Module | None = None, *, probe=None,
                               **kwargs) -> None:
        """Send the trained policy to every worker through the object store (module docstring, step 3); the
        trainer's local backend (evaluation) syncs too. A worker found dead here is replaced with these weights."""
        from ray.exceptions import ActorDiedError, RayActorError

        if policy_or_weights is None:
            return
        if self.local_backend is not None:
            self.local_backend.sync_from(policy_or_weights, probe=probe)
        weights = {k: v.detach().to("cpu").clone() for k, v in export_hf_weights(policy_or_weights)}
        self.policy_version += 1
        self._weights_ref = self._ray.put(weights)
        self._digest = weights_digest(weights.items()) if self.check_sync else None
        refs = {w: a.load_weights.remote(self._weights_ref, self.policy_version) for w, a in enumerate(self.workers)}
        from ray.exceptions import GetTimeoutError

        for w, ref in refs.items():
            try:
                self._ray.get(ref, timeout=self.worker_timeout_s)
            except (RayActorError, ActorDiedError) as err:
                self._replace(w, err)  # the new actor gets these weights in _replace
            except GetTimeoutError as err:
                raise RuntimeError(self._hung_message([w], "did not load the weights")) from err
        if self.check_sync:
            bad = [w for w, d in enumerate(self.worker_digests()) if d != self._digest]
            if bad:
                raise RuntimeError(f"rollout workers {bad} do not hold the trainer's weights after sync "
                                   f"{self.policy_version}")

    def worker_digests(self) -> list[str]:
        """Each worker's :func:`weights_digest` (compare with ``weights_digest(export_hf_weights(model))``)."""
        return self._ray.get([a.digest.remote() for a in self.workers])

    def close(self) -> None:
        """Kill the actors (Ray itself stays up: it may be the caller's or a cluster's)."""
        for a in self.workers:
            try:
                self._ray.kill(a)
            except Exception:  # noqa: BLE001
                pass
        self.workers = []

    shutdown = close


def _concat(parts: list[TensorDict], order: torch.Tensor | None = None) -> TensorDict:
    """Concatenate collector batches of different padded lengths: tensor columns right-padded with zeros to the
    longest (padding is outside ``attention_mask``, so its token id is never read); the non-tensor columns
    (``task``, ``info``) rebuilt as one ``NonTensorStack`` each, as the collector makes them. ``order``: the rows of
    the result, as indices into the concatenation."""
    from tensordict import NonTensorStack

    T = max(p["tokens"].shape[-1] for p in parts)
    tensors, objects = [], {}
    for p in parts:
        keys = [k for k, v in p.items() if not isinstance(v, torch.Tensor)]
        for k in keys:
            objects.setdefault(k, []).extend(_items(p, k))
        p = p.exclude(*keys)
        t = p["tokens"].shape[-1]
        for key, x in list(p.items()):
            if x.ndim == 2 and x.shape[-1] == t < T:
                p.set(key, torch.nn.functional.pad(x, (0, T - t)))
        tensors.append(p)
    out = torch.cat(tensors)
    if order is not None:
        out = out[order]
        objects = {k: [v[i] for i in order.tolist()] for k, v in objects.items()}
    for k, v in objects.items():
        out[k] = NonTensorStack(*v)
    return out
