#!/usr/bin/env python
"""Sync vs async GRPO at the SAME placement: generation on its own core, training on another, one process.

    # in the project venv, GSM8K from $GSM8K_DATA_DIR; a heavy job: on a shared machine, one at a time (BENCH_LOCK:
    # any lock file the machine's heavy jobs agree on)
    flock "${BENCH_LOCK:-/tmp/bench.lock}" env OMP_NUM_THREADS=1 python benchmarks/async_bench.py > RUN_DIR/log 2>&1
    python benchmarks/async_bench.py --modes sync_colocated,async --warmup 0 --steps 1 --max-new-tokens 16 --no-write  # smoke

Why: on shared cores async cannot pay (generation and the update compete for the same cores: issue 12 measured
0.99x). Overlap pays only where rollout and training have their own resources. Here both modes get the same ones:

* the trainer (this process's main thread) is pinned to ``--train-core``; the rollout thread of
  :class:`~torchrl_grpo.training.async_trainer.AsyncGRPOTrainer` pins itself to ``--gen-core`` (``sched_setaffinity`` on the
  calling thread, via the trainer's ``on_rollout_thread_start`` hook); torch runs one intra-op thread per calling
  thread (``torch.set_num_threads(1)``), so each side computes on its own core;
* the generator is the transformers backend on its own merged copy of the policy (``own_backend_copy``), synced by
  weight snapshot after every update — the same engine and hand-over in every mode.

Modes (one trainer each, built from the same freshly loaded weights, same seed, same prompts):

* ``sync_colocated``: the production sync :class:`~torchrl_grpo.training.grpo_trainer.GRPOTrainer` (the backend samples from the
  trained module itself: no weight copy, no hand-over, no anchor recompute since its log-probs are exact), its one
  thread moved to the generation core for each collect and back to the training core for the update;
* ``sync``: the async trainer with ``max_staleness=0`` — AReaL's η = 0, the synchronous schedule (generate batch s with the weights of
  step s, then train on it; the generator idles while the trainer updates and vice versa);
* ``async``: ``max_staleness=1`` — one-step-off pipeline: batch s+1 is generated while the trainer updates on s;
* ``async_partial``: ``max_staleness=1`` plus partial rollouts (``train.partial_rollout_chunk``): the generator
  takes new weights every N tokens mid-generation (per-token policy versions, the decoupled objective per token).

Settings: as ``benchmarks/train_bench.py`` (SmolLM2-135M-Instruct, fp32, GSM8K train prompts, 2 prompts x 8 samples,
128 new tokens, temperature 1, token-mean loss, clip 0.2/0.28, one optimizer step per batch in micro-batches of 4,
lr 1e-5 constant, AdamW), with ``loss.behaviour_weight_cap=2`` (async's default) in every mode.

Measured per mode over the timed steps (after ``--warmup`` steps, which fill the pipeline): wall time from the end of
the last warm-up step to the end of the last step; samples/s = completions trained / that wall time; trainer idle
% = Σ ``async/wait_s`` / wall (the trainer waiting for a batch); generator idle % = 1 - Σ rollout wall time of the
batches trained / wall (the generator waiting for the staleness bound or finished); staleness = histogram of
``async/token_lag_frac/<k>`` (token-weighted: the fraction of trained response tokens k versions old) and of the
per-batch ``async/staleness`` (oldest token). Results: ``benchmarks/results/async_placement.{json,md}``.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]

import torch  # noqa: E402

from train_bench import _loadavg, _machine, _versions, build_ours_config  # noqa: E402  (benchmarks/ is sys.path[0])

# name -> (max_staleness, partial_rollout_chunk; None = --chunk); sync_colocated is the plain sync GRPOTrainer
MODES = {"sync_colocated": (0, 0), "sync": (0, 0), "async": (1, 0), "async_partial": (1, None)}


def _pin(core: int) -> str:
    """Pin the calling thread (Linux: affinity is per thread) to ``core``; returns the kernel's view of it."""
    os.sched_setaffinity(0, {core})
    tid = threading.get_native_id()
    for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list"):
            return line.split(":", 1)[1].strip()
    return "?"


