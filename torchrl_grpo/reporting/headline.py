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

__all__ = ["headline", "continual_headline", "warm_start_headline", "plot_warm_start"]


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


def warm_start_headline(base: dict[str, Any] | None, sft: dict[str, Any] | None, grpo: dict[str, Any] | None,
                        run_dir: str, *, label: str = "pass^1", key: str = "eval/accuracy") -> str:
    """The last line of an SFT -> GRPO run (``sft.before_grpo``): the base model's score, the SFT model's (GRPO's
    start) and the GRPO model's (its end), each with its ``n``, the Wilson 95% intervals of SFT and GRPO, then the run
    dir::

        result: pass^1 base 0.000 (n=50) -> SFT 0.310 -> GRPO 0.455 (n=200; 95% Wilson [0.249, 0.378] -> [0.387, 0.525]); run dir: ...

    A phase that was not evaluated prints as ``-`` (its interval ``?``)."""
    b, s, g = (_score(m, key) for m in (base, sft, grpo))
    part_b = f"{b[0]:.3f} (n={b[1] if b[1] is not None else '?'})" if b else "- (not evaluated)"
    n = (g or s or (None, None))[1]
    val = lambda x: f"{x[0]:.3f}" if x else "-"  # noqa: E731
    iv = lambda x: _interval(x) if x else "?"  # noqa: E731
    return (f"result: {label} base {part_b} -> SFT {val(s)} -> GRPO {val(g)} (n={n if n is not None else '?'}; "
            f"95% Wilson {iv(s)} -> {iv(g)}); run dir: {run_dir}")


def plot_warm_start(points: list[tuple[str, float, dict[str, Any] | None]], out_path: str, *,
                    key: str = "eval/accuracy", title: str = "") -> str | None:
    """``learning_curve.png`` of an SFT -> GRPO run: one point per phase (``(label, wall minutes at the evaluation,
    metrics)``: base, SFT, GRPO) with its Wilson 95% interval as an error bar. Returns the path, or None when no
    phase has a score (nothing drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(lab, t, _score(m, key)) for lab, t, m in points]
    rows = [(lab, t, sc) for lab, t, sc in rows if sc is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for lab, t, (p, n) in rows:
        lo, hi = wilson_interval(min(max(p, 0.0), 1.0), n) if n else (p, p)
        ax.errorbar([t], [p], yerr=[[p - lo], [hi - p]], fmt="o", capsize=4, label=f"{lab}: {p:.3f} (n={n})")
    ax.plot([r[1] for r in rows], [r[2][0] for r in rows], color="0.6", lw=1, zorder=0)
    ax.set_xlabel("wall time of the run (min)")
    ax.set_ylabel(f"{key.split('/')[-1]} (greedy pass^1), 95% Wilson")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title or "base -> SFT -> GRPO")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path
