"""Interval statistics of the experiment tables (one copy for every driver in ``benchmarks/experiments/``).

* :func:`wilson` / :func:`acc_wilson`: the Wilson score 95% interval of one run's accuracy on ``n`` problems (Wilson
  1927, JASA 22; computed by :func:`torchrl_grpo.reporting.learning_curve.wilson_interval`, not copied here);
* :func:`t95` / :func:`mean_ci`: the Student-t 95% interval of a mean across seeds (``n - 1`` degrees of freedom);
* :func:`welch_ci`: the difference of two means with Welch's interval (Welch 1947, Biometrika 34;
  Welch-Satterthwaite degrees of freedom);
* :func:`mcnemar_exact`: the exact McNemar test of two runs' paired binary outcomes (McNemar 1947, Psychometrika 12).

Pure functions of floats: no torch, no files.
"""
from __future__ import annotations

import math
from math import comb

from torchrl_grpo.reporting.learning_curve import wilson_interval

#: two-sided 95% Student-t quantiles by degrees of freedom (1..30); larger df use 1.96
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086,
       25: 2.060, 30: 2.042}


def t95(df: float) -> float:
    """Two-sided 95% Student-t quantile for ``df`` degrees of freedom (linear between tabulated df; 2.042 from 30 to
    60, 1.96 past 60).

    Raises:
        ValueError: ``df < 1``.
    """
    if df < 1:
        raise ValueError(f"need at least 1 degree of freedom, got {df}")
    if df >= 30:
        return T95[30] if df < 60 else 1.96
    keys = sorted(T95)
    lo = max(k for k in keys if k <= df)
    hi = min(k for k in keys if k >= df)
    if lo == hi:
        return T95[lo]
    return T95[lo] + (T95[hi] - T95[lo]) * (df - lo) / (hi - lo)


def mean_ci(xs: list[float]) -> tuple[float, float]:
    """Mean of ``xs`` and the half-width of its Student-t 95% interval, ``t95(n - 1) * sd / sqrt(n)`` with the
    sample standard deviation (``n - 1`` denominator); ``nan`` half-width for fewer than 2 values.

    Raises:
        ZeroDivisionError: ``xs`` is empty.
    """
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, float("nan")
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return m, t95(len(xs) - 1) * sd / math.sqrt(len(xs))


def welch_ci(a: list[float], b: list[float]) -> tuple[float, float]:
    """``mean(a) - mean(b)`` and the half-width of Welch's 95% interval (Welch 1947, Biometrika 34: the variance
    ``s_a^2/n_a + s_b^2/n_b`` with Welch-Satterthwaite degrees of freedom
    ``(v_a + v_b)^2 / (v_a^2/(n_a-1) + v_b^2/(n_b-1))``, ``v = s^2/n``); ``nan`` half-width when either side has fewer
    than 2 values, 0 when both have zero variance."""
    d = sum(a) / len(a) - sum(b) / len(b)
    if len(a) < 2 or len(b) < 2:
        return d, float("nan")

    def var(x):
        m = sum(x) / len(x)
        return sum((v - m) ** 2 for v in x) / (len(x) - 1)

    va, vb = var(a) / len(a), var(b) / len(b)
    se2 = va + vb
    if se2 == 0:
        return d, 0.0
    df = se2 ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return d, t95(max(1.0, df)) * math.sqrt(se2)


def paired_counts(first: dict[str, bool], last: dict[str, bool]) -> dict[str, int]:
    """Two runs' outcomes on the same tasks (``{task_id: solved}``), over the ids both hold: ``{"n", "both",
    "neither", "only_first", "only_last"}`` (``only_first`` / ``only_last``: :func:`mcnemar_exact`'s ``b`` / ``c``)."""
    ids = sorted(set(first) & set(last))
    pairs = [(bool(first[i]), bool(last[i])) for i in ids]
    return {"n": len(ids), "both": sum(a and b for a, b in pairs), "neither": sum(not (a or b) for a, b in pairs),
            "only_first": sum(a and not b for a, b in pairs), "only_last": sum(b and not a for a, b in pairs)}


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for paired binary outcomes (McNemar, 1947; the exact binomial form): ``b``
    tasks solved only by the first run, ``c`` only by the second; under "no difference" each discordant task goes
    either way with probability 1/2, so p = min(1, 2 P(Binom(b + c, 1/2) <= min(b, c))); 1.0 when b + c = 0."""
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n)


def wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson score 95% interval of ``k`` successes in ``n`` (:func:`~torchrl_grpo.reporting.learning_curve.
    wilson_interval` of ``k / n``); ``(nan, nan)`` when ``n == 0``."""
    if n == 0:
        return float("nan"), float("nan")
    return wilson_interval(k / n, n)


def acc_wilson(p: float, n: int) -> str:
    """``"0.200 (50/250) [0.151, 0.256]"``: an accuracy, its successes out of ``n`` and its Wilson 95% interval."""
    lo, hi = wilson_interval(p, n)
    return f"{p:.3f} ({round(p * n)}/{n}) [{lo:.3f}, {hi:.3f}]"


def wilson_yerr(accs: list[float], ns: list[int]) -> list[list[float]]:
    """``[[below...], [above...]]``: the asymmetric Wilson 95% error bars of ``accs`` (each on its ``n``), in
    matplotlib's ``errorbar(yerr=...)`` form."""
    ivs = [wilson_interval(a, n) for a, n in zip(accs, ns)]
    return [[a - lo for a, (lo, _) in zip(accs, ivs)], [hi - a for a, (_, hi) in zip(accs, ivs)]]
