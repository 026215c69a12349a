"""Worker of tests/test_distributed.py: one GRPO update of the tiny model on a fixed batch, on one process or as one
torchrun rank (``train.strategy=ddp`` or ``fsdp``: this rank updates on its whole groups only,
``group_id % W == rank``; ``fsdp`` on two ranks: rank 0 groups 0-2, rank 1 group 3, so that the ranks run different
numbers of micro-batches and the FSDP lockstep padding is exercised).

    python tests/ddp_equivalence.py OUT.pt single MICRO_BATCH [ADV_SCALE]
    torchrun --nproc_per_node=2 tests/ddp_equivalence.py OUT.pt ddp MICRO_BATCH [ADV_SCALE]
    torchrun --nproc_per_node=2 tests/ddp_equivalence.py OUT.pt fsdp MICRO_BATCH [ADV_SCALE]

Every rank collects the same full batch (same weights, same seeds) and draws the same random rewards, so the
single-process update on the whole batch and the data-parallel update on its shards see the same data. The step
runs the trainer's own learning step (``GRPOTrainer._learn``: advantages with ``loss.adv_scale=ADV_SCALE``, default
``group``, group filters, update); with ``ADV_SCALE=batch`` one episode of group 1 is marked an infrastructure failure,
so that group is dropped (and left out of the batch std). Rank 0 saves the updated parameters (and gradients) to
OUT.pt, FSDP shards gathered to full tensors (on every rank), the metrics as logged (``DataParallel.mean_metrics``)
and every rank's advantages ``[(group_id, advantage), ...]`` in rank order.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from torch.distributed.tensor import DTensor

from torchrl_grpo.assembly import build
from torchrl_grpo.config import register_configs
from torchrl_grpo.training.grpo_trainer import GRPOTrainer

REPO = Path(__file__).resolve().parents[1]


def main(out: str, strategy: str, micro: int, adv_scale: str = "group") -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="grpo_gsm8k", overrides=[
            "actor.path=tiny-random", f"train.strategy={strategy}", "train.batch_size=4", "gconfig.n_samples=3",
            "gconfig.max_new_tokens=12", f"train.micro_batch_size={micro}", "optimizer.lr=1e-3", "eval.n_problems=0",
            f"loss.adv_scale={adv_scale}", "stats_logger.samples_per_step=0",
            "stats_logger.wandb.mode=disabled", "stats_logger.progress_bar=false", "train.device=cpu"])
    c = build(cfg, tempfile.mkdtemp(prefix="ddp-eq-"))
    batch = c.env_side.collector.collect([{"index": i} for i in range(4)], 3, step=0)  # identical on every rank
    batch["reward"] = torch.rand(batch.shape[0], generator=torch.Generator().manual_seed(0))
    # uneven response lengths (episode i keeps its first i + 1 sampled tokens), so the ranks' token counts differ
    keep = torch.arange(batch.shape[0]).unsqueeze(-1) + 1
    batch["response_mask"] = batch["response_mask"] & (batch["response_mask"].long().cumsum(-1) <= keep)
    batch["infra_error"] = torch.zeros(batch.shape[0], dtype=torch.bool)
    if adv_scale == "batch":
        batch["infra_error"][int((batch["group_id"] == 1).nonzero()[0])] = True
    owner = batch["group_id"] % c.dp.world_size if strategy != "fsdp" else (batch["group_id"] == 3).long()
    shard = batch[owner == c.dp.rank]
    full = lambda t: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()  # noqa: E731
    before = {n: full(p) for n, p in c.model.named_parameters()}
    trainer = GRPOTrainer(components=c)
    seen = []
    update = trainer.updater.__call__  # a spy on the update (this process only runs this one)
    type(trainer.updater).__call__ = lambda self, b, **kw: (seen.append((b["group_id"].clone(), b["advantage"].clone())),
                                                            update(b, **kw))[1]
    metrics = c.dp.mean_metrics(trainer._learn(shard))  # as train_step logs them
    advantages = [seen]
    if c.dp.enabled:  # every rank's, in rank order
        import torch.distributed as dist

        advantages = [None] * c.dp.world_size
        dist.all_gather_object(advantages, seen)
    params = {n: full(p) for n, p in c.model.named_parameters()}  # FSDP: all-gathers, on every rank
    grads = {n: full(p.grad) for n, p in c.model.named_parameters()}
    if c.dp.is_main:
        torch.save({"params": params, "before": before, "grads": grads, "sharded": type(c.model).__name__,
                    "tokens": [int(batch[batch["group_id"] % 2 == r]["response_mask"].sum()) for r in (0, 1)],
                    "optimizer_steps": metrics["train/optimizer_steps"], "metrics": metrics,
                    "advantages": advantages}, out)
    c.dp.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:])
