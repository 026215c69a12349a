#!/usr/bin/env python
"""GQA decode attention (torchrl_grpo/backends/decode_attention.py) vs transformers' SDPA path, one process.

    python benchmarks/decode_attention_bench.py            # SmolLM2-135M, 16 rows x 96 tokens, 3 alternating reps

Same backend, same prompts and seed, toggled by ``TransformersBackend(gqa_decode=...)``; prints per-rep seconds, the
median ratio plain/gqa, and writes ``benchmarks/results/decode_attention_bench.json``. Both paths generate the same
tokens (tests/test_transformers_backend.py checks it).
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from torchrl_grpo.backends.base import SamplingConfig
from torchrl_grpo.backends.transformers_backend import TransformersBackend
from torchrl_grpo.models import load_model_and_tokenizer


def main() -> None:
    m, tok = load_model_and_tokenizer("smollm2-135m-instruct")
    p1 = tok.encode("Question: A farmer has 12 cows and buys 7 more. Each cow gives 3 litres a day. "
                    "How much milk per week? Think step by step." * 2)
    p2 = tok.encode("Question: Tom reads 20 pages a day for 9 days and then 35 pages a day. "
                    "How many pages after two weeks?" * 2)
    prompts = [p1] * 8 + [p2] * 8
    sc = SamplingConfig(max_new_tokens=96, temperature=1.0, seed=0)  # no stop tokens: every row runs 96 steps
    res: dict[str, list[float]] = {"plain": [], "gqa": []}
    for rep in range(3):
        for name, flag in (("plain", False), ("gqa", True)):
            be = TransformersBackend(m, pad_token_id=tok.pad_token_id, gqa_decode=flag)
            t = time.perf_counter()
            be.generate(prompts, sc)
            res[name].append(time.perf_counter() - t)
            print(f"rep {rep} {name}: {res[name][-1]:.2f}s", flush=True)
    ratio = statistics.median(res["plain"]) / statistics.median(res["gqa"])
    print(f"median plain {statistics.median(res['plain']):.2f}s, gqa {statistics.median(res['gqa']):.2f}s, "
          f"speed-up {ratio:.2f}x")
    out = Path(__file__).resolve().parent / "results" / "decode_attention_bench.json"
    out.write_text(json.dumps({"seconds": res, "speedup_median": ratio, "rows": 16, "new_tokens": 96}, indent=1))


if __name__ == "__main__":
    main()
