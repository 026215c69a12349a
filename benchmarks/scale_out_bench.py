#!/usr/bin/env python
"""Rollout samples/s with 0 (in-process), 1 and 2 Ray rollout workers (torchrl_grpo/rollout/ray_workers.py): the same GRPO
steps (SmolLM2-135M-Instruct fp32 CPU, GSM8K train tasks, same seed) through ``GRPOTrainer`` with
``rollout.launcher=local`` and ``rollout.launcher=ray rollout.num_workers=N``.

    flock "${BENCH_LOCK:-/tmp/bench.lock}" env OMP_NUM_THREADS=2 python benchmarks/scale_out_bench.py --workers 0 1 2 \\
        --steps 3 > scale_out.log 2>&1         # BENCH_LOCK: the lock file a shared machine's heavy jobs agree on

Per setting: actor start-up (Ray actors loading their model), then ``--steps`` trainer steps; the first is a
warm-up and is not counted. Reported: episodes per second of rollout wall time (``rollout/time_s``: dispatch,
generation on the workers, return of the batch), per step wall time, and weight-sync time. Writes
``benchmarks/results/scale_out.{json,md}`` (the markdown is the table; the analysis is written by hand below it).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_setting(workers: int, args) -> dict:
    import tempfile

    from hydra import compose, initialize_config_dir

    from torchrl_grpo.config import register_configs
    from torchrl_grpo.assembly import build_trainer
    from torchrl_grpo.training.grpo_trainer import GRPOTrainer

    over = [f"actor.path={args.model}", f"train.steps={args.steps}", f"train.batch_size={args.batch_size}",
            f"gconfig.n_samples={args.n_samples}", f"gconfig.max_new_tokens={args.max_new_tokens}",
            "eval.n_problems=0", "checkpoint.every=0", "checkpoint.save_final=false", "train.device=cpu",
            "stats_logger.wandb.mode=disabled", "stats_logger.progress_bar=false", "stats_logger.samples_per_step=0",
            "stats_logger.console=false"]
    if workers:
        over += ["rollout.launcher=ray", f"rollout.num_workers={workers}"]
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="grpo_gsm8k", overrides=over)
    t0 = time.perf_counter()
    trainer = build_trainer(cfg, tempfile.mkdtemp(prefix=f"scale-out-{workers}-"), trainer_cls=GRPOTrainer)
    startup = time.perf_counter() - t0
    rows = []
    try:
        for _ in range(args.steps):
            m = trainer.train_step()
            rows.append({k: m.get(k) for k in ("rollout/time_s", "rollout/episodes", "rollout/generated_tokens",
                                               "time/step_s", "time/sync_s", "time/train_s")})
            print(workers, rows[-1], flush=True)
    finally:
        trainer.close()
    timed = rows[1:] or rows
    eps = [r["rollout/episodes"] / r["rollout/time_s"] for r in timed]
    return {"workers": workers, "launcher": "ray" if workers else "local", "startup_s": startup,
            "samples_per_s": statistics.mean(eps), "samples_per_s_each": eps,
            "tokens_per_s": statistics.mean(r["rollout/generated_tokens"] / r["rollout/time_s"] for r in timed),
            "rollout_s": statistics.mean(r["rollout/time_s"] for r in timed),
            "step_s": statistics.mean(r["time/step_s"] for r in timed),
            "sync_s": statistics.mean(r["time/sync_s"] for r in timed),
            "train_s": statistics.mean(r["time/train_s"] for r in timed), "steps": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--n-samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--ray-cpus", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "scale_out"))
    args = ap.parse_args()
    import ray
    import torch
    import torchrl

    ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
    load_before = os.getloadavg()
    results = [run_setting(w, args) for w in args.workers]
    ray.shutdown()
    meta = {"command": " ".join([Path(sys.executable).name] + sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                             time.gmtime()),
            "load_before": load_before, "load_after": os.getloadavg(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "torchrl": torchrl.__version__,
            "ray": ray.__version__, "omp_threads": os.environ.get("OMP_NUM_THREADS"), "args": vars(args)}
    Path(args.out + ".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    lines = ["| rollout | samples/s | tokens/s | rollout s/step | step s | sync s | actor start-up s |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        name = "in-process (local)" if not r["workers"] else f"Ray, {r['workers']} worker(s)"
        lines.append(f"| {name} | {r['samples_per_s']:.2f} | {r['tokens_per_s']:.1f} | {r['rollout_s']:.1f} | "
                     f"{r['step_s']:.1f} | {r['sync_s']:.2f} | {r['startup_s']:.1f} |")
    print("\n".join(lines))
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
