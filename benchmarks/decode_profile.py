"""Where the transformers backend's decode time goes: torch.profiler over one ``generate`` call (issue 12, target 4).

Usage: python benchmarks/decode_profile.py [--model smollm2-135m-instruct] [--rows 16] [--tokens 128]

``rows`` copies of a GSM8K-style prompt (two distinct prompts, half the rows each), ``tokens`` new tokens each with no
stop token (every row decodes every step), temperature 1. One warm-up call, one timed call, one profiled call;
prints tokens/s and the top operators by self CPU time. Run it alone on the machine (2 shared cores).
"""
from __future__ import annotations

import argparse
import time

from torch.profiler import ProfilerActivity, profile

from torchrl_grpo.backends.base import SamplingConfig
from torchrl_grpo.backends.transformers_backend import TransformersBackend
from torchrl_grpo.models import load_model_and_tokenizer

QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May?")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    model, tok = load_model_and_tokenizer(a.model)
    backend = TransformersBackend(model, pad_token_id=tok.pad_token_id, share_module=True)
    p = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True)
    p = list(p["input_ids"] if hasattr(p, "keys") else p)
    prompts = [p] * (a.rows // 2) + [p[:-3] + p[-3:]] * (a.rows - a.rows // 2)
    s = SamplingConfig(max_new_tokens=a.tokens, temperature=1.0, seed=1, stop_token_ids=[])
    backend.generate(prompts, s)  # warm-up
    t0 = time.perf_counter()
    g = backend.generate(prompts, s)
    dt = time.perf_counter() - t0
    n = sum(len(x.token_ids) for x in g)
    print(f"wall {dt:.2f} s, {n} tokens, {n / dt:.1f} tok/s ({a.rows} rows x {a.tokens} steps)")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        backend.generate(prompts, s)
        print(f"profiled call: {time.perf_counter() - t0:.2f} s")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=50))


if __name__ == "__main__":
    main()