def run_mode(name: str, args, model0, tokenizer, tmp: Path) -> dict:
    from omegaconf import OmegaConf

    from torchrl_grpo.training.async_trainer import AsyncGRPOTrainer
    from torchrl_grpo.seeding import seed_everything
    from torchrl_grpo.assembly import build_trainer
    from torchrl_grpo.training.grpo_trainer import GRPOTrainer

    eta, chunk = MODES[name]
    chunk = args.chunk if chunk is None else chunk
    total = args.warmup + args.steps
    cfg, overrides = build_ours_config(args, total)
    OmegaConf.set_struct(cfg, False)
    colocated = name == "sync_colocated"
    cfg.mode = "sync" if colocated else "async"
    cfg.train.max_staleness = eta
    cfg.train.partial_rollout_chunk = chunk
    cfg.loss.behaviour_weight_cap = 2.0
    seed_everything(args.seed)
    placement = {}
    if colocated:
        # the production sync trainer: one thread, the backend samples from the trained module itself (no weight
        # copy, no anchor recompute); the thread moves to the generation core for each collect and back after
        trainer = build_trainer(cfg, tmp / name, trainer_cls=GRPOTrainer, model=copy.deepcopy(model0), tokenizer=tokenizer)
        collect = trainer.collector.collect

        def pinned_collect(*a, **k):
            placement["collect_cpus"] = _pin(args.gen_core)
            try:
                return collect(*a, **k)
            finally:
                _pin(args.train_core)

        trainer.collector.collect = pinned_collect
    else:
        trainer = build_trainer(cfg, tmp / name, trainer_cls=AsyncGRPOTrainer, model=copy.deepcopy(model0), tokenizer=tokenizer)

        def pin_rollout():
            placement["rollout_thread_cpus"] = _pin(args.gen_core)

        trainer.on_rollout_thread_start = pin_rollout
    placement["trainer_thread_cpus"] = _pin(args.train_core)
    # time the no-grad anchor recompute (π_prox) inside the update: async pays it on every stale batch
    fill, anchor_s = trainer.updater.fill_log_probs, [0.0]

    def timed_fill(*a, **k):
        t = time.perf_counter()
        try:
            return fill(*a, **k)
        finally:
            anchor_s[0] += time.perf_counter() - t

    trainer.updater.fill_log_probs = timed_fill
    steps, t_mark = [], None
    try:
        t_start = time.perf_counter()
        for k in range(total):
            anchor_s[0] = 0.0
            m = trainer.train_step()
            now = time.perf_counter()
            rollout_s = m.get("time/rollout_wall_s", m["rollout/time_s"])
            rec = {"step": k, "warmup": k < args.warmup, "end_s": now - t_start, "step_s": m["time/step_s"],
                   # colocated sync: the training core idles while the thread generates on the other core
                   "wait_s": m.get("async/wait_s", rollout_s), "generator_wait_s": m.get("async/generator_wait_s", 0.0),
                   "rollout_s": rollout_s, "train_s": m["time/train_s"], "sync_s": m["time/sync_s"],
                   "staleness": m.get("async/staleness", 0.0), "token_lag_mean": m.get("async/token_lag_mean", 0.0),
                   "token_lag_frac": {kk: m.get(f"async/token_lag_frac/{kk}", 1.0 if colocated else 0.0)
                                      for kk in range(eta + 1)},
                   "anchor_recomputed": m.get("train/anchor_recomputed"), "anchor_s": anchor_s[0],
                   "partial_interrupts": m.get("async/partial_interrupts", 0.0),
                   "generated_tokens": m["rollout/generated_tokens"], "response_tokens": m.get("episode/response_tokens"),
                   "completions": int(m["rollout/episodes"]), "reward_mean": m["reward/mean"],
                   "ess": m.get("ess"), "behaviour_weight_mean": m.get("behaviour_weight_mean"), "load": _loadavg()}
            steps.append(rec)
            if k == args.warmup - 1:
                t_mark = now
            print(f"[{name}] step {k}{' (warm-up)' if rec['warmup'] else ''}: {rec['step_s']:.2f}s  trainer wait "
                  f"{rec['wait_s']:.2f}s  rollout {rec['rollout_s']:.2f}s (gen wait {rec['generator_wait_s']:.2f}s)  "
                  f"train {rec['train_s']:.2f}s (anchor {rec['anchor_s']:.2f}s)  sync {rec['sync_s']:.2f}s  staleness {rec['staleness']:.0f}  "
                  f"lag {rec['token_lag_mean']:.2f}  interrupts {rec['partial_interrupts']:.0f}  "
                  f"tokens {rec['generated_tokens']:.0f}  reward {rec['reward_mean']:.3f}  load {rec['load'][0]}",
                  flush=True)
    finally:
        trainer.close()
    t_end_abs = steps[-1]["end_s"]
    t0 = 0.0 if t_mark is None else t_mark - t_start
    timed = [r for r in steps if not r["warmup"]]
    wall = t_end_abs - t0
    completions = sum(r["completions"] for r in timed)
    toks = sum(r["generated_tokens"] for r in timed)
    lag_hist = {}
    for kk in range(eta + 1):
        lag_hist[str(kk)] = sum(r["token_lag_frac"][kk] * r["generated_tokens"] for r in timed) / max(toks, 1)
    return {
        "mode": name, "max_staleness": eta, "partial_rollout_chunk": chunk, "placement": placement,
        "timed_steps": len(timed), "wall_s": wall, "s_per_step": wall / len(timed),
        "samples_per_s": completions / wall, "generated_tokens_per_s": toks / wall,
        "trainer_idle_pct": 100 * sum(r["wait_s"] for r in timed) / wall,
        "generator_idle_pct": max(0.0, 100 * (1 - sum(r["rollout_s"] for r in timed) / wall)),
        "generator_wait_pct": 100 * sum(r["generator_wait_s"] for r in timed) / wall,
        "mean_rollout_s": sum(r["rollout_s"] for r in timed) / len(timed),
        "mean_train_s": sum(r["train_s"] for r in timed) / len(timed),
        "mean_sync_s": sum(r["sync_s"] for r in timed) / len(timed),
        "mean_anchor_s": sum(r["anchor_s"] for r in timed) / len(timed),
        "token_lag_hist": lag_hist,
        "staleness_counts": {str(v): sum(1 for r in timed if r["staleness"] == v) for v in sorted({r["staleness"] for r in timed})},
        "partial_interrupts": sum(r["partial_interrupts"] for r in timed),
        "mean_reward": sum(r["reward_mean"] for r in timed) / len(timed),
        "config_overrides": overrides + ["mode=async", f"train.max_staleness={eta}",
                                         f"train.partial_rollout_chunk={chunk}", "loss.behaviour_weight_cap=2.0"],
        "steps": steps,
    }


