#!/usr/bin/env python
"""Greedy pass^1 of a tau2 run's evaluations on generated mock tasks, by sub-intent and by number of intents.

    python benchmarks/tau2_eval_breakdown.py <run_dir>/eval_episodes.jsonl [...]

Each ``eval_episodes.jsonl`` row (``step``, ``mode``, ``task_id``, ``reward``, ``tool_calls``,
``termination_reason``) is matched to its ``generated_test`` task (:mod:`envs.tau2.generated_tasks`), whose
``description.purpose`` names its sub-intents (``generated mock task (set_status+delete)``). Prints, per evaluation
(step, mode): n, pass^1 (reward >= 1.0), tool calls per episode, terminations, then solved / tasks for each intent
(a task with two intents counts in both) and for 1, 2 and 3 intents. The table in
benchmarks/results/tau2_mock_recipe.md (run 3) is this script's output.
"""
from __future__ import annotations

import collections
import json
import sys

from envs.tau2.generated_tasks import generate_split


def intents(task: dict | None) -> list[str]:
    """The sub-intents of a generated task (``["?"]`` for a task not in ``generated_test``)."""
    if task is None:
        return ["?"]
    return task["description"]["purpose"].split("(", 1)[1].rstrip(")").split("+")


def breakdown(rows: list[dict], tasks: dict[str, dict]) -> dict:
    """``{(step, mode): {"n", "pass^1", "calls_per_episode", "terminations", "by": {key: [solved, n]}}}``."""
    groups: dict[tuple, list[dict]] = collections.defaultdict(list)
    for r in rows:
        groups[(r["step"], r["mode"])].append(r)
    out = {}
    for key, rs in sorted(groups.items()):
        by: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for r in rs:
            kinds = intents(tasks.get(r["task_id"]))
            for k in {f"{len(kinds)} intents", *kinds}:
                by[k][0] += r["reward"] >= 1.0
                by[k][1] += 1
        out[key] = {"n": len(rs), "pass^1": sum(r["reward"] >= 1.0 for r in rs) / len(rs),
                    "calls_per_episode": sum(len(r["tool_calls"]) for r in rs) / len(rs),
                    "terminations": dict(collections.Counter(r["termination_reason"] for r in rs)),
                    "by": dict(sorted(by.items()))}
    return out


def main(paths: list[str]) -> None:
    tasks = {t["id"]: t for t in generate_split("generated_test")}
    for path in paths:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for (step, mode), b in breakdown(rows, tasks).items():
            print(f"{path} step {step} {mode}: n={b['n']} pass^1={b['pass^1']:.3f} "
                  f"calls/episode={b['calls_per_episode']:.2f} {b['terminations']}")
            print("    " + ", ".join(f"{k} {s}/{n}" for k, (s, n) in b["by"].items()))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    main(sys.argv[1:])
