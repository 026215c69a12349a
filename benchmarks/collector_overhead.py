#!/usr/bin/env python
"""Collector overhead without a model: ``GroupCollector.collect`` with a zero-cost backend vs. the same resets and
steps on the bare Gymnasium envs, same process, same envs, same actions.

What it isolates: everything the collector adds around generation (TorchRL ``TextEnv`` reset/step, chat-template
tokenisation of each env turn, decoding the sampled ids, the batch TensorDict). The backend returns a fixed reply
(``--reply``) instantly, so ``collect`` time = collector + env time; the baseline loop calls ``env.reset`` /
``env.step(reply)`` on the same envs in the same order (env time only). Reported: ms per batch for both and the
ratio collector/baseline.

    python benchmarks/collector_overhead.py                      # GSM8K 16x4 and tau2 telecom (solo) 8x8, 5 repeats
    python benchmarks/collector_overhead.py --out collector_overhead_new

Results: ``benchmarks/results/<--out>.{json,md}`` with command, versions and load.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-random", help="tokenizer source (any packaged model)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reply", default="The answer is #### 42", help="GSM8K reply")
    ap.add_argument("--tau2-reply", default='<tool_call>{"name": "get_customer_by_phone", "arguments": '
                    '{"phone_number": "555-123-2002"}}</tool_call>', help="tau2 reply: a tool call keeps it going")
    ap.add_argument("--out", default="collector_overhead")
    args = ap.parse_args()

    import gymnasium as gym
    import torch

    import envs
    from torchrl_grpo.backends.base import Generation, RolloutBackend, SamplingConfig
    from torchrl_grpo.rollout.collector import GroupCollector
    from torchrl_grpo.models import load_model_and_tokenizer

    gym.register_envs(envs)
    _, tok = load_model_and_tokenizer(args.model)

    class InstantBackend(RolloutBackend):
        """Returns ``reply`` for every prompt at no cost."""

        policy_version = 0

        def __init__(self, reply: str):
            self.ids = tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]

        def generate(self, prompts, sampling):
            return [Generation(list(self.ids), [-0.1] * len(self.ids), "stop") for _ in prompts]

        def load_weights(self, weights=None):
            pass

    workloads = [
        ("gsm8k 16 tasks x 4", "GSM8K-v0", {"split": "test"}, 16, 4, 1, args.reply),
        ("tau2 telecom solo 8 tasks x 8, 8 turns", "tau2/telecom-v0", {"split": "small", "user": "solo"}, 8, 8, 8,
         args.tau2_reply),
    ]
    rows = []
    for name, env_id, kw, n_tasks, n_samples, turns, reply in workloads:
        col = GroupCollector(lambda: gym.make(env_id, disable_env_checker=True, **kw), InstantBackend(reply), tok,
                             SamplingConfig(max_new_tokens=64), max_turns=turns, max_context_tokens=1 << 20)
        tasks = [{"index": i} for i in range(n_tasks)]
        col.collect(tasks, n_samples)  # warm-up: builds the envs
        pool = col._envs(n_tasks * n_samples)
        t_col, t_env, steps = [], [], 0
        for r in range(args.repeats):
            t0 = time.perf_counter()
            td = col.collect(tasks, n_samples, step=r + 1)
            t_col.append(time.perf_counter() - t0)
            steps = int(td["num_turns"].sum())
            t0 = time.perf_counter()
            done = [False] * len(pool)
            for i, e in enumerate(pool):
                e.reset(seed=r, options=dict(tasks[i // n_samples]))
            for _ in range(turns):
                for i, e in enumerate(pool):
                    if not done[i]:
                        _, _, term, trunc, _ = e.step(reply)
                        done[i] = term or trunc
            t_env.append(time.perf_counter() - t0)
        c, b = statistics.median(t_col) * 1e3, statistics.median(t_env) * 1e3
        rows.append({"workload": name, "episodes": n_tasks * n_samples, "env_steps": steps,
                     "collector_ms": round(c, 1), "bare_env_ms": round(b, 1), "ratio": round(c / b, 2),
                     "collector_ms_per_env_step": round(c / max(steps, 1), 3)})
        print(rows[-1], flush=True)
        (getattr(col, "shutdown", None) or col.close)()

    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    import tensordict
    import torchrl

    meta = {"command": "python benchmarks/collector_overhead.py " + " ".join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit.strip(),
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "torchrl": torchrl.__version__, "tensordict": tensordict.__version__},
            "threads": torch.get_num_threads(), "load_average": os.getloadavg(), "repeats": args.repeats}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# Collector overhead (zero-cost backend) vs the bare Gymnasium envs, commit {meta['commit']}", "",
             f"Command: `{meta['command']}` ({meta['date']}; torch {torch.__version__}, torchrl {torchrl.__version__}; "
             f"threads {meta['threads']}; load average {tuple(round(x, 2) for x in meta['load_average'])}; median of "
             f"{args.repeats})", "",
             "| workload | episodes | env steps | collector ms | bare env ms | collector/bare | collector ms per env step |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['workload']} | {r['episodes']} | {r['env_steps']} | {r['collector_ms']} | {r['bare_env_ms']} | "
              f"{r['ratio']} | {r['collector_ms_per_env_step']} |" for r in rows]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
