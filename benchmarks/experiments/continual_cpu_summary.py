"""Markdown tables of the continual CPU runs (benchmarks/experiments/continual_cpu.sh): per run the R matrix with b, the transfer
summary, and every domain's greedy pass^1 with its n and 95% Wilson interval at each scoring point.

Usage: python benchmarks/experiments/continual_cpu_summary.py OUT_ROOT [ALGO ...]      (default algos: sequential replay)
Reads OUT_ROOT/<algo>/metrics.json and the run's eval.n_problems from OUT_ROOT/<algo>/checkpoint_task_0/config.yaml.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from stats import acc_wilson


def _f(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def run_tables(run: Path) -> str:
    m = json.loads((run / "metrics.json").read_text())
    cfg = yaml.safe_load((run / "checkpoint_task_0" / "config.yaml").read_text())
    n = int(cfg["eval"]["n_problems"])
    doms, R, b = m["task_order"], m["R"], m["b"]
    out = [f"### {m['algorithm']} (`{run}`)", "", f"R (metric: {m['metric']}; row i = after training on the i-th "
           "domain, column j = score on domain j; b = untrained model)", "",
           "| | " + " | ".join(doms) + " |", "|---|" + "---|" * len(doms),
           "| b (untrained) | " + " | ".join(_f(v) for v in b) + " |"]
    out += [f"| after {doms[i]} (step {m['boundaries'][i]}) | " + " | ".join(_f(v) for v in row) + " |"
            for i, row in enumerate(R) if row is not None]
    s = m.get("summary", {})
    out += ["", "| ACC | BWT | FWT | forgetting |", "|---|---|---|---|",
            "| " + " | ".join(_f(s.get(k)) for k in ("acc", "bwt", "fwt", "forgetting")) + " |", "",
            f"Greedy pass^1 (reward >= 1) per domain with n = {n} eval items and the 95% Wilson interval; mean reward "
            "beside it:", "", "| when | step | domain | pass^1 (k/n) [95% CI] | mean reward |", "|---|---|---|---|---|"]
    points = [("untrained", r) for r in m.get("base/eval", [])]
    for k in range(len(doms)):
        points += [(f"task {k} ({doms[k]})", r) for r in m.get(f"task_{k}/eval", [])]
    for when, r in points:
        out.append(f"| {when} | {r['step']} | {r['domain']} | {acc_wilson(r['pass^1'], n)} | {_f(r['reward_mean'])} |")
    out += ["", "Train steps:", "", "| step | domain | reward_mean (current domain) | batch reward (incl. replay) | "
            "replayed episodes | loss |", "|---|---|---|---|---|---|"]
    for k in range(len(doms)):
        for r in m.get(f"task_{k}/train", []):
            out.append(f"| {r['step']} | {r['domain']} | {_f(r['reward_mean'])} | {_f(r.get('reward_mean_batch'))} | "
                       f"{r.get('replayed_episodes', 0)} | {_f(r.get('loss'))} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    root = Path(argv[0])
    for algo in argv[1:] or ["sequential", "replay"]:
        if (root / algo / "metrics.json").is_file():
            print(run_tables(root / algo) + "\n")
        else:
            print(f"### {algo}: no metrics.json in {root / algo}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
