"""Summarise ``sft.py`` runs: one markdown row per run dir (demonstrations kept, SFT steps, NLL, greedy eval before
and after with Wilson 95% intervals).

Usage: python benchmarks/experiments/sft_summary.py [--n N] RUN_DIR [RUN_DIR ...]   (--n: eval problems, for runs that logged
no ``eval/n_tasks`` and wrote no config)

Reads each ``RUN_DIR/metrics.jsonl`` (rows with ``eval/accuracy``: the greedy evaluations before and after; ``demo/*``:
the gold replays; ``sft/nll`` per optimizer step; ``rft/*`` per round) and the ``config.yaml`` the run wrote (``eval.n_problems``;
the tasks evaluated are the first n usable ones of the split, fewer if the split is smaller). The interval is the binomial one of one run on n problems
(Wilson 1927, :func:`torchrl_grpo.reporting.learning_curve.wilson_interval`); one run is one seed, not a learning claim.
"""
from __future__ import annotations

import sys
from pathlib import Path

from harness import read_metrics
from stats import acc_wilson as _acc


def summarise(run: Path, n_default: int | None = None) -> str:
    rows = read_metrics(run)
    evals = [r for r in rows if "eval/accuracy" in r]
    demo = next((r for r in rows if "demo/kept" in r), {})
    nll = [r["sft/nll"] for r in rows if "sft/nll" in r]
    rft = [r for r in rows if "rft/kept" in r]
    import yaml

    n = n_default
    for cfg in (run / "config.yaml", run / ".hydra" / "config.yaml"):
        if cfg.is_file():
            n = int(yaml.safe_load(cfg.read_text())["eval"]["n_problems"])
            break
    n = int(evals[0].get("eval/n_tasks", n or 0)) if evals else n  # runs before eval/n_tasks: the config's n
    before = _acc(evals[0]["eval/accuracy"], n) if evals and n else "-"
    after = _acc(evals[-1]["eval/accuracy"], n) if len(evals) > 1 and n else "(unfinished)"
    k = max(1, len(nll) // 10)
    nll_s = f"{sum(nll[:k]) / k:.3f} -> {sum(nll[-k:]) / k:.3f}" if nll else "-"
    demos = f"{int(demo['demo/kept'])}/{int(demo['demo/tasks'])}" if demo else "-"
    rft_s = ", ".join(f"{int(r['rft/kept'])}/{int(r['rft/episodes'])}" for r in rft) or "-"
    return f"| {run.name} | {demos} | {len(nll)} | {nll_s} | {rft_s} | {before} | {after} |"


def main() -> None:
    args = sys.argv[1:]
    n_default = None
    if args[:1] == ["--n"]:
        n_default, args = int(args[1]), args[2:]
    runs = [Path(p) for p in args]
    if not runs:
        sys.exit(__doc__)
    print("| run | gold demos kept | SFT steps | NLL first -> last 10% of steps | RFT kept per round | greedy acc. before "
          "[95% CI] | after [95% CI] |")
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        print(summarise(run, n_default))


if __name__ == "__main__":
    main()
