#!/usr/bin/env python
"""How often does an untrained model succeed on a task? GRPO learns only from groups whose samples differ in reward,
so a model with (almost) no successes gives (almost) no signal: this probe says whether a 10-minute CPU run can learn.

* ``--task gsm8k``: GSM8K train problems bucketed by reasoning steps (non-``####`` lines of the gold solution; 2 is the
  easiest bucket GSM8K has), greedy and sampled accuracy with the env's prompt (system prompt + question, chat template)
  and grader (correctness only).
* ``--task ifeval``: IFBench train prompts of ``IFEval-v0`` (the shipped offline data), sampled strict
  instruction-following per prompt and per instruction id.

Both print the mean success, the groups (``--samples`` per prompt) with reward variance, the fraction of samples cut
at ``--max-new-tokens``, and the wall time. One process, the transformers rollout backend.

    python benchmarks/base_success_probe.py --task gsm8k --prompts 24 --max-new-tokens 256
    python benchmarks/base_success_probe.py --task ifeval --prompts 64 --samples 4 --max-new-tokens 192
"""
from __future__ import annotations

import argparse
import collections
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs.gsm8k.data import load_gsm8k  # noqa: E402
from envs.gsm8k.env import DEFAULT_SYSTEM_PROMPT  # noqa: E402
from envs.gsm8k.grading import gsm8k_reward  # noqa: E402
from torchrl_grpo.backends.base import SamplingConfig  # noqa: E402
from torchrl_grpo.backends.transformers_backend import TransformersBackend  # noqa: E402
from torchrl_grpo.rollout.chat_tokens import ChatRenderer  # noqa: E402
from torchrl_grpo.models import load_model_and_tokenizer  # noqa: E402


def reasoning_steps(problem: dict) -> int:
    """Lines of the gold solution before its ``#### N`` line (GSM8K's own step count, 2-9)."""
    return sum(1 for line in problem["solution"].split("\n") if line.strip() and not line.startswith("####"))


def _summary(name: str, rewards: list[float], k: int, gens, t: float) -> str:
    groups = [rewards[i:i + k] for i in range(0, len(rewards), k)]
    trunc = sum(g.finish_reason == "length" for g in gens) / len(gens)
    return (f"{name}: mean success {sum(rewards) / len(rewards):.3f}, groups with reward variance "
            f"{sum(len(set(g)) > 1 for g in groups)}/{len(groups)}, truncated {trunc:.2f}, {t:.0f} s")


def probe_gsm8k(be, tok, args) -> None:
    ren = ChatRenderer(tok)
    stops = sorted(ren.end_of_turn_ids())
    problems = load_gsm8k(split="train")
    for steps in args.steps:
        pool = [p for p in problems if reasoning_steps(p) == steps]
        sel = random.Random(args.seed).sample(pool, args.prompts)
        prompts = [ren.prompt_ids([{"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
                                   {"role": "user", "content": p["question"]}]) for p in sel]
        for temp, k in ((0.0, 1), (1.0, args.samples)):
            t0 = time.perf_counter()
            gens = be.generate([p for p in prompts for _ in range(k)],
                               SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=temp,
                                              stop_token_ids=stops, seed=args.seed))
            rewards = [gsm8k_reward(tok.decode(g.token_ids, skip_special_tokens=True), sel[i // k]["answer"])[0]
                       for i, g in enumerate(gens)]
            print(_summary(f"gsm8k {steps}-step (pool {len(pool)}), {'greedy' if temp == 0 else f'{k} samples'}",
                           rewards, k, gens, time.perf_counter() - t0), flush=True)


def probe_ifeval(be, tok, args) -> None:
    from envs.ifeval.data import load_prompts
    from envs.ifeval.grading import instruction_available, score_response

    ren = ChatRenderer(tok)
    rows = [r for r in load_prompts("train") if all(instruction_available(i) for i in r["instruction_id_list"])]
    sel = random.Random(args.seed).sample(rows, min(args.prompts, len(rows)))
    k = args.samples
    prompts = [ren.prompt_ids([{"role": "user", "content": r["prompt"]}]) for r in sel]
    t0 = time.perf_counter()
    gens = be.generate([p for p in prompts for _ in range(k)],
                       SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0,
                                      stop_token_ids=sorted(ren.end_of_turn_ids()), seed=args.seed))
    rewards, per_id = [], collections.defaultdict(list)
    for i, g in enumerate(gens):
        r = sel[i // k]
        s = score_response(tok.decode(g.token_ids, skip_special_tokens=True), r["instruction_id_list"], r["kwargs"],
                           r["prompt"])
        rewards.append(s["strict"])
        for ins in s["instructions"]:
            per_id[ins["instruction_id"]].append(float(ins["strict"]))
    print(_summary(f"ifeval ({len(sel)} IFBench train prompts), {k} samples", rewards, k, gens,
                   time.perf_counter() - t0), flush=True)
    for iid, v in sorted(per_id.items(), key=lambda x: -sum(x[1]) / len(x[1])):
        if sum(v):
            print(f"  {iid:45s} {sum(v) / len(v):.2f} ({len(v)} samples)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", choices=("gsm8k", "ifeval"), default="gsm8k")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=24, help="prompts (per bucket for gsm8k)")
    ap.add_argument("--samples", type=int, default=4, help="sampled completions per prompt (temperature 1)")
    ap.add_argument("--steps", type=int, nargs="+", default=[2, 3], help="gsm8k: reasoning-step buckets")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer(args.model)
    be = TransformersBackend(model, pad_token_id=tok.pad_token_id, max_batch_size=64)
    (probe_gsm8k if args.task == "gsm8k" else probe_ifeval)(be, tok, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
