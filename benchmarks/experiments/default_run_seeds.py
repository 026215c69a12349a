#!/usr/bin/env python
"""Does the default ``python grpo.py`` visibly learn? One run per seed, then a table and a PNG (issue 26, section 2).

    R=outputs/default_run
    python benchmarks/experiments/default_run_seeds.py run --seed 1 --out-root $R        # one full default run into $R/seed1/
    python benchmarks/experiments/default_run_seeds.py run --seed 2 --out-root $R
    python benchmarks/experiments/default_run_seeds.py run --seed 3 --out-root $R
    python benchmarks/experiments/default_run_seeds.py summary $R --write benchmarks/results/default_run

``run`` is exactly ``python grpo.py seed=N`` (plus ``hydra.run.dir`` and any ``--override``), timed from process start
to exit, with the machine's load average before and after (run it alone: two OpenMP processes on 2 cores collapse
decode speed). Its ``result.json`` holds the evaluation before training (step 0) and after (the last step), the
per-step train reward, wall seconds, the commit and the command.

``summary``: per seed, greedy accuracy before -> after on the ``n`` held-out items with Wilson 95% intervals (Wilson
1927) and whether the two intervals are disjoint (the issue's criterion for "outside noise"), the change's mean and
Student-t 95% interval across seeds, and the PNG: eval accuracy vs step (one line per seed, Wilson bands) and train
reward vs step. Running, metrics and outputs: :mod:`harness`; the intervals: :mod:`stats` (this folder).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from harness import REPO, evaluations, git_commit, load_json, pyplot, read_metrics, run_logged, utc_date, write_outputs
from stats import mean_ci, wilson_yerr

from torchrl_grpo.reporting.learning_curve import wilson_interval


def run_result(run_dir: Path) -> dict:
    """Before/after evaluation and per-step train reward of a finished run's ``metrics.jsonl``.

    Raises:
        RuntimeError: the run logged fewer than two evaluations (no before/after to compare).
    """
    rows = read_metrics(run_dir)
    ev = evaluations(rows)
    if len(ev) < 2:
        raise RuntimeError(f"{run_dir}: need an evaluation before and after training, found {len(ev)}")
    train = [{"step": int(r["step"]), "reward": float(r["reward/mean"]),
              "response_tokens": r.get("episode/response_tokens")} for r in rows if "reward/mean" in r and "step" in r]
    return {"before": ev[0], "after": ev[-1], "evals": ev, "train": train}


def cmd_run(a) -> dict:
    d = Path(a.out_root) / f"seed{a.seed}"
    d.mkdir(parents=True, exist_ok=True)
    flags = [o for o in a.override if o.startswith("--")]  # Hydra's own flags (--config-name=...) go first
    over = [o for o in a.override if not o.startswith("--")]
    cmd = [sys.executable, str(REPO / "grpo.py"), *flags, f"seed={a.seed}", *over, f"hydra.run.dir={d}"]
    load0 = os.getloadavg()
    wall = run_logged(cmd, d / "run.log")
    res = {"seed": a.seed, **run_result(d), "wall_s": wall, "loadavg_start": load0, "loadavg_end": os.getloadavg(),
           "command": " ".join(cmd), "commit": git_commit(), "date": utc_date()}
    (d / "result.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("seed", "before", "after", "wall_s")}))
    return res


def summarise(root: Path) -> dict:
    runs = load_json(sorted(Path(root).glob("seed*/result.json")))
    if not runs:
        raise SystemExit(f"no seed*/result.json under {root}")
    rows = []
    for r in runs:
        b, e = r["before"], r["after"]
        bi, ei = wilson_interval(b["accuracy"], b["n"]), wilson_interval(e["accuracy"], e["n"])
        rows.append({"seed": r["seed"], "before": b["accuracy"], "after": e["accuracy"], "n": e["n"],
                     "before_ci": bi, "after_ci": ei, "disjoint": ei[0] > bi[1] or bi[0] > ei[1],
                     "wall_min": r["wall_s"] / 60, "load": [r["loadavg_start"][0], r["loadavg_end"][0]]})
    change = mean_ci([x["after"] - x["before"] for x in rows])
    return {"runs": rows, "change_mean": change[0], "change_ci95": change[1],
            "wall_min_range": [min(x["wall_min"] for x in rows), max(x["wall_min"] for x in rows)]}


def to_markdown(s: dict) -> str:
    out = ["| seed | before [Wilson 95%] | after [Wilson 95%] | n | intervals disjoint | wall (min) | load 1-min start/end |",
           "|---|---|---|---|---|---|---|"]
    for x in s["runs"]:
        out.append(f"| {x['seed']} | {x['before']:.3f} [{x['before_ci'][0]:.3f}, {x['before_ci'][1]:.3f}] | "
                   f"{x['after']:.3f} [{x['after_ci'][0]:.3f}, {x['after_ci'][1]:.3f}] | {x['n']} | "
                   f"{'yes' if x['disjoint'] else 'no'} | {x['wall_min']:.1f} | {x['load'][0]:.2f} / {x['load'][1]:.2f} |")
    out.append(f"\nChange after - before, mean over {len(s['runs'])} seeds: **{s['change_mean']:+.3f} ± "
               f"{s['change_ci95']:.3f}** (Student-t 95%).")
    return "\n".join(out) + "\n"


def plot(root: Path, png: Path) -> Path:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in load_json(sorted(Path(root).glob("seed*/result.json"))):
        left.plot([t["step"] for t in r["train"]], [t["reward"] for t in r["train"]], label=f"seed {r['seed']}")
        xs = [e["step"] for e in r["evals"]]
        ys = [e["accuracy"] for e in r["evals"]]
        right.errorbar(xs, ys, yerr=wilson_yerr(ys, [e["n"] for e in r["evals"]]), capsize=4, marker="o",
                       label=f"seed {r['seed']}")
    left.set(xlabel="step", ylabel="train reward (mean of the step's samples)", title="train reward")
    right.set(xlabel="step", ylabel="greedy accuracy, held-out items", title="eval accuracy (Wilson 95%)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def cmd_summary(a) -> None:
    s = summarise(Path(a.root))
    md = to_markdown(s)
    print(md)
    if a.write:
        write_outputs(a.write, md, s, lambda png: plot(Path(a.root), png))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one default run (python grpo.py seed=N) into OUT_ROOT/seedN")
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--out-root", required=True)
    r.add_argument("--override", action="append", default=[], help="an extra grpo.py override (repeatable)")
    s = sub.add_parser("summary", help="table + PNG over OUT_ROOT/seed*/result.json")
    s.add_argument("root")
    s.add_argument("--write", help="output stem: writes STEM.md, STEM.json, STEM.png")
    a = p.parse_args(argv)
    cmd_run(a) if a.cmd == "run" else cmd_summary(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
