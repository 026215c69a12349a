#!/usr/bin/env python
"""Rollout throughput of each backend as a ratio to plain HF ``generate``, same model, prompts and batch, one run.

Workloads (real prompts, rendered with the model's chat template):

* ``gsm8k``: ``--gsm8k-prompts`` GSM8K test questions x ``--samples`` samples each (GRPO groups).
* ``tau2``: the opening prompt of ``--tau2-tasks`` tau2 ``mock`` tasks (domain policy + tool schemas; a shared
  system prefix) x ``--samples`` samples — the multi-turn agent case, where prefix reuse matters.

Backends: ``hf_generate`` (baseline: ``model.generate(do_sample=True)`` on the left-padded batch, the way a
plain HF loop or TRL samples), ``transformers`` (our :class:`TransformersBackend`: prefix-shared prefill, finished
rows dropped, behaviour log-probs returned), ``vllm_fp32`` / ``vllm_bf16`` (our :class:`VLLMBackend`, when vLLM is
importable — run this script from the vllm venv to include them).

Tokens/s counts sampled tokens up to and including the stop token (what a trainer gets), for every backend.
Each backend runs ``--repeats`` times after one warm-up; the median is reported. Results:
``benchmarks/results/rollout_bench.{json,md}``.

    GSM8K_DATA_DIR=<folder with train.jsonl/test.jsonl> python benchmarks/rollout_bench.py
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

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torchrl_grpo.backends.base import SamplingConfig  # noqa: E402
from torchrl_grpo.backends.transformers_backend import TransformersBackend  # noqa: E402
from torchrl_grpo.chat_tokens import ChatRenderer  # noqa: E402
from torchrl_grpo.models import load_model_and_tokenizer, resolve_model_path  # noqa: E402


def gsm8k_prompts(tok, n: int) -> list[list[int]]:
    import gymnasium as gym

    import envs

    gym.register_envs(envs)
    env = gym.make("GSM8K-v0", split="test").unwrapped
    ren = ChatRenderer(tok)
    out = []
    for i in range(n):
        obs, _ = env.reset(options={"index": i})
        out.append(ren.prompt_ids(obs))
    return out


def tau2_prompts(tok, n: int) -> list[list[int]]:
    import gymnasium as gym

    import envs

    gym.register_envs(envs)
    env = gym.make("tau2/mock-v0", split="base", user="solo").unwrapped
    out, i = [], 0
    while len(out) < n and i < len(env.tasks):
        try:
            obs, info = env.reset(options={"index": i})
            out.append(ChatRenderer(tok, info["tools"]).prompt_ids(obs))
        except ValueError:
            pass
        i += 1
    return out


def run_hf_generate(model, tok, prompts, sampling: SamplingConfig) -> int:
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), tok.pad_token_id, dtype=torch.long)
    am = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p)
        am[i, P - len(p):] = 1
    torch.manual_seed(sampling.seed or 0)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=am, do_sample=True, temperature=sampling.temperature,
                             top_p=sampling.top_p, top_k=0, max_new_tokens=sampling.max_new_tokens,
                             eos_token_id=sampling.stop_token_ids, pad_token_id=tok.pad_token_id)
    gen = out[:, P:]
    n = 0
    stops = set(sampling.stop_token_ids)
    for row in gen.tolist():
        for t in row:
            n += 1
            if t in stops:
                break
    return n


def timed(fn, repeats: int) -> tuple[float, float, int]:
    fn()  # warm-up
    rates, times, toks = [], [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        toks = fn()
        dt = time.perf_counter() - t0
        rates.append(toks / dt)
        times.append(dt)
    return statistics.median(rates), statistics.median(times), toks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--gsm8k-prompts", type=int, default=8)
    ap.add_argument("--tau2-tasks", type=int, default=2)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workloads", default="gsm8k,tau2")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rollout_bench"))
    args = ap.parse_args()

    model, tok = load_model_and_tokenizer(args.model, dtype="float32")
    stop = sorted(ChatRenderer(tok).end_of_turn_ids())
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0, stop_token_ids=stop, seed=0)
    vllm_engines = {}
    if not args.no_vllm:
        try:
            from torchrl_grpo.backends.vllm_backend import VLLMBackend

            path = resolve_model_path(args.model).path
            for dt in ("float32", "bfloat16"):
                t0 = time.perf_counter()
                vllm_engines[f"vllm_{'fp32' if dt == 'float32' else 'bf16'}"] = (VLLMBackend(path, tokenizer=tok, dtype=dt, max_model_len=4096, seed=0), time.perf_counter() - t0)
        except ImportError as exc:
            print(f"vLLM backend skipped: {exc}", file=sys.stderr)
    ours = TransformersBackend(model, pad_token_id=tok.pad_token_id)
    results = []
    for wl in args.workloads.split(","):
        base_prompts = gsm8k_prompts(tok, args.gsm8k_prompts) if wl == "gsm8k" else tau2_prompts(tok, args.tau2_tasks)
        prompts = [p for p in base_prompts for _ in range(args.samples)]
        rows = {}
        rate, secs, n = timed(lambda: run_hf_generate(model, tok, prompts, sampling), args.repeats)
        rows["hf_generate"] = {"tokens_per_s": rate, "seconds": secs, "tokens": n}

        def ours_run():
            ours._prefix = None  # fair: no prefix reuse across repeats, only within a call
            return sum(len(g.token_ids) for g in ours.generate(prompts, sampling))

        rate, secs, n = timed(ours_run, args.repeats)
        rows["transformers"] = {"tokens_per_s": rate, "seconds": secs, "tokens": n}
        for name, (eng, startup) in vllm_engines.items():
            rate, secs, n = timed(lambda: sum(len(g.token_ids) for g in eng.generate(prompts, sampling)), args.repeats)
            rows[name] = {"tokens_per_s": rate, "seconds": secs, "tokens": n, "startup_s": startup}
        base = rows["hf_generate"]["tokens_per_s"]
        for name, r in rows.items():
            r["ratio_vs_hf_generate"] = r["tokens_per_s"] / base
            print(f"{wl:6s} {name:13s} {r['tokens_per_s']:8.1f} tok/s  x{r['ratio_vs_hf_generate']:.2f}  "
                  f"({r['tokens']} tokens, {r['seconds']:.1f} s)")
        results.append({"workload": wl, "prompts": len(base_prompts), "samples": args.samples,
                        "prompt_tokens_mean": sum(map(len, base_prompts)) / len(base_prompts), "backends": rows})
    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": args.model, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
        "torch": torch.__version__, "python": platform.python_version(), "nproc": os.cpu_count(),
        "loadavg": os.getloadavg(), "threads": torch.get_num_threads(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    lines = ["# Rollout throughput vs HF generate", "", f"`{meta['command']}` — model {args.model}, "
             f"{args.max_new_tokens} new tokens, temperature 1.0, torch {meta['torch']}, {meta['nproc']} cores, "
             f"load avg {', '.join(f'{x:.1f}' for x in meta['loadavg'])}", "",
             "| workload | prompts x samples | prompt tokens | backend | tokens/s | x HF generate |", "|---|---|---|---|---|---|"]
    for r in results:
        for name, b in r["backends"].items():
            lines.append(f"| {r['workload']} | {r['prompts']} x {r['samples']} | {r['prompt_tokens_mean']:.0f} | {name} | "
                         f"{b['tokens_per_s']:.1f} | {b['ratio_vs_hf_generate']:.2f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
