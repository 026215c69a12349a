#!/usr/bin/env python
"""Cross-turn KV reuse on vs off (``rollout.turn_cache_mb``; torchrl_grpo/backends/turn_kv_cache.py), same process.

    python benchmarks/turn_kv_cache_bench.py [--episodes 8] [--repeats 2] [--cap-mb 4096]
                                             [--model smollm2-135m-instruct] [--out benchmarks/results/turn_kv_cache_bench.md]

The tau2 mock recipe's multi-turn rollout (configs/grpo_tau2_mock.yaml): ``tau2/mock-v0``, split ``generated_test``,
solo mode with the ticket as the first user message (the system prompt and tool schemas are one prefix shared by
every episode), SmolLM2-135M in float32, ``--episodes`` tasks (indices 0..N-1) played greedy, up to 8 turns of 64
new tokens, 2048 context tokens, through the real collector (:class:`torchrl_grpo.rollout.collector.GroupCollector`)
and the transformers backend. Two backends share the one model: the cache off and on; the runs alternate
(off, on, off, on, ...) after a warm-up of both. Printed and written to ``--out``: per run the wall time of the
collect and of its ``generate`` calls, the backend's prefilled / reused tokens and turn-cache hits; the ratio of
the median times (off / on); whether both produced the same episodes (tokens and rewards). The command, the
versions and the machine's load (``/proc/loadavg`` before and after) are recorded with them. No GPU needed.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import torch
import transformers

REPO = Path(__file__).resolve().parents[1]

# the instruments' shared harness: the package experiments/ beside this script (benchmarks/ is sys.path[0] for
# ``python benchmarks/turn_kv_cache_bench.py``)
from experiments.harness import git_commit  # noqa: E402

import envs  # noqa: E402
from torchrl_grpo.backends.base import SamplingConfig  # noqa: E402
from torchrl_grpo.backends.transformers_backend import TransformersBackend  # noqa: E402
from torchrl_grpo.model_store import load_model_and_tokenizer  # noqa: E402
from torchrl_grpo.rollout.collector import GroupCollector  # noqa: E402

STATS = ("prefilled_tokens", "reused_tokens", "turn_cache_hits")


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def make_env():
    return gym.make("tau2/mock-v0", split="generated_test", user="solo", solo_ticket="user", max_steps=8)


def run(collector: GroupCollector, backend: TransformersBackend, tasks: list[dict]) -> dict:
    """One collect of ``tasks`` (one episode each): seconds, generate seconds, the backend's stat deltas, the
    episodes' tokens and rewards."""
    before = {k: backend.stats.get(k, 0) for k in STATS}
    t0 = time.perf_counter()
    td = collector.collect(tasks, n_samples=1)
    wall = time.perf_counter() - t0
    toks = [row[m].tolist() for row, m in zip(td["tokens"], td["attention_mask"])]
    return {"wall_s": wall, "generate_s": collector.last_stats["rollout/generate_time_s"],
            "turns": td["num_turns"].tolist(), "tokens": toks, "reward": td["reward"].tolist(),
            **{k: backend.stats.get(k, 0) - before[k] for k in STATS}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2, help="timed runs per side (alternating)")
    p.add_argument("--cap-mb", type=float, default=4096.0, help="turn_cache_mb of the 'on' backend")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks/results/turn_kv_cache_bench.md")
    a = p.parse_args(argv)
    if a.episodes < 1 or a.repeats < 1 or a.cap_mb <= 0:
        p.error("--episodes and --repeats must be >= 1, --cap-mb > 0")
    gym.register_envs(envs)
    load0 = loadavg()
    model, tok = load_model_and_tokenizer(a.model, dtype=torch.float32)
    model.eval()
    sampling = SamplingConfig(max_new_tokens=64, temperature=0.0)
    sides = {}
    for name, mb in (("off", 0.0), ("on", a.cap_mb)):
        be = TransformersBackend(model, pad_token_id=tok.pad_token_id, max_batch_size=64, turn_cache_mb=mb)
        col = GroupCollector(make_env, be, tok, sampling, max_turns=8, max_context_tokens=2048, seed=1)
        sides[name] = (col, be)
    tasks = [{"index": i} for i in range(a.episodes)]
    warm = SamplingConfig(max_new_tokens=1, temperature=0.0)
    for col, _be in sides.values():  # warm-up: kernels and each collector's pool of len(tasks) envs
        col.collect(tasks, n_samples=1, sampling=warm)
    results: dict[str, list[dict]] = {"off": [], "on": []}
    for r in range(a.repeats):
        for name in ("off", "on"):
            col, be = sides[name]
            res = run(col, be, tasks)
            results[name].append(res)
            print(f"run {r + 1} {name:>3}: {res['wall_s']:.1f} s (generate {res['generate_s']:.1f} s), prefilled "
                  f"{res['prefilled_tokens']}, reused {res['reused_tokens']}, hits {res['turn_cache_hits']}, "
                  f"turns {sum(res['turns'])}", flush=True)
    load1 = loadavg()
    same = all(x["tokens"] == y["tokens"] and x["reward"] == y["reward"]
               for x, y in zip(results["off"], results["on"]))
    med = {k: statistics.median(x["wall_s"] for x in v) for k, v in results.items()}
    med_gen = {k: statistics.median(x["generate_s"] for x in v) for k, v in results.items()}
    ratio, ratio_gen = med["off"] / med["on"], med_gen["off"] / med_gen["on"]
    print(f"median collect: off {med['off']:.1f} s, on {med['on']:.1f} s -> {ratio:.2f}x; generate: off "
          f"{med_gen['off']:.1f} s, on {med_gen['on']:.1f} s -> {ratio_gen:.2f}x; same episodes: {same}")
    commit = git_commit()[:10] or "n/a"
    lines = [
        "# Cross-turn KV reuse: on vs off (benchmarks/turn_kv_cache_bench.py)", "",
        f"Command: `python benchmarks/turn_kv_cache_bench.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        f"tau2/mock-v0 generated_test, solo, solo_ticket=user, {a.episodes} episodes (indices 0..{a.episodes - 1}), "
        f"greedy, max_new_tokens 64, max_turns 8, {a.model} float32, transformers backend (eager decode), "
        f"turn_cache_mb {a.cap_mb:g} on the 'on' side; {a.repeats} timed runs per side, alternating, after a "
        "warm-up of each (the same episodes at 1 new token per turn: kernels, env pools).", "",
        f"Versions: python {platform.python_version()}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, commit {commit} (+ working tree); {os.cpu_count()} CPUs, torch threads "
        f"{torch.get_num_threads()}. Load (/proc/loadavg 1/5/15 min): before {load0}, after {load1}.", "",
        "| run | side | collect s | generate s | prefilled tokens | reused tokens | turn-cache hits | turns |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in range(a.repeats):
        for name in ("off", "on"):
            x = results[name][r]
            lines.append(f"| {r + 1} | {name} | {x['wall_s']:.1f} | {x['generate_s']:.1f} | {x['prefilled_tokens']} "
                         f"| {x['reused_tokens']} | {x['turn_cache_hits']} | {sum(x['turns'])} |")
    lines += ["", f"Median collect: off {med['off']:.1f} s, on {med['on']:.1f} s: **{ratio:.2f}x**; median generate: "
              f"off {med_gen['off']:.1f} s, on {med_gen['on']:.1f} s: {ratio_gen:.2f}x. Same episodes (tokens and "
              f"rewards) on both sides: {same}.", ""]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(lines))
    print(f"written {a.out}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
