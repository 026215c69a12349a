#!/usr/bin/env python
"""The laptop tau2 recipe's table (issue 48 item 2): base -> SFT -> GRPO per seed, and the SFT-only control.

    python benchmarks/experiments/tau2_mock_summary.py --recipe RUN_DIR [RUN_DIR ...] [--control SFT_RUN_DIR ...] \
        [--write benchmarks/results/tau2_mock_recipe]

A recipe run dir is what ``python grpo.py --config-name grpo_tau2_mock output_dir=RUN_DIR seed=S`` wrote
(``warm_start.json``: the base, SFT and GRPO evaluations and the phases' wall seconds; ``metrics.jsonl`` of the GRPO
phase; ``sft/`` the SFT phase). A control run dir is an ``sft.py`` run of the same config given more SFT epochs
(``metrics.jsonl``: its last ``eval/accuracy``). Per recipe run: pass^1 of each phase with its Wilson 95% interval
(:func:`stats.wilson`), whether GRPO's interval lies above SFT's (disjoint), the phases' wall minutes and where the
GRPO phase's time went (generation / env / update seconds per step when logged). Across seeds: the mean gain with a
t-interval (:func:`stats.mean_ci`) and, on the shared test tasks, McNemar's exact test of SFT vs GRPO episodes
(:func:`stats.mcnemar_exact`; pairs from ``eval_episodes.jsonl``, greedy rows at the first and last step).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from harness import read_metrics, write_outputs
from stats import mcnemar_exact, mean_ci, wilson


def _acc(m: dict | None) -> tuple[float, int] | None:
    if not m or not isinstance(m.get("eval/accuracy"), (int, float)):
        return None
    return float(m["eval/accuracy"]), int(m.get("eval/n_tasks") or 0)


def _fmt(x: tuple[float, int] | None) -> str:
    if x is None:
        return "-"
    p, n = x
    lo, hi = wilson(round(p * n), n)
    return f"{p:.3f} (n={n}) [{lo:.3f}, {hi:.3f}]"


def _paired(run_dir: Path) -> tuple[int, int] | None:
    """(b, c): tasks SFT solved and GRPO did not, and the reverse (greedy rows, first vs last step)."""
    path = run_dir / "eval_episodes.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r.get("mode") == "greedy"]
    if not rows:
        return None
    first, last = min(r["step"] for r in rows), max(r["step"] for r in rows)
    a = {r["task_id"]: r["reward"] >= 1.0 for r in rows if r["step"] == first}
    g = {r["task_id"]: r["reward"] >= 1.0 for r in rows if r["step"] == last}
    common = sorted(set(a) & set(g))
    return sum(a[t] and not g[t] for t in common), sum(g[t] and not a[t] for t in common)


def _time_split(run_dir: Path) -> dict:
    rows = [r for r in read_metrics(run_dir) if "time/step_s" in r]
    out = {"steps": len(rows)}
    for key in ("time/step_s", "time/generation_s", "time/env_s", "time/update_s", "time/train_s",
                "perf/update_mfu", "rollout/generated_tokens"):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        if vals:
            out[key] = statistics.median(vals)
    return out


def recipe_row(run_dir: Path) -> dict:
    ws = json.loads((run_dir / "warm_start.json").read_text())
    base, sft, grpo = _acc(ws.get("base")), _acc(ws.get("sft")), _acc(ws.get("grpo"))
    disjoint = None
    if sft and grpo:
        disjoint = wilson(round(grpo[0] * grpo[1]), grpo[1])[0] > wilson(round(sft[0] * sft[1]), sft[1])[1]
    cfg = {}
    cfg_path = run_dir / "config.yaml"
    if cfg_path.is_file():
        from omegaconf import OmegaConf

        c = OmegaConf.load(cfg_path)
        cfg = {"seed": c.get("seed"), "steps": c.train.steps, "batch_size": c.train.batch_size,
               "n_samples": c.gconfig.n_samples}
    return {"run_dir": str(run_dir), **cfg, "base": base, "sft": sft, "grpo": grpo, "disjoint": disjoint,
            "wall_min": {k: round(v / 60, 1) for k, v in ws.get("wall_s", {}).items()},
            "paired": _paired(run_dir), "time_split": _time_split(run_dir)}


def control_row(run_dir: Path) -> dict:
    evals = [r for r in read_metrics(run_dir) if "eval/accuracy" in r]
    last = evals[-1] if evals else None
    steps = [r for r in read_metrics(run_dir) if "sft/nll" in r]
    return {"run_dir": str(run_dir), "eval": _acc(last), "sft_steps": len(steps),
            "sft_s": round(sum(r.get("time/step_s", 0.0) for r in steps), 1)}


def render(recipes: list[dict], controls: list[dict]) -> str:
    lines = ["| run | seed | base | SFT (GRPO start) | GRPO (end) | GRPO > SFT, intervals disjoint | wall min "
             "(SFT phase / GRPO phase / total) | SFT-only-better / GRPO-only-better tasks (McNemar p) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in recipes:
        w = r["wall_min"]
        pair = r["paired"]
        pv = f"{pair[0]} / {pair[1]} (p={mcnemar_exact(*pair):.3g})" if pair else "-"
        lines.append(f"| {os.path.basename(r['run_dir'])} | {r.get('seed', '?')} | {_fmt(r['base'])} | {_fmt(r['sft'])} "
                     f"| {_fmt(r['grpo'])} | {'yes' if r['disjoint'] else 'no'} | {w.get('sft_phase', '?')} / "
                     f"{w.get('grpo_phase', '?')} / {w.get('total', '?')} | {pv} |")
    gains = [r["grpo"][0] - r["sft"][0] for r in recipes if r["sft"] and r["grpo"]]
    if len(gains) >= 2:
        lo, hi = mean_ci(gains)
        lines.append(f"\nGRPO - SFT over {len(gains)} seeds: mean {statistics.mean(gains):+.3f}, 95% t-interval "
                     f"[{lo:+.3f}, {hi:+.3f}]")
    elif gains:
        lines.append(f"\nGRPO - SFT (one seed): {gains[0]:+.3f}")
    if controls:
        lines += ["", "| SFT-only control | pass^1 at its end | SFT optimizer steps | SFT seconds |", "|---|---|---|---|"]
        for c in controls:
            lines.append(f"| {os.path.basename(c['run_dir'])} | {_fmt(c['eval'])} | {c['sft_steps']} | {c['sft_s']} |")
    lines += ["", "GRPO phase, median per step: " + "; ".join(
        f"{os.path.basename(r['run_dir'])}: " + ", ".join(f"{k} {v:.3g}" for k, v in r["time_split"].items() if k != "steps")
        for r in recipes)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", nargs="+", type=Path, required=True)
    ap.add_argument("--control", nargs="*", type=Path, default=[])
    ap.add_argument("--write", type=Path, default=None, help="stem: writes STEM.md, STEM.json, STEM.png")
    a = ap.parse_args(argv)
    recipes = [recipe_row(p) for p in a.recipe]
    controls = [control_row(p) for p in a.control]
    md = render(recipes, controls)
    print(md)
    if a.write:
        def draw(png: Path) -> None:
            from harness import pyplot

            plt = pyplot()
            fig, ax = plt.subplots(figsize=(6, 4))
            for r in recipes:
                pts = [(i, x) for i, x in enumerate((r["base"], r["sft"], r["grpo"])) if x]
                ax.plot([i for i, _ in pts], [x[0] for _, x in pts], "o-", label=f"seed {r.get('seed')}")
            for c in controls:
                if c["eval"]:
                    ax.plot([2], [c["eval"][0]], "kx", ms=9, label="SFT-only control")
            ax.set_xticks([0, 1, 2], ["base", "SFT", "GRPO"])
            ax.set_ylabel("greedy pass^1, generated_test")
            ax.set_ylim(-0.02, 1.02)
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(png, dpi=120)

        write_outputs(a.write, md, {"recipes": recipes, "controls": controls}, draw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