def to_markdown(res: dict) -> str:
    rows = res["modes"]
    base = rows.get("sync_colocated") or rows.get("sync")
    out = ["| mode | η | chunk | s/step | samples/s | x sync | trainer idle % | generator idle % | rollout s | "
           "train s (anchor s) | sync s | token lag hist (0/1) | staleness (oldest) per batch | interrupts |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        ratio = r["samples_per_s"] / base["samples_per_s"] if base else float("nan")
        hist = " / ".join(f"{v:.2f}" for v in r["token_lag_hist"].values())
        st = ", ".join(f"{k}: {v}" for k, v in r["staleness_counts"].items())
        out.append(f"| {name} | {r['max_staleness']} | {r['partial_rollout_chunk']} | {r['s_per_step']:.1f} | "
                   f"{r['samples_per_s']:.3f} | {ratio:.2f}x | {r['trainer_idle_pct']:.0f} | "
                   f"{r['generator_idle_pct']:.0f} | {r['mean_rollout_s']:.1f} | {r['mean_train_s']:.1f} ({r['mean_anchor_s']:.1f}) | "
                   f"{r['mean_sync_s']:.2f} | {hist} | {st} | {r['partial_interrupts']:.0f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--data-dir", default=os.environ.get("GSM8K_DATA_DIR"))
    p.add_argument("--modes", default="sync_colocated,sync,async,async_partial")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--chunk", type=int, default=16, help="async_partial: tokens between checks for new weights")
    p.add_argument("--train-core", type=int, default=0)
    p.add_argument("--gen-core", type=int, default=1)
    p.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if not args.data_dir:
        raise SystemExit("no GSM8K data: pass --data-dir or set GSM8K_DATA_DIR")
    os.environ["GSM8K_DATA_DIR"] = args.data_dir
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise SystemExit(f"unknown modes {bad}; choose from {list(MODES)}")
    import gymnasium as gym
    from transformers import logging as hf_logging

    import envs
    from torchrl_grpo.model_store import load_model_and_tokenizer

    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)  # one intra-op thread per calling thread: each side computes on its own core
    gym.register_envs(envs)
    load_before = _loadavg()
    print(f"load average before: {load_before}; nproc {os.cpu_count()}; train core {args.train_core}, "
          f"generation core {args.gen_core}", flush=True)
    t0 = time.perf_counter()
    model0, tok = load_model_and_tokenizer(args.model, dtype="float32", device="cpu")
    print(f"model loaded in {time.perf_counter() - t0:.1f}s", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="async_bench_") as tmp:
        for name in modes:
            results[name] = run_mode(name, args, model0, tok, Path(tmp))
            r = results[name]
            print(f"[{name}] {r['s_per_step']:.1f} s/step, {r['samples_per_s']:.3f} samples/s, trainer idle "
                  f"{r['trainer_idle_pct']:.0f}%, generator idle {r['generator_idle_pct']:.0f}%, lag hist "
                  f"{r['token_lag_hist']}", flush=True)
    res = {"command": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])]),
           "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "load_before": load_before,
           "load_after": _loadavg(), "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
           "versions": _versions(), "machine": _machine(), "args": vars(args), "modes": results}
    table = to_markdown(res)
    print(table, flush=True)
    for b in ("sync_colocated", "sync"):
        for name in results:
            if b in results and name != b:
                print(f"{name} / {b} samples/s: {results[name]['samples_per_s'] / results[b]['samples_per_s']:.2f}x")
    if not args.no_write:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "async_placement.json").write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {out / 'async_placement.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
