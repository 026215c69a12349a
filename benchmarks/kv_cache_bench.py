#!/usr/bin/env python
"""Decode with a preallocated KV cache vs transformers' DynamicCache, same backend, same prompts, one process.

:class:`~torchrl_grpo.backends.transformers_backend.TransformersBackend` with ``preallocate_kv=True``
(:mod:`torchrl_grpo.backends.kv_cache`: keys/values written in place) vs ``preallocate_kv=False`` (``torch.cat`` of the
whole cache at every step), in the ``train_bench`` GSM8K setting by default: SmolLM2-135M-Instruct fp32, 2 GSM8K
train prompts x 8 samples, 128 new tokens, temperature 1, the chat template's stop tokens. Both paths draw the same
seeded samples (the cache holds the same numbers), so they do identical work; the script checks the tokens match.
The two run alternately ``--repeats`` times after a warm-up; medians are reported.

    python benchmarks/kv_cache_bench.py            # -> benchmarks/results/kv_cache_bench.{json,md}
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "kv_cache_bench"))
    args = ap.parse_args()

    import gymnasium as gym
    import torch
    import transformers

    import envs
    from torchrl_grpo.backends.base import SamplingConfig
    from torchrl_grpo.backends.transformers_backend import TransformersBackend
    from torchrl_grpo.rollout.chat_tokens import ChatRenderer
    from torchrl_grpo.models import load_model_and_tokenizer

    gym.register_envs(envs)
    load_before = os.getloadavg()
    model, tok = load_model_and_tokenizer(args.model, dtype=args.dtype)
    env = gym.make("GSM8K-v0", split="train").unwrapped
    ren = ChatRenderer(tok)
    base = []
    for i in range(args.prompts):
        obs, _ = env.reset(options={"index": i})
        base.append(ren.prompt_ids(obs))
    rows = [p for p in base for _ in range(args.samples)]
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0,
                              stop_token_ids=sorted(ren.end_of_turn_ids()), seed=0)
    backends = {"dynamic_cache": TransformersBackend(model, pad_token_id=tok.pad_token_id, preallocate_kv=False),
                "preallocated": TransformersBackend(model, pad_token_id=tok.pad_token_id, preallocate_kv=True)}
    times: dict[str, list[float]] = {k: [] for k in backends}
    tokens: dict[str, list] = {}
    for be in backends.values():
        be.generate(rows, sampling)  # warm-up
    for r in range(args.repeats):
        for name, be in backends.items():
            t0 = time.perf_counter()
            gens = be.generate(rows, sampling)
            times[name].append(time.perf_counter() - t0)
            tokens[name] = [g.token_ids for g in gens]
            print(f"{name} repeat {r}: {times[name][-1]:.2f} s", flush=True)
    same = tokens["dynamic_cache"] == tokens["preallocated"]
    n = sum(map(len, tokens["preallocated"]))
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["dynamic_cache"] / med["preallocated"]
    meta = {"command": "python benchmarks/kv_cache_bench.py " + " ".join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "model": args.model, "dtype": args.dtype,
            "prompts": args.prompts, "samples": args.samples, "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads(), "nproc": os.cpu_count(),
            "load_before": load_before, "load_after": os.getloadavg()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "seconds": times, "median_s": med,
                                                    "generated_tokens": n, "identical_tokens": same,
                                                    "speedup": ratio}, indent=2))
    lines = ["# Decode: preallocated KV cache vs DynamicCache (TransformersBackend)", "",
             f"Command: `{meta['command']}`  ", f"Date: {meta['date']}  ",
             f"Machine: {meta['nproc']} cores, torch threads {meta['threads']}; load average before "
             f"{tuple(round(x, 2) for x in load_before)}, after {tuple(round(x, 2) for x in meta['load_after'])}  ",
             f"Versions: python {meta['python']}, torch {meta['torch']}, transformers {meta['transformers']}  ",
             f"Settings: {args.model} {args.dtype}, {args.prompts} GSM8K train prompts x {args.samples} samples, "
             f"{args.max_new_tokens} new tokens, temperature 1, stop tokens on; {n} generated tokens per call; "
             f"same tokens on both paths: {same}; median of {args.repeats} alternating runs after a warm-up", "",
             "| KV cache | median s | generated tokens/s | speedup |", "|---|---:|---:|---:|"]
    for k in backends:
        lines.append(f"| {k} | {med[k]:.2f} | {n / med[k]:.1f} | {med['dynamic_cache'] / med[k]:.2f}x |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"speedup {ratio:.3f}x, identical tokens {same}; wrote {out.with_suffix('.md')}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
