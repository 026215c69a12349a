"""Data-parallel training over ``torchrun`` ranks (``train.strategy=ddp`` or ``fsdp``) on ``torch.distributed``.

    torchrun --nproc_per_node=2 grpo.py train.strategy=ddp hydra.run.dir=outputs/ddp   # gloo on CPU, NCCL on CUDA
    torchrun --nproc_per_node=2 grpo.py train.strategy=fsdp hydra.run.dir=outputs/fsdp # FSDP2 shards (see below)
    torchrun --nnodes=2 --node_rank=$R --nproc_per_node=8 --rdzv_backend=c10d \\
        --rdzv_endpoint=$HEAD:29500 grpo.py train.strategy=ddp                        # several machines

What each rank does in one trainer step:

1. **Collect its share of prompt groups.** The step's ``train.batch_size`` tasks are dealt round robin
   (:meth:`DataParallel.shard`: rank ``r`` takes tasks ``r, r + W, ...``), so a group (the ``n_samples`` episodes of
   one task) is never split and group-relative advantages need no communication. The collector's seeds are offset
   per rank (:meth:`DataParallel.collect_step`) so ranks never draw the same random stream.
2. **Update on its shard; gradients all-reduced.** :class:`torchrl_grpo.training.update.GRPOUpdate` calls
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
3. **Rank 0 alone writes** metrics (the update's loss metrics reduced over ranks as
   :data:`torchrl_grpo.objectives.loss.REDUCTIONS` declares, the others the mean over ranks: :meth:`DataParallel.mean_metrics`),
   samples, evaluations, checkpoints, ``plan.json`` and the learning curve; other ranks log nothing
   (:class:`NullLogger`). The optimizer state is identical on every rank (same gradients, same steps), so rank 0's
   checkpoint is the whole training state, with the single-process names: it loads at any world size
   (``train.resume_from`` with or without torchrun).

Hydra: each torchrun process runs Hydra; pass one ``hydra.run.dir`` (or ``output_dir``) so that they agree on the
run dir (Hydra's own ``.hydra/`` and log are then the same files; the run's files are rank 0's).

**FSDP2** (``train.strategy=fsdp``, or ``allocation_mode=...+fsdp:dN``) — for models whose weights, gradients and
AdamW state do not fit one device: :func:`shard_model` applies ``torch.distributed.fsdp.fully_shard`` to each
decoder layer, then to the root, on a 1-D ``DeviceMesh`` over the ranks (gloo on CPU, NCCL on CUDA); parameters,
gradients and the optimizer state are then ``DTensor`` shards, 1/W of each per rank. Steps 1 and 3 above are
unchanged; what differs, and why it stays exact:

* **Gradients.** FSDP reduce-scatters each layer's gradient in the backward pass, by default as an *average* over
  ranks. :func:`shard_model` sets the divide factor to 1 with sum-only collectives
  (``set_gradient_divide_factor(1.0)`` + ``set_force_sum_reduction_for_comms(True)``; the factor alone would use
  ``ReduceOp.PREMUL_SUM``, which gloo refuses: "Cannot use ReduceOp.PREMUL_SUM with Gloo"), so with the micro-batch
  scale ``tokens(micro) / Σ_ranks tokens(minibatch)`` of step 2 the shards hold the single-process gradient of the
  union of the ranks' batches; :meth:`DataParallel.all_reduce_grads` skips DTensor parameters.
  ``clip_grad_norm_`` computes the global norm over the DTensor gradients; AdamW (fused) steps on the shards.
* **Lockstep.** Every forward and backward of the sharded model is a collective (all-gather of each layer's
  parameters, reduce-scatter of its gradients), so all ranks must run the same number, though their micro-batch
  counts differ (token budget, filtered groups, an empty shard). :meth:`DataParallel.lockstep` pads a rank's
  passes to the largest count with one-token dummy passes whose loss is multiplied by 0
  (:meth:`torchrl_grpo.training.update.GRPOUpdate.idle_pass`); a call of :func:`torchrl_grpo.objectives.log_probs.token_log_probs`
  runs exactly one forward of a sharded model (no in-call prefix sharing, no chunking; the cross-micro-batch
  shared prefix is off: the root's forward must run, it gathers the embeddings, final norm and LM head). A
  non-finite loss does not stop the passes: its backward still runs, and every rank then discards the minibatch.
* **Rollout.** Each rank's in-process transformers backend generates from its own frozen full copy of the weights
  (made before sharding), refreshed after each optimizer step through :func:`torchrl_grpo.backends.weight_sync.
  export_hf_weights`, which gathers each parameter (``DTensor.full_tensor()``, one all-gather per tensor; per step
  the bytes of one full model, the same as one forward's all-gathers). Cost: one full copy of the weights (no
  gradients, no optimizer state) per rank; the KL reference (``loss.kl_coef > 0``) is another. Generating with the
  sharded module itself is not possible: each new token is a forward, i.e. a collective, and ranks stop
  generating at different lengths. A separate engine (vLLM) gets the same gathered full weights.
* **Checkpoints.** :func:`full_state_dicts` (collective) gives rank 0 the full model state dict
  (``get_model_state_dict(..., full_state_dict=True, cpu_offload=True)``) and the full optimizer state converted
  to the single-process layout (parameter indices, not names), so a checkpoint written at any world size is the
  single-process one and loads anywhere; :func:`load_full_model_state` / :func:`load_full_optimizer_state` load
  one into a sharded model (every rank reads the files).
* **Not combined:** LoRA (``actor.peft.enable``; its trainable state is small: use ``ddp``), Ray rollout workers,
  async and continual modes — each refused at start (:mod:`torchrl_grpo.config`). No ``MixedPrecisionPolicy``:
  parameters are gathered in their own dtype and the forward runs under the trainer's autocast (bf16 on CUDA), the
  same numerics as one process.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Sequence

import torch

# the train.strategy values, why FSDP and LoRA are not combined (raised by shard_model and, at start-up, by
# torchrl_grpo.config.validate_config) and which strategies run over torchrun ranks: rules about config values,
# defined once in the config
from torchrl_grpo.config.choices import STRATEGIES
from torchrl_grpo.config.validation import LORA_FSDP_REFUSAL, is_data_parallel

__all__ = ["STRATEGIES", "LORA_FSDP_REFUSAL", "DataParallel", "SINGLE", "init_data_parallel", "is_data_parallel",
           "NullLogger", "is_fsdp", "shard_model", "full_state_dicts", "load_full_model_state",
           "load_full_optimizer_state"]

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
        return self._all_reduce(value, "sum")

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed element-wise over ranks: a float64 all-reduce, returned as float64 on ``t``'s device (``t``
        as float64 when not distributed). A collective: every rank calls it with the same shape."""
        if not self.enabled:
            return t.double()
        import torch.distributed as dist

        buf = t.detach().to(device=self._comm_device(), dtype=torch.float64).clone()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        return buf.to(t.device)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order (``[obj]`` when not distributed). A collective."""
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def max(self, value: float) -> float:
        """``value``'s maximum over ranks (float64 all-reduce)."""
        return self._all_reduce(value, "max")

    def _all_reduce(self, value: float, op: str) -> float:
        """``value`` reduced over ranks with ``op`` (``"sum"`` | ``"max"``) as a one-element float64 all-reduce;
        ``value`` itself when not distributed. A collective: every rank calls it."""
        if not self.enabled:
            return value
        import torch.distributed as dist

        t = torch.tensor([float(value)], dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
        return float(t.item())

    def lockstep(self, passes: list[Any], model: torch.nn.Module) -> list[Any]:
        """``passes`` padded with ``None`` to the largest count over ranks when ``model`` is FSDP-sharded
        (:func:`is_fsdp`): each of its forward/backward passes is a collective, so every rank must run as many (the
        caller runs a dummy pass for each ``None``). Otherwise ``passes`` as they are. A collective on a sharded
        model: every rank calls it at the same point, before running any of the passes."""
        if not (self.enabled and is_fsdp(model)):
            return list(passes)
        n = int(self.max(len(passes)))
        return list(passes) + [None] * (n - len(passes))

    def all(self, flag: bool) -> bool:
        """True on every rank iff ``flag`` is true on every rank."""
        return flag if not self.enabled else self.sum(0.0 if flag else 1.0) == 0.0

    @torch.no_grad()
    def all_reduce_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum the gradients of ``params`` over ranks, in place, as one flattened all-reduce per dtype (a missing
        gradient counts as zeros and is materialised, so every rank reduces the same tensors). FSDP-sharded
        parameters (``DTensor``) are skipped: their gradients were reduce-scattered (summed) in the backward pass."""
        if not self.enabled:
            return
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        grads: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            if isinstance(p, DTensor):
                continue
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

    def mean_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Rank 0's metrics with every numeric value replaced by its mean over the ranks that report it (the
        others are rank 0's own); a key reported by some ranks only is averaged over those. A value equal on every
        rank that reports it is kept as it is: the update's loss metrics arrive already reduced over the ranks, each
        as :data:`torchrl_grpo.objectives.loss.REDUCTIONS` declares (:meth:`torchrl_grpo.objectives.loss.LossMetrics.finish` with the
        group: sums for counts and totals, token-weighted means, maxima, the batch ESS), so they are the batch-level
        values of the union of the shards, not a plain mean of per-rank values. Rollout and episode statistics
        (``rollout/*``, ``reward/*``, ``groups/*``) stay per-rank means."""
        if not self.enabled:
            return metrics
        rows = self.all_gather_object({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        out = dict(metrics)
        for key in set().union(*rows):
            vals = [float(r[key]) for r in rows if key in r and r[key] == r[key]]  # NaN: nothing measured there
            if vals:
                out[key] = vals[0] if all(v == vals[0] for v in vals) else sum(vals) / len(vals)
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
    """Join the torchrun process group for ``train.strategy=ddp`` or ``fsdp`` (``single``: :data:`SINGLE`).

    Args:
        strategy: one of :data:`STRATEGIES`.
        device_type: ``cpu`` (gloo) or ``cuda`` (NCCL; the rank's device is ``cuda:LOCAL_RANK``).

    Raises:
        ValueError: unknown strategy; ``ddp``/``fsdp`` outside torchrun (no ``RANK``/``WORLD_SIZE`` in the
            environment).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"train.strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "single":
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ValueError(f"launched with WORLD_SIZE={os.environ['WORLD_SIZE']} (torchrun) but "
                             f"train.strategy=single: add train.strategy=ddp (or fsdp)")
        return SINGLE
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise ValueError(f"train.strategy={strategy} needs torchrun (RANK/WORLD_SIZE unset): "
                         f"torchrun --nproc_per_node=N grpo.py train.strategy={strategy}")
    import torch.distributed as dist

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    if not dist.is_initialized():
        if device_type == "cuda":
            torch.cuda.set_device(local)
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    log.info("data parallel (%s): rank %d of %d (%s)", strategy, rank, world, dist.get_backend())
    return DataParallel(rank, world, local)


def is_fsdp(model: torch.nn.Module) -> bool:
    """Whether ``model`` was sharded with ``fully_shard`` (FSDP2) at its root."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder blocks of an HF causal LM (``model.get_decoder().layers``), or [] when it has none."""
    try:
        dec = model.get_decoder()
    except Exception:  # noqa: BLE001  (not an HF model)
        return []
    return list(getattr(dec, "layers", None) or [])


def shard_model(model: torch.nn.Module, dp: DataParallel) -> torch.nn.Module:
    """Shard ``model`` in place with FSDP2: ``fully_shard`` each decoder layer, then the root (embeddings, final
    norm, LM head), on a 1-D mesh over ``dp``'s ranks; gradients are reduce-scattered as a sum (see the module
    docstring). Every rank must hold the same weights (:meth:`DataParallel.broadcast_module` first).

    Returns:
        ``model`` (its class becomes ``FSDP<class>``; parameter names are unchanged).

    Raises:
        ValueError: a peft (LoRA) model: not supported with FSDP here (use ``train.strategy=ddp``).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if hasattr(model, "peft_config"):
        raise ValueError(LORA_FSDP_REFUSAL)
    mesh = init_device_mesh("cuda" if dist.get_backend() == "nccl" else "cpu", (dp.world_size,))
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():
        if isinstance(m, FSDPModule):  # sum, not FSDP's default average; sum-only ops (gloo has no PREMUL_SUM)
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return model


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of ``optimizer``'s parameters in its ``state_dict`` index order (groups in order)."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for g in optimizer.param_groups for p in g["params"]]


def full_state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
                     ) -> tuple[dict | None, dict | None]:
    """The full (unsharded, CPU) state of a sharded model and its optimizer, in the single-process layout: the
    model's ``state_dict`` names, and ``optimizer.state_dict()``'s form (state and groups keyed by parameter index).
    A collective: every rank calls it; rank 0 gets ``(model_state, optimizer_state)``, the others ``(None, None)``.
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=opts)
    osd = get_optimizer_state_dict(model, optimizer, options=opts) if optimizer is not None else None
    if dist.get_rank() != 0:
        return None, None
    if osd is not None:
        index = {n: i for i, n in enumerate(_param_names(model, optimizer))}
        osd = {"state": {index[n]: st for n, st in osd["state"].items()},
               "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]}
    return msd, osd


def load_full_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """Load a full state dict (names as ``model.state_dict()``) into a sharded model, non-strict; every rank calls
    it with the same ``state``. Returns ``(missing, unexpected)`` keys like ``load_state_dict``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    res = set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))
    return list(res.missing_keys), list(res.unexpected_keys)


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a single-process ``optimizer.state_dict()`` (parameter indices; e.g. :func:`full_state_dicts`'s) into
    the optimizer of a sharded model; every rank calls it with the same ``state``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = _param_names(model, optimizer)
    by_name = {"state": {names[int(i)]: st for i, st in state["state"].items()},
               "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]}
                                for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


class NullLogger:
    """The logger of ranks other than 0: same interface as :class:`torchrl_grpo.reporting.stats_logger.StatsLogger`,
    writes nothing."""

    path: Path | None = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def log_images(self, images: dict, step: int) -> None:
        pass

    def log_samples(self, samples: list, step: int, name: str = "samples.jsonl") -> None:
        pass

    def rewind(self, step: int) -> dict:
        return {}

    def close(self) -> None:
        pass
