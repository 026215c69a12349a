#!/usr/bin/env python
"""A/B of two exact GRPO-update savings on one real train_bench batch, in one process (issue 12 target 4).

    GSM8K_DATA_DIR=... python benchmarks/update_ab_bench.py            # 5 timed reps per arm after 1 warm-up each
    python benchmarks/update_ab_bench.py --reps 1 --model tiny-random  # smoke run

Builds our trainer with exactly train_bench.py's settings (SmolLM2-135M fp32, 2 GSM8K prompts x 8 samples, 128 new
tokens, micro-batches of 4, token-mean loss, no KL/entropy), collects one batch with one ``train_step()``, then times
:class:`torchrl_grpo.training.update.GRPOUpdate` on copies of that same batch, the arms interleaved (A, B, C, A, B, C, ...) so
load drift hits all arms:

* ``before``: the LM head's log-probs through autograd ``log_softmax`` + ``gather``, each chunk's logits recomputed
  in the backward pass (activation checkpointing), and the tied embedding's dense gradient — the path before the
  change;
* ``head``: fused :class:`torchrl_grpo.objectives.log_probs._TargetLogSoftmax`, logits kept for the backward pass when they fit
  ``HEAD_KEEP_BYTES``; dense embedding gradient;
* ``after``: the default path: ``head`` plus the tied embedding's sparse gradient
  (:func:`torchrl_grpo.training.update.sparse_tied_embedding_grads`).

Each update also takes an optimizer step (the weights move a little between reps; the work per rep does not). Also
checked on the first batch: all arms give the same loss and gradient norm (they are the same maths). Prints the
per-arm median seconds and the ratio, and writes ``--out`` (json) if given.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import torch

import torchrl_grpo.objectives.log_probs as lpm
import torchrl_grpo.training.update as upm

ARMS = ("before", "head", "after")


class _Arm:
    """Context: ``before`` switches the fused head path, the logits keep-budget and the sparse tied-embedding
    gradient off; ``head`` only the latter."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self):
        self._saved = (lpm._fusable, lpm.HEAD_KEEP_BYTES, upm.sparse_tied_embedding_grads)
        if self.name == "before":
            lpm._fusable = lambda *a, **k: False
            lpm.HEAD_KEEP_BYTES = 0
        if self.name in ("before", "head"):
            upm.sparse_tied_embedding_grads = lambda model: contextlib.nullcontext(lambda: None)
        return self

    def __exit__(self, *exc):
        lpm._fusable, lpm.HEAD_KEEP_BYTES, upm.sparse_tied_embedding_grads = self._saved


def main(argv: list[str] | None = None) -> int:
    import train_bench as tb

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    if not os.environ.get("GSM8K_DATA_DIR"):
        raise SystemExit("set GSM8K_DATA_DIR (GSM8K folder with train.jsonl/test.jsonl)")
    args = argparse.Namespace(model=a.model, prompts=2, samples=8, max_new_tokens=128, temperature=1.0, lr=1e-5,
                              micro_batch=4, seed=a.seed)
    cfg, _overrides = tb.build_ours_config(args, 1 + 2 * (a.reps + 1))
    from torchrl_grpo.build import seed_everything
    from torchrl_grpo.models import load_model_and_tokenizer
    from torchrl_grpo.training.grpo_trainer import GRPOTrainer

    model, tok = load_model_and_tokenizer(a.model, dtype="float32", device="cpu")
    seed_everything(a.seed)
    trainer = GRPOTrainer(cfg, Path(tempfile.mkdtemp(prefix="update_ab_")), model=model, tokenizer=tok)
    captured = []
    upd = trainer.updater
    orig = upd.__call__

    class Capture:
        def __getattr__(self, k):
            return getattr(upd, k)

        def __call__(self, batch, **kw):
            captured.append(batch.clone())
            return orig(batch, **kw)

    trainer.updater = Capture()
    trainer.train_step()
    trainer.updater = upd
    batch = captured[0]
    n_resp = int(batch["response_mask"].sum())
    print(f"batch: {batch.shape[0]} episodes, {n_resp} response tokens, T={batch['tokens'].shape[-1]}; "
          f"load {os.getloadavg()}", flush=True)

    times: dict[str, list[float]] = {k: [] for k in ARMS}
    check: dict[str, dict] = {}
    step = 100
    for rep in range(a.reps + 1):  # rep 0: warm-up, not timed
        for name in ARMS:
            b = batch.clone()
            with _Arm(name):
                if rep == 0:
                    # same maths: loss and gradient norm of the same weights, no optimizer step
                    upd.optimizer.zero_grad(set_to_none=True)
                    state = {k: v.clone() for k, v in model.state_dict().items()}
                t0 = time.perf_counter()
                out = upd(b, step=step)
                dt = time.perf_counter() - t0
                if rep == 0:
                    check[name] = {"loss": out.get("loss/total", out.get("loss_objective")),
                                   "grad_norm": out.get("grad_norm")}
                    model.load_state_dict(state)
            step += 1
            if rep > 0:
                times[name].append(dt)
            print(f"rep {rep}{' (warm-up)' if rep == 0 else ''} {name}: {dt:.2f}s  load {os.getloadavg()[0]:.2f}",
                  flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {
        "command": "python " + " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:])),
        "model": a.model, "episodes": batch.shape[0], "response_tokens": n_resp,
        "times_s": times, "median_s": med, "before_over_after": med["before"] / med["after"],
        "before_over_head": med["before"] / med["head"],
        "first_update_check": check, "maxrss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        "loadavg_after": os.getloadavg(), "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    print(json.dumps({k: res[k] for k in ("median_s", "before_over_head", "before_over_after", "first_update_check")}, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
