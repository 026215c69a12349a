"""Data-parallel training over ``torchrun`` ranks (``train.strategy=ddp``) on ``torch.distributed``.

    torchrun --nproc_per_node=2 grpo.py train.strategy=ddp hydra.run.dir=outputs/ddp   # gloo on CPU, NCCL on CUDA
    torchrun --nnodes=2 --node_rank=$R --nproc_per_node=8 --rdzv_backend=c10d \\
        --rdzv_endpoint=$HEAD:29500 grpo.py train.strategy=ddp                        # several machines

What each rank does in one trainer step:

1. **Collect its share of prompt groups.** The step's ``train.batch_size`` tasks are dealt round robin
   (:meth:`DataParallel.shard`: rank ``r`` takes tasks ``r, r + W, ...``), so a group (the ``n_samples`` episodes of
   one task) is never split and group-relative advantages need no communication. The collector's seeds are offset
   per rank (:meth:`DataParallel.collect_step`) so ranks never draw the same random stream.
2. **Update on its shard; gradients all-reduced.** :class:`torchrl_grpo.update.GRPOUpdate` calls
   :meth:`DataParallel.sum` for the minibatch's normaliser (response tokens for ``token_mean``, episodes otherwise)
   and :meth:`DataParallel.all_reduce_grads` once per optimizer step, after the micro-batch accumulation.

   *Why an explicit all-reduce of the gradients rather than the ``DistributedDataParallel`` wrapper:* our loss is
   a token mean over the whole minibatch, accumulated over token-budgeted micro-batches, each scaled by
   ``tokens(micro) / tokens(minibatch)``. The ranks' token counts differ, so DDP's equal-weight gradient *average*
   is not the single-process gradient; and the number of micro-batches per rank differs too (token budget, groups
   dropped by the filters), while DDP needs a matching synchronising backward on every rank (a rank whose groups
   were all filtered would hang it). Scaling each micro-batch by ``tokens(micro) / Σ_ranks tokens(minibatch)`` and
   summing the gradients over ranks gives exactly the single-process gradient of the doubled batch (up to float
   summation order: ``tests/test_distributed.py`` measures it), for any micro-batch split, including a rank with
   no episodes (it contributes zeros). Cost: one flattened all-reduce per optimizer step, the same bytes as DDP's
   bucketed all-reduce but not overlapped with the backward pass — on CPU/gloo and at these model sizes the overlap
   is not what limits a step (generation is). The module is not wrapped, so its ``state_dict`` names, the colocated
   rollout backend that shares it, LoRA and the KL reference are the single-process ones.
3. **Rank 0 alone writes** metrics (each logged value the mean over ranks, :meth:`DataParallel.mean_metrics`),
   samples, evaluations, checkpoints, ``plan.json`` and the learning curve; other ranks log nothing
   (:class:`NullLogger`). The optimizer state is identical on every rank (same gradients, same steps), so rank 0's
   checkpoint is the whole training state, with the single-process names: it loads at any world size
   (``train.resume_from`` with or without torchrun).

Hydra: each torchrun process runs Hydra; pass one ``hydra.run.dir`` (or ``output_dir``) so that they agree on the
run dir (Hydra's own ``.hydra/`` and log are then the same files; the run's files are rank 0's).

Models that do not fit one device — FSDP2 (documented, not wired here): shard each decoder layer, then the root,
with ``torch.distributed.fsdp.fully_shard`` on a 1-D device mesh::

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh("cuda", (world_size,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:            # HF decoder blocks (LoRA: shard the peft model's base layers)
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)

and in this trainer: (a) FSDP reduce-scatters an *average* of gradients, so scale each micro-batch's loss by
``W · tokens(micro) / Σ_ranks tokens(minibatch)`` (the same normaliser as above) and drop
:meth:`DataParallel.all_reduce_grads`; ``clip_grad_norm_`` works on the DTensor gradients; (b) every rank must run
the same number of forward/backward passes per optimizer step (pad the micro-batch count with an empty pass);
(c) weight export to the rollout engine gathers full tensors (``DTensor.full_tensor()`` per parameter, or
``torch.distributed.checkpoint.state_dict.get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
cpu_offload=True))``) on rank 0, which then syncs the engine; (d) checkpoints save the same full state dict (so
they still load at any world size) and the optimizer with ``get_optimizer_state_dict(..., full_state_dict=True)``.
The allocation plan names it ``fsdp`` (``allocation_mode=vllm:d1+fsdp:d2``) and refuses to run it until wired.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

import torch

__all__ = ["STRATEGIES", "DataParallel", "SINGLE", "init_data_parallel", "NullLogger"]

#: ``train.strategy`` values.
STRATEGIES = ("single", "ddp")

log = logging.getLogger(__name__)


class DataParallel:
    """The data-parallel group of this process (``world_size == 1``: every method is the identity, no collective).

    Attributes:
        rank / world_size / local_rank: this process's place (torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``).
    """

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0) -> None:
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes the run's files."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def shard(self, tasks: Sequence[Any]) -> list[Any]:
        """This rank's share of a step's tasks, round robin (whole groups: a task is one group)."""
        return list(tasks[self.rank::self.world_size])

    def collect_step(self, step: int) -> int:
        """The ``step`` argument of this rank's ``collector.collect``: seeds unique per (step, rank), equal to
        ``step`` on one process."""
        return step * self.world_size + self.rank

    def sum(self, value: float) -> float:
        """``value`` summed over ranks (float64 all-reduce)."""
        if not self.enabled:
            return value
        import torch.distributed as dist

        t = torch.tensor([float(value)], dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t)
        return float(t.item())

    def all(self, flag: bool) -> bool:
        """True on every rank iff ``flag`` is true on every rank."""
        return flag if not self.enabled else self.sum(0.0 if flag else 1.0) == 0.0

    @torch.no_grad()
    def all_reduce_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum the gradients of ``params`` over ranks, in place, as one flattened all-reduce per dtype (a missing
        gradient counts as zeros and is materialised, so every rank reduces the same tensors)."""
        if not self.enabled:
            return
        import torch.distributed as dist

        grads: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.setdefault(p.grad.dtype, []).append(p.grad)
        for group in grads.values():
            flat = torch.cat([g.reshape(-1) for g in group])
            dist.all_reduce(flat)
            offset = 0
            for g in group:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    @torch.no_grad()
    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Make every rank's parameters and buffers rank 0's (start-up; LoRA's random init included)."""
        if not self.enabled:
            return
        import torch.distributed as dist

        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=0)

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (e.g. the run dir)."""
        if not self.enabled:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def mean_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Rank 0's metrics with every numeric value replaced by its mean over the ranks that report it (the
        others are rank 0's own); a key reported by some ranks only is averaged over those."""
        if not self.enabled:
            return metrics
        import torch.distributed as dist

        rows: list[dict[str, Any]] = [{} for _ in range(self.world_size)]
        dist.all_gather_object(rows, {k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        out = dict(metrics)
        for key in set().union(*rows):
            vals = [float(r[key]) for r in rows if key in r and r[key] == r[key]]  # NaN: nothing measured there
            if vals:
                out[key] = sum(vals) / len(vals)
        out["dist/world_size"] = float(self.world_size)
        return out

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()

    def _comm_device(self) -> torch.device:
        import torch.distributed as dist

        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
            else torch.device("cpu")

    def close(self) -> None:
        """Destroy the process group (if this object's :func:`init_data_parallel` made it)."""
        if self.enabled:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


#: the single-process group
SINGLE = DataParallel()


def init_data_parallel(strategy: str, device_type: str) -> DataParallel:
    """Join the torchrun process group for ``train.strategy=ddp`` (``single``: :data:`SINGLE`).

    Args:
        strategy: one of :data:`STRATEGIES`.
        device_type: ``cpu`` (gloo) or ``cuda`` (NCCL; the rank's device is ``cuda:LOCAL_RANK``).

    Raises:
        ValueError: unknown strategy; ``ddp`` outside torchrun (no ``RANK``/``WORLD_SIZE`` in the environment).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"train.strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "single":
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ValueError(f"launched with WORLD_SIZE={os.environ['WORLD_SIZE']} (torchrun) but "
                             f"train.strategy=single: add train.strategy=ddp")
        return SINGLE
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise ValueError("train.strategy=ddp needs torchrun (RANK/WORLD_SIZE unset): "
                         "torchrun --nproc_per_node=N grpo.py train.strategy=ddp")
    import torch.distributed as dist

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if not dist.is_initialized():
        if device_type == "cuda":
            torch.cuda.set_device(local)
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    log.info("data parallel: rank %d of %d (%s)", rank, world, dist.get_backend())
    return DataParallel(rank, world, local)


class NullLogger:
    """The logger of ranks other than 0: same interface as :class:`torchrl_grpo.stats_logger.StatsLogger`,
    writes nothing."""

    path: Path | None = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def log_images(self, images: dict, step: int) -> None:
        pass

    def log_samples(self, samples: list, step: int) -> None:
        pass

    def close(self) -> None:
        pass
