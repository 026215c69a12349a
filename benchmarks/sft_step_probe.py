"""Cost of supervised fine-tuning at tau2 length: gold demonstrations kept, episode lengths, and the wall time of one
SFT optimizer step (issue 14 section 2).

Usage: python benchmarks/sft_step_probe.py [--domain retail] [--model smollm2-135m-instruct] [--episodes 8]
       [--context 8192] [--max-turns 20]

Builds :class:`torchrl_grpo.training.sft_trainer.SFTTrainer` (fp32, full fine-tuning, gradient checkpointing, scripted customer for
airline/retail, solo for telecom/mock), replays the gold demonstrations of the whole train split, prints their
statistics, then times one ``sft_update`` on the first ``--episodes`` kept episodes. Run it alone (2 shared cores).
"""
from __future__ import annotations

import argparse
import tempfile
import time

from omegaconf import OmegaConf

from torchrl_grpo.config import GRPOConfig
from torchrl_grpo.rollout.demonstrations import gold_demonstrations
from torchrl_grpo.training.sft_trainer import SFTTrainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domain", default="retail")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--max-turns", type=int, default=20)
    a = ap.parse_args()
    solo = a.domain in ("telecom", "mock")
    cfg = OmegaConf.merge(OmegaConf.structured(GRPOConfig), OmegaConf.create({
        "actor": {"path": a.model, "gradient_checkpointing": True},
        "econfig": {"env_id": "tau2", "domain": a.domain, "solo_mode": solo, "max_steps": 40, "max_turns": a.max_turns},
        "train_dataset": {"split": "small" if a.domain == "telecom" else ("base" if a.domain == "mock" else "train")},
        "valid_dataset": {"split": "base" if a.domain == "mock" else "test"},
        "gconfig": {"max_new_tokens": 192}, "rollout": {"max_context_tokens": a.context},
        "train": {"micro_batch_size": 4, "max_tokens_per_mb": a.context},
        "optimizer": {"lr": 3e-5}, "stats_logger": {"wandb": {"mode": "disabled"}, "progress_bar": False}}))
    trainer = SFTTrainer(cfg, tempfile.mkdtemp())
    try:
        t0 = time.perf_counter()
        batch, stats = gold_demonstrations(trainer.collector, trainer.train_tasks)
        print("demos", stats, f"{time.perf_counter() - t0:.1f} s", flush=True)
        if batch is None:
            return
        L = batch["attention_mask"].sum(-1)
        print("episode tokens min/mean/max", int(L.min()), float(L.float().mean()), int(L.max()),
              "prompt tokens", batch["prompt_length"][:5].tolist(), flush=True)
        td = batch.select(*[k for k, v in batch.items() if hasattr(v, "dtype")])
        t0 = time.perf_counter()
        m = trainer.sft_update(td[: a.episodes], step=0)
        print(f"one SFT step on {min(a.episodes, td.shape[0])} episodes: {time.perf_counter() - t0:.1f} s", m, flush=True)
    finally:
        trainer.close()


if __name__ == "__main__":
    main()
