#!/usr/bin/env python
"""vLLM rollout backend: engine start-up, rollout tokens/s and weight-sync time and correctness, one process.

Needs vLLM (run it with the interpreter of the venv built by ``benchmarks/vllm_env.sh``)::

    $VLLM_VENV/bin/python benchmarks/vllm_backend_bench.py --model smollm2-135m-instruct
    $VLLM_VENV/bin/python benchmarks/vllm_backend_bench.py --prompts 2 --samples 2 --max-new-tokens 16 --repeats 1

Steps: load the trainer copy (float32 HF) and the engine (``--dtype``); one warm-up ``generate``;
``--repeats`` timed ``generate`` calls over ``--prompts`` GSM8K-style questions x ``--samples`` samples,
``--max-new-tokens`` each (no stop token: fixed length); then :func:`check_weight_sync` (log-prob gap, nats
per token, between engine and trainer copy) before any sync, after scaling every ``mlp.down_proj`` of the
trainer copy by 1.05 (``stale``: the engine still has the old weights, so the gap includes the change), after a
float32 ``state_dict`` sync and after a bf16 :func:`export_hf_weights` sync (back to numeric noise), with the
sync times (s).
Prints the results as JSON on stdout (nothing is written to ``benchmarks/results/``).

Moved here from ``torchrl_grpo/backends/vllm_backend.py`` (``python -m torchrl_grpo.backends.vllm_backend``),
unchanged but for ``dataclasses.replace`` to copy the ``SamplingConfig``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from torchrl_grpo.backends.base import SamplingConfig
from torchrl_grpo.backends.vllm_backend import VLLMBackend, check_weight_sync
from torchrl_grpo.models import load_model_and_tokenizer
from torchrl_grpo.backends.weight_sync import export_hf_weights

_BENCH_QUESTIONS = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
    "Betty is saving money for a new wallet which costs $100. She has only half of the money she needs. "
    "Her parents give her $15 and her grandparents twice as much. How much more money does she need?",
    "Julie is reading a 120-page book. Yesterday, she read 12 pages and today twice as many. "
    "If she wants to read half of the remaining pages tomorrow, how many pages should she read?",
    "James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
    "Albert buys 2 large pizzas and 2 small pizzas. A large pizza has 16 slices and a small pizza has 8 slices. "
    "How many slices does he eat if he eats them all?",
    "Ken created a care package. He put a box on a scale and poured jelly beans to bring the weight to 2 pounds. "
    "Then he added brownies to triple the weight. What is the final weight?",
    "Alexis bought a blouse for $30, shoes for $41 and a belt for $18 and has $16 left from her $200 budget. "
    "How much did she pay for the shoes?",
)


def bench(argv: list[str] | None = None) -> dict:
    """Run the measurement described in the module docstring; return the results as a dict."""
    import argparse

    ap = argparse.ArgumentParser(description="Measure the vLLM backend: start-up, rollout tokens/s, weight sync.")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="alias or local HF directory")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8, help="samples per prompt (group size)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-seed", action="store_true", help="sample from the engine RNG (no per-request seeds)")
    args = ap.parse_args(argv)

    model, tok = load_model_and_tokenizer(args.model, dtype="float32")
    backend = VLLMBackend(args.model, dtype=args.dtype, max_model_len=args.max_model_len)
    res: dict[str, Any] = {"model": args.model, "dtype": args.dtype, "startup_s": round(backend.startup_seconds, 2),
                           "torch_threads": torch.get_num_threads(), "seeded": not args.no_seed,
                           "load_avg_start": os.getloadavg()[0]}
    prompts = []
    for i in range(args.prompts):
        q = _BENCH_QUESTIONS[i % len(_BENCH_QUESTIONS)]
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    batch = [p for p in prompts for _ in range(args.samples)]
    cfg = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0)  # no stop: fixed length
    backend.generate(batch[:2], SamplingConfig(max_new_tokens=4, temperature=1.0, seed=0))  # warm-up
    runs = []
    for r in range(args.repeats):
        t0 = time.perf_counter()
        gens = backend.generate(batch, dataclasses.replace(cfg, seed=None if args.no_seed else r))
        dt = time.perf_counter() - t0
        n = sum(len(g.token_ids) for g in gens)
        runs.append({"seconds": round(dt, 2), "new_tokens": n, "tokens_per_s": round(n / dt, 1)})
    res["load_avg_end"] = os.getloadavg()[0]
    res["rollout"] = {"batch": f"{args.prompts} prompts x {args.samples} samples x {args.max_new_tokens} tokens",
                      "runs": runs, "best_tokens_per_s": max(x["tokens_per_s"] for x in runs)}
    seq = prompts[0] + gens[0].token_ids[:48]
    res["before_sync"] = check_weight_sync(backend, model, seq)
    with torch.no_grad():  # a visible change: the trainer "learned" something
        for n, p in model.named_parameters():
            if "mlp.down_proj" in n:
                p.mul_(1.05)
    res["stale"] = check_weight_sync(backend, model, seq)
    backend.load_weights(model.state_dict())
    res["sync_fp32_state_dict_s"] = round(backend.last_sync_seconds or 0.0, 3)
    res["after_sync"] = check_weight_sync(backend, model, seq)
    backend.load_weights(export_hf_weights(model, dtype=torch.bfloat16))
    res["sync_bf16_export_s"] = round(backend.last_sync_seconds or 0.0, 3)
    res["after_bf16_sync"] = check_weight_sync(backend, model, seq)
    res["policy_version"] = backend.policy_version
    backend.close()
    return res


if __name__ == "__main__":  # pragma: no cover - manual benchmark
    print(json.dumps(bench(), indent=2))
