"""Continual-learning metrics over a sequence of domains, their console tables, and their plots.

Pure functions (no model, no trainer): :class:`torchrl_grpo.continual.trainer.ContinualTrainer` fills the numbers,
this module turns them into the standard transfer metrics, the console banner/tables and two PNGs.

The accuracy matrix (Lopez-Paz & Ranzato, 2017, "Gradient Episodic Memory for Continual Learning",
arXiv:1706.08840, Sec. 2)::

    R  float [T, T]   R[i][j] = score on domain j after training on the i-th domain of the task order
    b  float [T]      b[j]    = score of the untrained (initial) model on domain j

with T = number of domains in the order and the score a success rate or mean reward in [0, 1] (the trainer's
``cl.metric``: pass^1, pass^k or mean reward on the domain's eval split). From them (0-based indices, the issue's
notation):

* average accuracy       ACC = (1/T) Σ_j R[T-1][j]                                  (GEM, Eq. 2, first line)
* backward transfer      BWT = (1/(T-1)) Σ_{i<T-1} (R[T-1][i] - R[i][i])             (GEM, Eq. 2, second line)
* forward transfer       FWT = (1/(T-1)) Σ_{i≥1} (R[i-1][i] - b[i])                  (GEM, Eq. 2, third line)
* average forgetting     F   = (1/(T-1)) Σ_{j<T-1} (max_{l<T-1} R[l][j] - R[T-1][j])
  (Chaudhry et al., 2018, "Riemannian Walk for Incremental Learning", arXiv:1801.10112, Eqs. 3-4, at k = T-1)

T = 1 has nothing to transfer to or forget: BWT = FWT = F = 0. BWT < 0 and F > 0 mean forgetting; FWT > 0 means
earlier domains helped a later one before it was trained on.

``metrics.json`` (written by the trainer into the run dir; :func:`plot_run` reads it back)::

    task_order     list[str] [T]       the domains in training order
    algorithm      str                 cl.algorithm
    metric         str                 the score in R and b (pass^1 | pass^k | reward_mean)
    boundaries     list[int]           global trainer step at the end of each finished task
    R              list[list[float|None]] [T, T]   rows of unfinished tasks are None (joint runs: [1, T])
    row_labels     list[str]           optional labels of R's rows (joint runs: ["joint"])
    b              list[float|None] [T]
    base/eval      list[row]           evaluations of the untrained model (step 0), one row per domain
    task_k/train   list[row]           one row per trainer step of task k: step, domain, loss, reward_mean, ...
    task_k/eval    list[row]           one row per (evaluation, domain): step, domain, pass^1, pass^k, reward_mean
    transfer       list[row]           one row per finished task k: task, domain, step, acc, bwt, fwt, forgetting
                                       (over the first k+1 domains) and current {domain: score}
    summary        dict                final acc, bwt, fwt, forgetting, R, b (absent until the run ends)

CLI: ``python -m torchrl_grpo.continual.transfer plot RUN_DIR`` redraws ``learning_curves.png`` and ``accuracy_matrix.png``
from ``RUN_DIR/metrics.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = ["transfer_metrics", "transfer_at_boundary", "format_banner", "format_matrix", "format_transfer",
           "plot_learning_curves", "plot_accuracy_matrix", "plot_run", "load_metrics", "LEARNING_CURVES_PNG",
           "ACCURACY_MATRIX_PNG", "METRICS_JSON"]

METRICS_JSON = "metrics.json"
LEARNING_CURVES_PNG = "learning_curves.png"
ACCURACY_MATRIX_PNG = "accuracy_matrix.png"


def _as_matrix(R: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
    """``R`` [T, T] and ``b`` [T] as float64 arrays. Raises ValueError on bad shapes or non-finite entries."""
    try:
        R = np.asarray(R, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
    except (TypeError, ValueError) as e:  # ragged rows, None entries
        raise ValueError(f"R and b must be numeric: {e}") from None
    if R.ndim != 2 or R.shape[0] != R.shape[1] or R.shape[0] < 1:
        raise ValueError(f"R must be a square T x T matrix with T >= 1, got shape {R.shape}")
    if b.shape != (R.shape[0],):
        raise ValueError(f"b must have one entry per domain (shape ({R.shape[0]},)), got shape {b.shape}")
    if not (np.isfinite(R).all() and np.isfinite(b).all()):
        raise ValueError("R and b must be finite (no NaN/None: evaluate every domain at every boundary)")
    return R, b


def transfer_metrics(R: Any, b: Any) -> dict[str, float]:
    """ACC, BWT, FWT and average forgetting of an accuracy matrix (formulas and sources in the module docstring).

    Args:
        R: [T, T] scores (list of lists, NumPy array or tensor); ``R[i][j]`` = score on domain j after training on
            the i-th domain.
        b: [T] scores of the untrained model.

    Returns:
        ``{"acc", "bwt", "fwt", "forgetting"}`` as floats; the last three are 0 when T = 1.

    Raises:
        ValueError: R not square (or empty), ``len(b) != T``, or a non-finite / missing entry.
    """
    R, b = _as_matrix(R, b)
    T = R.shape[0]
    acc = float(R[T - 1].mean())
    if T == 1:
        return {"acc": acc, "bwt": 0.0, "fwt": 0.0, "forgetting": 0.0}
    last = T - 1
    bwt = float(np.mean([R[last, i] - R[i, i] for i in range(last)]))
    fwt = float(np.mean([R[i - 1, i] - b[i] for i in range(1, T)]))
    forgetting = float(np.mean([R[:last, j].max() - R[last, j] for j in range(last)]))
    return {"acc": acc, "bwt": bwt, "fwt": fwt, "forgetting": forgetting}


def transfer_at_boundary(R: Any, b: Any, k: int) -> dict[str, float]:
    """:func:`transfer_metrics` over the first ``k + 1`` domains, after task ``k`` finished (rows > k may be None).

    Raises:
        ValueError: ``k`` outside [0, T) or a missing entry in the leading ``(k+1) x (k+1)`` block.
    """
    rows = list(R)
    if not 0 <= k < len(rows):
        raise ValueError(f"boundary k={k} outside [0, {len(rows)})")
    sub = [list(rows[i])[: k + 1] for i in range(k + 1)]
    return transfer_metrics([[np.nan if v is None else v for v in r] for r in sub],
                            [np.nan if v is None else v for v in list(b)[: k + 1]])


# ---------------------------------------------------------------------------------------------------- console
def format_banner(k: int, domains: Sequence[str], R: Sequence[Sequence[float | None]], b: Sequence[float],
                  steps: int, width: int = 80) -> str:
    """The boundary banner of task ``k``: for each domain trained so far ``before -> after`` (before = the row of
    task k-1, or b for k = 0), for the later domains the current score::

        ================================================================================
        Task 1: RETAIL   (after 100 steps; airline 0.34 -> 0.29, retail 0.12 -> 0.31, telecom 0.00)
        ================================================================================
    """
    parts = []
    for j, d in enumerate(domains):
        after = R[k][j]
        before = b[j] if k == 0 else R[k - 1][j]
        parts.append(f"{d} {_f(before)} -> {_f(after)}" if j <= k else f"{d} {_f(after)}")
    line = "=" * width
    return f"{line}\nTask {k}: {domains[k].upper()}   (after {steps} steps; {', '.join(parts)})\n{line}"


def _f(v: float | None) -> str:
    return "  -  " if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def format_matrix(domains: Sequence[str], R: Sequence[Sequence[float | None]], b: Sequence[float | None]) -> str:
    """The accuracy matrix as a fixed-width table: a row ``untrained (b)`` then one row per task (None: not yet)."""
    w = max(8, *(len(d) for d in domains))
    head = f"{'after task':<22}" + "".join(f"{d:>{w + 2}}" for d in domains)
    rows = [f"{'untrained (b)':<22}" + "".join(f"{_f(v):>{w + 2}}" for v in b)]
    for i, d in enumerate(domains):
        label = f"{i}: {d}"
        rows.append(f"{label:<22}" + "".join(f"{_f(v):>{w + 2}}" for v in (R[i] or [None] * len(domains))))
    return "\n".join([head, "-" * len(head), *rows])


def format_transfer(m: dict[str, float]) -> str:
    """``acc / bwt / fwt / forgetting`` as a two-column table."""
    return "\n".join(f"{k:<12}{m[k]:>+9.4f}" for k in ("acc", "bwt", "fwt", "forgetting") if k in m)


# ---------------------------------------------------------------------------------------------------- plots
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on training machines
    import matplotlib.pyplot as plt

    return plt


def _task_keys(metrics: dict, suffix: str) -> list[str]:
    keys = [k for k in metrics if k.startswith("task_") and k.endswith("/" + suffix)]
    return sorted(keys, key=lambda k: int(k.split("/")[0].split("_")[1]))


def plot_learning_curves(metrics: dict, path: str | Path) -> Path:
    """Two panels over the global trainer step: the train reward of each step (coloured by the domain trained) and
    the eval score (``metrics["metric"]``) of every domain, with dashed lines at the task boundaries.

    Args:
        metrics: the ``metrics.json`` dict (module docstring); rows without a value are skipped.
        path: the PNG to write.

    Returns:
        ``path``.
    """
    plt = _pyplot()
    order = list(metrics.get("task_order", []))
    score = metrics.get("metric", "pass^1")
    colours = {d: plt.get_cmap("tab10")(i % 10) for i, d in enumerate(order)}
    fig, (ax_t, ax_e) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for key in _task_keys(metrics, "train"):
        rows = [r for r in metrics[key] if r.get("reward_mean") is not None]
        for d in dict.fromkeys(r.get("domain", key) for r in rows):  # one line per domain (joint runs: several)
            rd = [r for r in rows if r.get("domain", key) == d]
            ax_t.plot([r["step"] for r in rd], [r["reward_mean"] for r in rd], marker="o", ms=3,
                      color=colours.get(d), label=f"{key.split('/')[0]}: {d}")
    ax_t.set_ylabel("train reward (mean)")
    ax_t.legend(loc="upper left", fontsize=8)
    evals = list(metrics.get("base/eval", [])) + [r for k in _task_keys(metrics, "eval") for r in metrics[k]]
    for d in order:
        rows = sorted((r for r in evals if r.get("domain") == d and r.get(score) is not None), key=lambda r: r["step"])
        if rows:
            ax_e.plot([r["step"] for r in rows], [r[score] for r in rows], marker="s", ms=4, color=colours[d], label=d)
    ax_e.set_ylabel(f"eval {score}")
    ax_e.set_xlabel("trainer step")
    ax_e.legend(loc="upper left", fontsize=8)
    starts = [0] + list(metrics.get("boundaries", []))
    stages = metrics.get("row_labels") or order
    for i, s in enumerate(metrics.get("boundaries", [])):
        for ax in (ax_t, ax_e):
            ax.axvline(s, color="grey", ls="--", lw=1)
        if i < len(stages):
            ax_t.text((starts[i] + s) / 2, 1.02, stages[i], transform=ax_t.get_xaxis_transform(), ha="center",
                      fontsize=9)
    fig.suptitle(f"continual GRPO ({metrics.get('algorithm', '?')}): {' -> '.join(order)}")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_accuracy_matrix(metrics: dict, path: str | Path) -> Path:
    """The accuracy matrix R as a heat map (colour range [0, 1], values written in the cells, unfinished rows
    blank) under a first row with the untrained scores b; the title carries ACC/BWT/FWT/forgetting when the run
    finished (``metrics["summary"]``).

    Returns:
        ``path``.
    """
    plt = _pyplot()
    order = list(metrics["task_order"])
    T = len(order)
    R = [[np.nan if v is None else v for v in row] if row is not None else [np.nan] * T
         for row in metrics.get("R") or [[None] * T] * T]
    b = [np.nan if v is None else v for v in metrics.get("b") or [None] * T]
    labels = metrics.get("row_labels") or [f"after {i}: {d}" for i, d in enumerate(order)]
    M = np.array([b] + R, dtype=np.float64)
    fig, ax = plt.subplots(figsize=(1.6 * T + 3, 1.0 * (len(R) + 1) + 1.8))
    im = ax.imshow(np.ma.masked_invalid(M), vmin=0.0, vmax=1.0, cmap="viridis")
    for i in range(len(R) + 1):
        for j in range(T):
            if np.isfinite(M[i, j]):
                ax.text(j, i, f"{M[i, j]:.2f}", ha="center", va="center",
                        color="white" if M[i, j] < 0.6 else "black", fontsize=10)
    ax.axhline(0.5, color="white", lw=2)
    ax.set_xticks(range(T), order)
    ax.set_yticks(range(len(R) + 1), ["untrained (b)"] + list(labels))
    ax.set_xlabel(f"evaluated domain ({metrics.get('metric', 'pass^1')})")
    s = metrics.get("summary") or {}
    title = "accuracy matrix R"
    if all(k in s for k in ("acc", "bwt", "fwt", "forgetting")):
        title += f"\nACC {s['acc']:.3f}  BWT {s['bwt']:+.3f}  FWT {s['fwt']:+.3f}  F {s['forgetting']:.3f}"
    ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def load_metrics(run_dir: str | Path) -> dict:
    """``RUN_DIR/metrics.json`` as a dict. Raises FileNotFoundError naming the missing file."""
    p = Path(run_dir) / METRICS_JSON
    if not p.is_file():
        raise FileNotFoundError(f"no {METRICS_JSON} in {run_dir} (written by ContinualTrainer)")
    return json.loads(p.read_text())


def plot_run(run_dir: str | Path, metrics: dict | None = None) -> list[Path]:
    """Write ``learning_curves.png`` and ``accuracy_matrix.png`` into ``run_dir`` (from ``metrics`` or the run's
    ``metrics.json``). Returns the two paths."""
    run_dir = Path(run_dir)
    metrics = load_metrics(run_dir) if metrics is None else metrics
    return [plot_learning_curves(metrics, run_dir / LEARNING_CURVES_PNG),
            plot_accuracy_matrix(metrics, run_dir / ACCURACY_MATRIX_PNG)]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m torchrl_grpo.continual.transfer plot RUN_DIR``: redraw the two PNGs from ``RUN_DIR/metrics.json``."""
    p = argparse.ArgumentParser(prog="python -m torchrl_grpo.continual.transfer", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("plot", help="redraw learning_curves.png and accuracy_matrix.png from metrics.json")
    pp.add_argument("run_dir")
    args = p.parse_args(argv)
    for path in plot_run(args.run_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
