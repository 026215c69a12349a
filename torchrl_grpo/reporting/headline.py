"""The last line of a run: what it learned, in one line (issue 45).

``grpo.py`` and ``sft.py`` end with::

    result: greedy accuracy 0.195 -> 0.555 (n=200; 95% Wilson [0.146, 0.255] -> [0.486, 0.622]); run dir: outputs/...

i.e. the score of the evaluation before the first step and after the last (``eval/accuracy``: the greedy success
rate, which tau2 calls pass^1), the number of evaluated tasks ``n`` (``eval/n_tasks``) and the Wilson 95% interval
of each (:func:`torchrl_grpo.reporting.learning_curve.wilson_interval`, Wilson 1927), then the run dir. A run with
one evaluation (``eval_only=true``, or a resumed run that skips the first one) states the one it has; a run with
none says so and names the keys that turn it on.
"""
from __future__ import annotations

from typing import Any

from torchrl_grpo.reporting.learning_curve import wilson_interval

__all__ = ["headline", "continual_headline"]


def _score(metrics: dict[str, Any] | None, key: str) -> tuple[float, int | None] | None:
    """(score, n) from an evaluation's metrics, or None when it did not run / held no score."""
    if not metrics or not isinstance(metrics.get(key), (int, float)):
        return None
    n = metrics.get("eval/n_tasks")
    return float(metrics[key]), int(n) if isinstance(n, (int, float)) and n >= 1 else None


def _interval(score: tuple[float, int | None]) -> str:
    p, n = score
    if n is None:
        return "?"
    lo, hi = wilson_interval(min(max(p, 0.0), 1.0), n)
    return f"[{lo:.3f}, {hi:.3f}]"


def headline(before: dict[str, Any] | None, after: dict[str, Any] | None, run_dir: str, *,
             label: str = "greedy accuracy", key: str = "eval/accuracy") -> str:
    """The one line that ends a run (module docstring).

    Args:
        before / after: the evaluations' metrics (``{key: float, "eval/n_tasks": float}``, as
            :class:`torchrl_grpo.training.evaluator.Evaluator` returns them); None or ``{}``: not run.
        run_dir: where the run wrote its files.
        label: what the score is called (``"pass^1 (greedy)"`` on tau2). key: the metric.

    Returns:
        ``"result: <label> <before> -> <after> (n=<n>; 95% Wilson [lo, hi] -> [lo, hi]); run dir: <run_dir>"``; with
        one evaluation ``"result: <label> <score> (n=<n>; 95% Wilson [lo, hi]); run dir: ..."``; with none
        ``"result: no evaluation ...; run dir: ..."``. An ``n`` that is unknown prints as ``?``.
    """
    b, a = _score(before, key), _score(after, key)
    where = f"run dir: {run_dir}"
    if b is None and a is None:
        return f"result: no evaluation in this run (eval.n_problems, eval.at_start / eval.at_end turn it on); {where}"
    if b is None or a is None:
        one = a or b
        n = one[1] if one[1] is not None else "?"
        return f"result: {label} {one[0]:.3f} (n={n}; 95% Wilson {_interval(one)}); {where}"
    n = a[1] if a[1] == b[1] else f"{b[1] or '?'} -> {a[1] or '?'}"
    n = "?" if n is None else n
    return (f"result: {label} {b[0]:.3f} -> {a[0]:.3f} (n={n}; 95% Wilson {_interval(b)} -> {_interval(a)}); "
            f"{where}")


def continual_headline(summary: dict[str, Any], run_dir: str) -> str:
    """The last line of a continual run (``cl.task_order``): ACC, BWT, FWT of its final summary
    (:func:`torchrl_grpo.continual.transfer.transfer_metrics`; a joint run has ACC only) and the run dir."""
    parts = [f"{k.upper()} {summary[k]:.3f}" for k in ("acc", "bwt", "fwt")
             if isinstance(summary.get(k), (int, float))]
    return f"result: continual run {', '.join(parts) or 'without a summary'}; run dir: {run_dir}"
