"""Evaluation of a policy on a fixed subset of tasks: greedy accuracy, pass@k and pass^k.

* pass@k — probability that at least one of k samples succeeds; unbiased estimator from n >= k samples with
  c successes (Chen et al., 2021, "Evaluating LLMs Trained on Code", arXiv:2107.03374, Eq. 1):
  ``1 - C(n - c, k) / C(n, k)``.
* pass^k — probability that *all* k i.i.d. samples succeed (tau-bench, Yao et al., 2024, arXiv:2406.12045,
  Sec. 4): ``C(c, k) / C(n, k)``, averaged over tasks.

An episode succeeds when its reward is >= ``success_threshold`` (1.0: a correct GSM8K answer; a full tau2
reward). The GSM8K format credit (0.1) is therefore not counted as success.
"""
from __future__ import annotations

from math import comb

from .backends.base import SamplingConfig
from .collector import GroupCollector

__all__ = ["pass_at_k", "pass_hat_k", "evaluate", "do_nothing_baseline", "format_eval_table"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task (Chen et al., 2021, Eq. 1). Raises ValueError if k > n or c > n."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k for one task (tau-bench): C(c, k) / C(n, k). Raises ValueError if k > n or c > n."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return comb(c, k) / comb(n, k)


def evaluate(
    collector: GroupCollector,
    *,
    task_indices: list[int],
    greedy: bool = True,
    pass_k: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int = 256,
    step: int = 0,
    success_threshold: float = 1.0,
    prefix: str = "eval",
) -> dict[str, float]:
    """Evaluate on a fixed subset of the collector env's tasks (``options={"index": i}`` for i in ``task_indices``).

    Returns:
        ``{prefix}/accuracy`` (greedy success rate), ``{prefix}/reward`` (greedy mean reward), and when
        ``pass_k > 0``: ``{prefix}/pass@k``, ``{prefix}/pass^k`` and ``{prefix}/pass@1`` from k samples per task
        at ``temperature``; plus ``{prefix}/time_s``.
    """
    import time

    t0 = time.perf_counter()
    tasks = [{"index": int(i)} for i in task_indices]
    out: dict[str, float] = {}
    if greedy:
        td = collector.collect(tasks, 1, step=step, sampling=SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0))
        r = td["reward"]
        out[f"{prefix}/accuracy"] = (r >= success_threshold).float().mean().item()
        out[f"{prefix}/reward"] = r.mean().item()
        out[f"{prefix}/tokens_per_s"] = collector.last_stats.get("rollout/tokens_per_s", 0.0)
    if pass_k > 0:
        td = collector.collect(tasks, pass_k, step=step,
                               sampling=SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=12345))
        ok = (td["reward"] >= success_threshold).reshape(len(tasks), pass_k)
        c = ok.sum(-1).tolist()
        out[f"{prefix}/pass@{pass_k}"] = sum(pass_at_k(pass_k, ci, pass_k) for ci in c) / len(c)
        out[f"{prefix}/pass^{pass_k}"] = sum(pass_hat_k(pass_k, ci, pass_k) for ci in c) / len(c)
        out[f"{prefix}/pass@1"] = sum(pass_at_k(pass_k, ci, 1) for ci in c) / len(c)
    out[f"{prefix}/time_s"] = time.perf_counter() - t0
    return out


def do_nothing_baseline(make_env, task_indices: list[int], action=None, prefix: str = "eval/do_nothing") -> dict[str, float]:
    """Reward of an agent that takes ``action`` once on the given tasks: the floor a trained policy must beat
    (tau2 gives ~0.38 on airline base for ending at once: some tasks require no change).

    Args:
        make_env: zero-argument env constructor.
        task_indices: task indices (``reset(options={"index": i})``).
        action: the action; default the env's own ``env.unwrapped.do_nothing_action`` (:mod:`envs.contract`).

    Returns:
        ``{prefix}_reward`` (mean reward) and ``{prefix}_pass^1`` (fraction with reward >= 1); ``{}`` when the env
        has no do-nothing action (``do_nothing_action is None``, e.g. GSM8K) and none is given.
    """
    env = make_env()
    if action is None:
        action = getattr(env.unwrapped, "do_nothing_action", None)
        if action is None:
            env.close()
            return {}
    rewards = []
    for i in task_indices:
        env.reset(seed=i, options={"index": i})
        _, r, term, trunc, _ = env.step(action)
        rewards.append(float(r))
    env.close()
    return {f"{prefix}_reward": sum(rewards) / max(1, len(rewards)),
            f"{prefix}_pass^1": sum(r >= 1.0 for r in rewards) / max(1, len(rewards))}


def format_eval_table(metrics: dict[str, float]) -> str:
    """A fixed-width two-column table of evaluation metrics, for the console."""
    rows = [(k, v) for k, v in sorted(metrics.items()) if isinstance(v, (int, float))]
    width = max((len(k) for k, _ in rows), default=10)
    line = "+" + "-" * (width + 2) + "+" + "-" * 12 + "+"
    body = [f"| {k:<{width}} | {v:>10.4f} |" for k, v in rows]
    return "\n".join([line, f"| {'metric':<{width}} | {'value':>10} |", line, *body, line])
