"""Summarise multi-seed GSM8K runs (benchmarks/experiments/gsm8k_seeds.sh): one markdown row per seed, plus per-step traces.

Usage: python benchmarks/experiments/gsm8k_seeds_summary.py OUT_ROOT [--steps]

Reads ``OUT_ROOT/seed*/metrics.jsonl`` (the trainer's per-step metrics; rows holding ``eval/accuracy`` are the
greedy evaluations at step 0 and at the end), ``.hydra/config.yaml`` (``eval.n_problems``) and ``run.log`` (the
``/usr/bin/time -v`` report: wall time and peak RSS). Per seed: greedy accuracy before/after with a Wilson 95%
interval (Wilson 1927; the binomial interval of one run on n problems), mean response tokens and
``episode/truncated_fraction`` (episodes whose generation hit ``max_new_tokens``) at the first and last train step,
and the greedy eval's generated tokens per problem (approx.: ``eval/time_s * eval/tokens_per_s / n``, an upper bound
since the time includes grading).
Across finished seeds: the mean accuracy change with a Student-t 95% interval (n - 1 degrees of freedom).
A run without its final evaluation is listed as unfinished.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from harness import read_metrics
from stats import mean_ci, wilson


def _n_problems(run: Path) -> int | None:
    cfg = run / ".hydra" / "config.yaml"
    if cfg.is_file():
        m = re.search(r"^eval:\n(?:  .*\n)*?  n_problems: (\d+)", cfg.read_text(), re.M)
        if m:
            return int(m.group(1))
    return None


def _time_report(run: Path) -> tuple[str, float | None, str]:
    log = run / "run.log"
    if not log.is_file():
        return "", None, ""
    text = log.read_text(errors="replace")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", text)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    ex = re.search(r"^exit (\d+)", text, re.M)
    return (wall.group(1) if wall else "", int(rss.group(1)) / 1024**2 if rss else None,
            ex.group(1) if ex else "")


def summarise(run: Path) -> dict:
    rows = read_metrics(run)
    evals = [r for r in rows if "eval/accuracy" in r]
    train = [r for r in rows if "reward/mean" in r]
    n = _n_problems(run)
    wall, rss, exit_code = _time_report(run)
    out = {"run": run, "seed": run.name.removeprefix("seed"), "n": n, "train": train, "wall": wall, "rss_gb": rss,
           "exit": exit_code, "before": None, "after": None, "eval_tok": [None, None]}

    def tok(e):  # generated tokens per eval problem, approx.: eval time x generation throughput / n (upper bound)
        return e["eval/time_s"] * e["eval/tokens_per_s"] / n if n and "eval/tokens_per_s" in e else None

    if evals and evals[0].get("step") == 0:
        out["before"], out["eval_tok"][0] = evals[0]["eval/accuracy"], tok(evals[0])
    if len(evals) >= 2 and train and evals[-1].get("step") == train[-1].get("step") and len(train) >= 10:
        out["after"], out["eval_tok"][1] = evals[-1]["eval/accuracy"], tok(evals[-1])
    return out


def _acc(a: float | None, n: int | None) -> str:
    if a is None:
        return "unfinished"
    if not n:
        return f"{a:.3f}"
    k = round(a * n)
    lo, hi = wilson(k, n)
    return f"{a:.3f} ({k}/{n}) [{lo:.3f}, {hi:.3f}]"


def _f(x, fmt="{:.0f}") -> str:
    return fmt.format(x) if isinstance(x, (int, float)) else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_root", type=Path)
    ap.add_argument("--steps", action="store_true", help="also print per-step traces")
    args = ap.parse_args()
    runs = sorted((p for p in args.out_root.glob("seed*") if p.is_dir()), key=lambda p: p.name)
    res = [summarise(r) for r in runs]
    print("| seed | greedy acc. before [95% CI] | after [95% CI] | change | resp. tokens step 1 -> last | "
          "truncated frac. step 1 -> last | greedy eval tokens/problem before -> after (approx.) | train steps | wall | "
          "peak RSS GB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in res:
        t = r["train"]
        first, last = (t[0], t[-1]) if t else ({}, {})
        delta = f"{r['after'] - r['before']:+.3f}" if r["after"] is not None and r["before"] is not None else ""
        print(f"| {r['seed']} | {_acc(r['before'], r['n'])} | {_acc(r['after'], r['n'])} | {delta} | "
              f"{_f(first.get('episode/response_tokens'))} -> {_f(last.get('episode/response_tokens'))} | "
              f"{_f(first.get('episode/truncated_fraction'), '{:.2f}')} -> "
              f"{_f(last.get('episode/truncated_fraction'), '{:.2f}')} | "
              f"{_f(r['eval_tok'][0])} -> {_f(r['eval_tok'][1])} | {len(t)} | {r['wall'] or 'n/a'} | "
              f"{_f(r['rss_gb'], '{:.1f}')} |")
    done = [r for r in res if r["after"] is not None and r["before"] is not None]
    if len(done) >= 2:
        d = [r["after"] - r["before"] for r in done]
        m, half = mean_ci(d)
        mb = sum(r["before"] for r in done) / len(done)
        ma = sum(r["after"] for r in done) / len(done)
        print(f"\nfinished seeds: {len(done)}; mean accuracy {mb:.3f} -> {ma:.3f}; mean change {m:+.3f} "
              f"(95% t-interval across seeds [{m - half:+.3f}, {m + half:+.3f}])")
    if args.steps:
        for r in res:
            print(f"\nseed {r['seed']}: step | reward/mean | success | resp. tokens | truncated frac. | "
                  "zero-var groups | grad norm | step s")
            for s in r["train"]:
                print(f"  {s.get('step')} | {_f(s.get('reward/mean'), '{:.3f}')} | "
                      f"{_f(s.get('reward/success_rate'), '{:.2f}')} | {_f(s.get('episode/response_tokens'))} | "
                      f"{_f(s.get('episode/truncated_fraction'), '{:.2f}')} | "
                      f"{_f(s.get('groups/zero_variance_fraction'), '{:.2f}')} | {_f(s.get('grad_norm'), '{:.2f}')} | "
                      f"{_f(s.get('time/step_s'))}")


if __name__ == "__main__":
    main()
