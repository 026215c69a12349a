#!/usr/bin/env python
"""The laptop tau2 recipe's table (issue 48 item 2): base -> SFT -> GRPO per seed, and the SFT-only control.

    python benchmarks/experiments/tau2_mock_summary.py --recipe RUN_DIR [RUN_DIR ...] [--control SFT_RUN_DIR ...] \
        [--write benchmarks/results/tau2_mock_recipe]
    python benchmarks/experiments/tau2_mock_summary.py --start RECIPE_RUN_DIR --grpo GRPO_RUN_DIR [GRPO_RUN_DIR ...] \
        [--write STEM]

A recipe run dir is what ``python grpo.py --config-name grpo_tau2_mock output_dir=RUN_DIR seed=S`` wrote
(``warm_start.json``: the base, SFT and GRPO evaluations and the phases' wall seconds; ``metrics.jsonl`` of the GRPO
phase; ``sft/`` the SFT phase). A control run dir is an ``sft.py`` run of the same config given more SFT epochs
(``metrics.jsonl``: its last ``eval/accuracy``). Per recipe run: pass^1 of each phase with its Wilson 95% interval
(:func:`stats.wilson`), whether GRPO's interval lies above SFT's (disjoint), the phases' wall minutes and where the
GRPO phase's time went (generation / env / update seconds per step when logged). Across seeds: the mean gain with a
t-interval (:func:`stats.mean_ci`) and, on the shared test tasks, McNemar's exact test of SFT vs GRPO episodes
(:func:`stats.mcnemar_exact`; pairs from ``eval_episodes.jsonl``, greedy rows at the first and last step).

``--start`` / ``--grpo``: GRPO-only runs (``grpo.py ... actor.path=RECIPE_RUN_DIR/sft/sft_model
sft.before_grpo=false eval.at_start=false``) from the SFT model a recipe run saved. Base and SFT are that recipe
run's (``warm_start.json``; SFT's greedy rows are its first step's in ``eval_episodes.jsonl``), GRPO is each run's
last evaluation (``metrics.jsonl``), paired with SFT on the shared tasks. The PNG draws every row with its Wilson
interval.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from harness import read_metrics, write_outputs
from stats import mcnemar_exact, mean_ci, paired_counts, wilson


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


def _pair(a: dict[str, bool], g: dict[str, bool]) -> tuple[int, int] | None:
    """(b, c): tasks solved by ``a`` and not ``g``, and the reverse, over the task ids both hold (None: none shared)."""
    m = paired_counts(a, g)
    return (m["only_first"], m["only_last"]) if m["n"] else None


def _disjoint(sft: tuple[float, int] | None, grpo: tuple[float, int] | None) -> bool | None:
    """GRPO's Wilson 95% interval entirely above SFT's (None: either is missing)."""
    if not (sft and grpo):
        return None
    return wilson(round(grpo[0] * grpo[1]), grpo[1])[0] > wilson(round(sft[0] * sft[1]), sft[1])[1]


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
    cfg = {}
    cfg_path = run_dir / "config.yaml"
    if cfg_path.is_file():
        from omegaconf import OmegaConf

        c = OmegaConf.load(cfg_path)
        cfg = {"seed": c.get("seed"), "steps": c.train.steps, "batch_size": c.train.batch_size,
               "n_samples": c.gconfig.n_samples}
    return {"run_dir": str(run_dir), **cfg, "base": base, "sft": sft, "grpo": grpo, "disjoint": _disjoint(sft, grpo),
            "wall_min": {k: round(v / 60, 1) for k, v in ws.get("wall_s", {}).items()},
            "paired": _pair(_greedy_outcomes(run_dir, "first"), _greedy_outcomes(run_dir, "last")),
            "time_split": _time_split(run_dir)}


def _greedy_outcomes(run_dir: Path, which: str) -> dict[str, bool]:
    """task_id -> solved, of the greedy rows at the ``first`` or ``last`` step of ``run_dir/eval_episodes.jsonl``."""
    path = run_dir / "eval_episodes.jsonl"
    if not path.is_file():
        return {}
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r.get("mode") == "greedy"]
    if not rows:
        return {}
    step = (min if which == "first" else max)(r["step"] for r in rows)
    return {r["task_id"]: r["reward"] >= 1.0 for r in rows if r["step"] == step}


def continued_row(start_dir: Path, run_dir: Path) -> dict:
    """A GRPO-only run from the SFT model the recipe run ``start_dir`` saved, as a :func:`recipe_row`-shaped row.

    Raises:
        FileNotFoundError: ``start_dir`` has no ``warm_start.json``.
        ValueError: ``run_dir`` logged no evaluation (no ``eval/accuracy`` row in its ``metrics.jsonl``).
    """
    ws = json.loads((start_dir / "warm_start.json").read_text())
    evals = [r for r in read_metrics(run_dir) if "eval/accuracy" in r]
    if not evals:
        raise ValueError(f"{run_dir}: no eval/accuracy row in metrics.jsonl (did the run finish its evaluation?)")
    base, sft, grpo = _acc(ws.get("base")), _acc(ws.get("sft")), _acc(evals[-1])
    paired = _pair(_greedy_outcomes(start_dir, "first"), _greedy_outcomes(run_dir, "last"))
    rewards = [r["reward/mean"] for r in read_metrics(run_dir) if "reward/mean" in r]
    seed = None
    if (run_dir / "config.yaml").is_file():  # grpo.py writes it into the run dir (runs before 2026-12-07 lack it)
        from omegaconf import OmegaConf

        seed = OmegaConf.load(run_dir / "config.yaml").get("seed")
    return {"run_dir": str(run_dir), "start": str(start_dir), "seed": seed, "base": base, "sft": sft, "grpo": grpo,
            "disjoint": _disjoint(sft, grpo), "wall_min": {"grpo_phase": round(sum(
                r.get("time/step_s", 0.0) for r in read_metrics(run_dir)) / 60, 1)},
            "paired": paired, "time_split": _time_split(run_dir), "train_reward": rewards}


def _label(run_dir: str) -> str:
    """A run's name for tables: its folder, or ``parent/run`` when the folder is the generic ``run``."""
    p = Path(run_dir)
    return f"{p.parent.name}/{p.name}" if p.name == "run" else p.name


