#!/usr/bin/env python
"""Which ReasoningGym-v1 tasks / levels can a small model learn from? Base accuracy and GRPO signal per candidate.

GRPO learns only from groups whose samples differ in reward. For each candidate (a reasoning_gym task with a
``task_config`` or a curriculum ``level``) this plays the first ``--prompts`` problems of the env's split through
the env itself (its prompt, its extraction, the library's score): greedy accuracy, then ``--samples`` samples per
problem at temperature 1: mean reward, the fraction of groups with reward variance, and the fraction of samples cut
at ``--max-new-tokens``. One process, the transformers rollout backend. It measures accuracy, not speed.

    python benchmarks/reasoning_gym_probe.py --model smollm2-135m-instruct --prompts 12 --samples 8 \\
        --max-new-tokens 48 --out benchmarks/results/reasoning_gym_probe.md \\
        chain_sum:'{"min_terms":2,"max_terms":2,"min_digits":1,"max_digits":2}' \\
        products:'{"min_digits":1,"max_digits":1}' gcd@0 basic_arithmetic@0

A candidate is ``task`` (library defaults), ``task@LEVEL`` (the curriculum's global level) or ``task:JSON`` (a
``task_config``).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import gymnasium as gym
import torch

ROOT = Path(__file__).resolve().parents[1]

import envs  # noqa: E402
from torchrl_grpo.backends.base import SamplingConfig  # noqa: E402
from torchrl_grpo.backends.transformers_backend import TransformersBackend  # noqa: E402
from torchrl_grpo.rollout.chat_tokens import ChatRenderer  # noqa: E402
from torchrl_grpo.model_store import load_model_and_tokenizer  # noqa: E402

gym.register_envs(envs)


def parse_candidate(text: str) -> dict:
    """``"gcd@0"`` -> ``{"task": "gcd", "level": 0}``; ``'products:{"max_digits": 1}'`` -> with ``task_config``.

    Raises:
        ValueError: a level that is not an int, or a config that is not a JSON object.
    """
    if ":" in text:
        name, cfg = text.split(":", 1)
        cfg = json.loads(cfg)
        if not isinstance(cfg, dict):
            raise ValueError(f"candidate {text!r}: the config must be a JSON object")
        return {"task": name, "task_config": cfg}
    if "@" in text:
        name, level = text.split("@", 1)
        return {"task": name, "level": int(level)}
    return {"task": text}


def probe(be, tok, kw: dict, *, split: str, prompts: int, samples: int, max_new_tokens: int, seed: int,
          train_size: int) -> dict:
    """Greedy and sampled results of one candidate (``kw``: ``gym.make`` kwargs) on the split's first problems."""
    env = gym.make("ReasoningGym-v1", split=split, train_size=train_size, test_size=prompts, **kw).unwrapped
    ren = ChatRenderer(tok)
    stops = sorted(ren.end_of_turn_ids())
    idx = env.usable_task_indices(prompts)
    obs = [env.reset(options={"index": i})[0] for i in idx]
    ids = [ren.prompt_ids(o) for o in obs]
    out = {"config": env.spec_tasks.configs()}
    for name, temp, k in (("greedy", 0.0, 1), ("sampled", 1.0, samples)):
        t0 = time.perf_counter()
        gens = be.generate([p for p in ids for _ in range(k)],
                           SamplingConfig(max_new_tokens=max_new_tokens, temperature=temp, stop_token_ids=stops,
                                          seed=seed))
        rewards, examples = [], []
        for j, g in enumerate(gens):
            env.reset(options={"index": idx[j // k]})
            text = tok.decode(g.token_ids, skip_special_tokens=True)
            _, r, *_, info = env.step(text)
            rewards.append(float(r))
            if len(examples) < 2:
                examples.append({"answer": info["answer"], "extracted": info["extracted"], "text": text[-120:]})
        groups = [rewards[i:i + k] for i in range(0, len(rewards), k)]
        out[name] = {"mean_reward": sum(rewards) / len(rewards),
                     "solved": sum(r == 1.0 for r in rewards) / len(rewards),
                     "groups_with_variance": sum(len(set(g)) > 1 for g in groups) / len(groups),
                     "truncated": sum(g.finish_reason == "length" for g in gens) / len(gens),
                     "time_s": time.perf_counter() - t0, "examples": examples}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("candidates", nargs="+", help="task | task@LEVEL | task:JSON_CONFIG")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--split", default="test", choices=("train", "test"))
    ap.add_argument("--train-size", type=int, default=1000, help="train problems (only sizes the train split; the hash partition keeps test disjoint)")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--samples", type=int, default=8, help="sampled completions per problem (temperature 1)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="append a markdown table (and the command) to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cands = [(c, parse_candidate(c)) for c in args.candidates]
    model, tok = load_model_and_tokenizer(args.model)
    be = TransformersBackend(model, pad_token_id=tok.pad_token_id, max_batch_size=64)
    rows = []
    for text, kw in cands:
        res = probe(be, tok, kw, split=args.split, prompts=args.prompts, samples=args.samples,
                    max_new_tokens=args.max_new_tokens, seed=args.seed, train_size=args.train_size)
        g, s = res["greedy"], res["sampled"]
        row = (f"| {text} | {g['solved']:.2f} | {s['mean_reward']:.3f} | {s['solved']:.3f} | "
               f"{s['groups_with_variance']:.2f} | {s['truncated']:.2f} | {g['time_s'] + s['time_s']:.0f} |")
        rows.append(row)
        print(row, json.dumps({"config": res["config"], "greedy_examples": g["examples"]}), flush=True)
    header = ["| candidate | greedy accuracy | sampled mean reward | sampled solved | groups with variance | "
              "truncated | time s |", "|---|---|---|---|---|---|---|"]
    table = "\n".join(header + rows)
    print(table)
    if args.out:
        cmd = "python benchmarks/reasoning_gym_probe.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
        with open(args.out, "a") as f:
            f.write(f"\n## {args.model}, split {args.split}, {args.prompts} problems x {args.samples} samples, "
                    f"{args.max_new_tokens} new tokens\n\n```\n{cmd}\n```\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
