#!/usr/bin/env python
"""Greedy pass^1 of a tau2 run's evaluations on generated mock tasks, by sub-intent and by number of intents.

    python benchmarks/tau2_eval_breakdown.py <run_dir>/eval_episodes.jsonl [...]

Each ``eval_episodes.jsonl`` row (``step``, ``mode``, ``task_id``, ``reward``, ``tool_calls``,
``termination_reason``) is matched to its ``generated_test`` task (:mod:`envs.tau2.generated_tasks`), whose
``description.purpose`` names its sub-intents (``generated mock task (set_status+delete)``). Prints, per evaluation
(step, mode): n, pass^1 (reward >= 1.0), tool calls per episode, terminations, then solved / tasks for each intent
(a task with two intents counts in both) and for 1, 2 and 3 intents, and the episodes' write calls against their gold
(:func:`write_counts`); then the first greedy evaluation given against the last, task by task (:func:`mcnemar`: the
tasks solved by only one of them and the exact McNemar p-value). The table in benchmarks/results/tau2_mock_recipe.md
(run 3) is this script's output.
"""
from __future__ import annotations

import collections
import json
import os
import sys

from envs.tau2.generated_tasks import generate_split
from envs.tau2.generated_tasks import intents as generated_intents
# the instruments' shared statistics: the package experiments/ beside this script (benchmarks/ is sys.path[0])
from experiments.stats import mcnemar_exact, paired_counts


def intents(task: dict | None) -> list[str]:
    """The sub-intents of a generated task (:func:`envs.tau2.generated_tasks.intents`; ``["?"]`` for a task not in
    ``generated_test``)."""
    return ["?"] if task is None else list(generated_intents(task))


def mcnemar(first: dict[str, float], last: dict[str, float]) -> dict:
    """Paired comparison of two greedy evaluations on the same tasks (``{task_id: reward}``; solved: reward >= 1.0):
    ``{"n", "both", "neither", "only_first", "only_last", "p"}``, ``p`` the exact two-sided McNemar p-value of the
    discordant counts (:func:`experiments.stats.mcnemar_exact`; McNemar 1947, Psychometrika 12(2), exact form: Fay
    2010, R Journal 2(1)). Tasks in only one of the two are left out."""
    m = paired_counts({i: r >= 1.0 for i, r in first.items()}, {i: r >= 1.0 for i, r in last.items()})
    return {**m, "p": mcnemar_exact(m["only_first"], m["only_last"])}


#: The mock domain's WRITE tools (tau2's ``ToolType.WRITE``; ``get_domain("mock").write_tool_names``, checked by
#: tests/test_tau2_eval_breakdown.py): what an episode changes the database with.
WRITE_TOOLS = frozenset({"create_task", "update_task_status"})
TRANSFER_TOOL = "transfer_to_human_agents"


def write_counts(rows: list[dict], tasks: dict[str, dict]) -> dict[str, int]:
    """How many write calls the episodes made against their task's gold, counted by name, not arguments
    (:data:`WRITE_TOOLS`; a call that failed counts too): ``{"more", "fewer"}`` episodes with more / fewer write calls
    than their gold's write actions, ``"beyond"`` the write calls past the gold's count and ``"short"`` the gold's
    write actions past the episode's (summed over episodes), ``"update_task_status"`` calls, and ``"transfer"``
    episodes that called :data:`TRANSFER_TOOL`. A task not in ``tasks`` counts as a gold of no writes."""
    out = dict.fromkeys(("more", "fewer", "beyond", "short", "update_task_status", "transfer"), 0)
    for r in rows:
        task = tasks.get(r["task_id"]) or {}
        gold = sum(a.get("name") in WRITE_TOOLS for a in (task.get("evaluation_criteria") or {}).get("actions") or [])
        names = [c.get("name") for c in r["tool_calls"]]
        made = sum(n in WRITE_TOOLS for n in names)
        out["more"] += made > gold
        out["fewer"] += made < gold
        out["beyond"] += max(0, made - gold)
        out["short"] += max(0, gold - made)
        out["update_task_status"] += names.count("update_task_status")
        out["transfer"] += TRANSFER_TOOL in names
    return out


def breakdown(rows: list[dict], tasks: dict[str, dict]) -> dict:
    """``{(step, mode): {"n", "pass^1", "calls_per_episode", "terminations", "by": {key: [solved, n]},
    "writes": write_counts(...)}}``."""
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
                    "by": dict(sorted(by.items())), "writes": write_counts(rs, tasks)}
    return out


def main(paths: list[str]) -> None:
    """Print the breakdown of each ``eval_episodes.jsonl`` in ``paths``.

    Raises:
        SystemExit: with the usage for no path or ``-h`` / ``--help``; naming the file for a path that is missing.
    """
    if not paths or any(p in ("-h", "--help") for p in paths):
        raise SystemExit(__doc__)
    for path in paths:
        if not os.path.isfile(path):
            raise SystemExit(f"tau2_eval_breakdown: no such file: {path}")
    tasks = {t["id"]: t for t in generate_split("generated_test")}
    greedy: list[tuple[str, dict[str, float]]] = []  # every greedy evaluation, in the order given
    for path in paths:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for (step, mode), b in breakdown(rows, tasks).items():
            print(f"{path} step {step} {mode}: n={b['n']} pass^1={b['pass^1']:.3f} "
                  f"calls/episode={b['calls_per_episode']:.2f} {b['terminations']}")
            print("    " + ", ".join(f"{k} {s}/{n}" for k, (s, n) in b["by"].items()))
            w = b["writes"]
            print(f"    write calls against the gold: episodes with more {w['more']}, fewer {w['fewer']}; calls beyond "
                  f"{w['beyond']}, gold writes short {w['short']}; update_task_status {w['update_task_status']}; "
                  f"episodes transferring {w['transfer']}")
            if mode == "greedy":
                greedy.append((f"{path} step {step}", {r["task_id"]: r["reward"] for r in rows
                                                       if r["step"] == step and r["mode"] == mode}))
    if len(greedy) >= 2:  # the first evaluation given against the last, task by task
        (name_a, a), (name_b, b) = greedy[0], greedy[-1]
        m = mcnemar(a, b)
        print(f"paired ({name_a} -> {name_b}): n={m['n']} solved by both {m['both']}, neither {m['neither']}, "
              f"only the first {m['only_first']}, only the last {m['only_last']}; exact McNemar p={m['p']:.3g}")


if __name__ == "__main__":
    main(sys.argv[1:])