def _seed(row: dict) -> str:
    return "?" if row.get("seed") is None else str(row["seed"])


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
        lines.append(f"| {_label(r['run_dir'])} | {_seed(r)} | {_fmt(r['base'])} | {_fmt(r['sft'])} "
                     f"| {_fmt(r['grpo'])} | {'yes' if r['disjoint'] else 'no'} | {w.get('sft_phase', '?')} / "
                     f"{w.get('grpo_phase', '?')} / {w.get('total', '?')} | {pv} |")
    gains = [r["grpo"][0] - r["sft"][0] for r in recipes if r["sft"] and r["grpo"]]
    if len(gains) >= 2:
        m, half = mean_ci(gains)  # (mean, half-width of the Student-t 95% interval)
        seeds = ", ".join(_seed(r) for r in recipes if r["sft"] and r["grpo"])
        lines.append(f"\nGRPO - SFT over {len(gains)} runs (seeds {seeds}): mean {m:+.3f}, 95% t-interval "
                     f"[{m - half:+.3f}, {m + half:+.3f}]")
    elif gains:
        lines.append(f"\nGRPO - SFT (one seed): {gains[0]:+.3f}")
    if controls:
        lines += ["", "| SFT-only control | pass^1 at its end | SFT optimizer steps | SFT seconds |", "|---|---|---|---|"]
        for c in controls:
            lines.append(f"| {os.path.basename(c['run_dir'])} | {_fmt(c['eval'])} | {c['sft_steps']} | {c['sft_s']} |")
    lines += ["", "GRPO phase, median per step: " + "; ".join(
        f"{_label(r['run_dir'])}: " + ", ".join(f"{k} {v:.3g}" for k, v in r["time_split"].items() if k != "steps")
        for r in recipes)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", nargs="*", type=Path, default=[])
    ap.add_argument("--control", nargs="*", type=Path, default=[])
    ap.add_argument("--start", type=Path, default=None,
                    help="the recipe run dir whose sft/sft_model the --grpo runs start from")
    ap.add_argument("--grpo", nargs="*", type=Path, default=[], help="GRPO-only run dirs from --start's SFT model")
    ap.add_argument("--write", type=Path, default=None, help="stem: writes STEM.md, STEM.json, STEM.png")
    a = ap.parse_args(argv)
    if bool(a.start) != bool(a.grpo):
        ap.error("--start and --grpo go together")
    if not a.recipe and not a.grpo:
        ap.error("give --recipe RUN_DIR ... or --start RUN_DIR --grpo RUN_DIR ...")
    recipes = [recipe_row(p) for p in a.recipe] + [continued_row(a.start, p) for p in a.grpo]
    controls = [control_row(p) for p in a.control]
    md = render(recipes, controls)
    print(md)
    if a.write:
        def draw(png: Path) -> None:
            from harness import pyplot

            plt = pyplot()
            fig, ax = plt.subplots(figsize=(6, 4))
            for j, r in enumerate(recipes):
                pts = [(i + 0.04 * j, x) for i, x in enumerate((r["base"], r["sft"], r["grpo"])) if x]
                ys = [x[0] for _, x in pts]
                ci = [wilson(round(x[0] * x[1]), x[1]) for _, x in pts]
                ax.errorbar([i for i, _ in pts], ys, yerr=[[y - lo for y, (lo, _) in zip(ys, ci)],
                                                           [hi - y for y, (_, hi) in zip(ys, ci)]],
                            fmt="o-", capsize=4, label=f"{_label(r['run_dir'])}, seed {_seed(r)}")
            for c in controls:
                if c["eval"]:
                    ax.plot([2], [c["eval"][0]], "kx", ms=9, label="SFT-only control")
            ax.set_xticks([0, 1, 2], ["base", "SFT", "GRPO"])
            ax.set_ylabel("greedy pass^1, generated_test (95% Wilson)")
            ax.set_ylim(-0.02, 1.02)
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(png, dpi=120)

        write_outputs(a.write, md, {"recipes": recipes, "controls": controls}, draw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
