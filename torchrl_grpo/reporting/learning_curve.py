"""The learning curve of a run as a PNG: train reward per step and the evaluation score at each evaluation.

Drawn from the run's ``metrics.jsonl`` (one JSON object per logged step, :class:`torchrl_grpo.reporting.stats_logger.
StatsLogger`) at the end of :meth:`torchrl_grpo.training.grpo_trainer.GRPOTrainer.fit` into ``<run_dir>/learning_curve.png`` (and
wandb); ``python -m torchrl_grpo.reporting.learning_curve RUN_DIR`` redraws it.

Left panel: ``reward/mean`` (mean final reward of the step's episodes; an SFT run's ``sft/nll`` instead) and, when logged,
``episode/truncated_fraction`` (episodes cut at ``max_new_tokens``: a curve whose reward rises while this falls to
0 with shrinking responses is the reward-hacking pattern of issue 14). Right panel: ``eval/accuracy`` (greedy success
rate on the fixed eval tasks) with a Wilson 95% interval (Wilson 1927) when ``eval.n_problems`` is known, and
``eval/pass^k`` when logged.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

__all__ = ["plot_learning_curve", "wilson_interval"]

_Z95 = 1.959964


def wilson_interval(p: float, n: int) -> tuple[float, float]:
    """Wilson score 95% interval of a success rate ``p`` measured on ``n`` trials (Wilson 1927).

    Raises:
        ValueError: ``n < 1`` or ``p`` outside [0, 1].
    """
    if n < 1 or not 0.0 <= p <= 1.0:
        raise ValueError(f"need n >= 1 and 0 <= p <= 1, got p={p}, n={n}")
    z2 = _Z95 * _Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = _Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(int(r["step"]), float(r[key])) for r in rows if isinstance(r.get(key), (int, float)) and "step" in r]
    return [s for s, _ in pts], [v for _, v in pts]


def plot_learning_curve(metrics_path: str | Path, out_path: str | Path, n_eval: int | None = None) -> Path | None:
    """Draw the learning curve of ``metrics_path`` (a ``metrics.jsonl``) into ``out_path`` (PNG).

    Args:
        metrics_path: the run's ``metrics.jsonl``.
        out_path: the PNG to write (its folder must exist).
        n_eval: problems per evaluation (``eval.n_problems``) for the Wilson intervals; ``None``: the logged
            ``eval/n_tasks`` when every evaluation logged the same count, else no intervals.

    Returns:
        ``out_path``, or ``None`` when the file holds no train reward, SFT loss or evaluation (nothing to draw).

    Raises:
        FileNotFoundError: ``metrics_path`` does not exist.
        ValueError: a line that is not JSON, naming the line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for i, line in enumerate(Path(metrics_path).read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{metrics_path}:{i}: not JSON ({err.msg})") from None
    rs, rv = _series(rows, "reward/mean")
    ns, nv = _series(rows, "sft/nll")
    es, ev = _series(rows, "eval/accuracy")
    if not rs and not ns and not es:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    if rs:
        left.plot(rs, rv, marker="o", ms=3, label="train reward (batch mean)")
    elif ns:  # an SFT run (sft.py): its loss
        left.plot(ns, nv, marker="o", ms=3, label="SFT loss (sft/nll)")
    ts, tv = _series(rows, "episode/truncated_fraction")
    if ts:
        left.plot(ts, tv, ls="--", color="grey", label="truncated fraction")
    left.set_xlabel("step")
    left.set_title("training")
    left.legend(loc="best", fontsize=8)
    if not n_eval:  # the evaluation's own count, when it logged one (eval/n_tasks)
        counts = {int(v) for v in _series(rows, "eval/n_tasks")[1] if v >= 1}
        n_eval = counts.pop() if len(counts) == 1 else None
    if es:
        right.plot(es, ev, marker="o", label="greedy accuracy")
        if n_eval:
            lo, hi = zip(*(wilson_interval(min(max(v, 0.0), 1.0), n_eval) for v in ev))
            label = f"95% Wilson interval (n={n_eval})"
            if len(es) > 1:
                right.fill_between(es, lo, hi, alpha=0.2, label=label)
            else:  # a band over one step has no width: an error bar
                right.errorbar(es, ev, yerr=[[ev[0] - lo[0]], [hi[0] - ev[0]]], fmt="none", capsize=4, label=label)
    for key in sorted({k for r in rows for k in r if k.startswith("eval/pass^")}):
        ks, kv = _series(rows, key)
        right.plot(ks, kv, marker="s", ms=3, label=key.split("/", 1)[1])
    right.set_xlabel("step")
    right.set_ylim(-0.02, 1.02)
    right.set_title("evaluation")
    if es or right.lines:
        right.legend(loc="best", fontsize=8)
    fig.tight_layout()
    out_path = Path(out_path)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def _main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m torchrl_grpo.reporting.learning_curve RUN_DIR", file=sys.stderr)
        return 2
    run = Path(argv[0])
    n_eval = None
    saved = run / ".hydra" / "config.yaml"  # the run's record on disk (eval.n_problems), not a live config
    if saved.is_file():
        import yaml

        n_eval = ((yaml.safe_load(saved.read_text()) or {}).get("eval") or {}).get("n_problems")
    out = plot_learning_curve(run / "metrics.jsonl", run / "learning_curve.png", n_eval=n_eval)
    print(out if out else "nothing to draw")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
