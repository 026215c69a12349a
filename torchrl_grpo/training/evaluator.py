"""The evaluation every trainer runs (GRPO sync and async, SFT, each domain of a continual run): :class:`Evaluator`.

One place for what used to be copied per trainer: the greedy / pass@k / pass^k rollouts
(:func:`torchrl_grpo.rollout.evaluation.evaluate`, on the inference cores of the placement) on the first
``eval.n_problems`` usable tasks of the valid split, the per-episode rows in ``eval_episodes.jsonl``, the env's
do-nothing baseline on the same tasks, the console table. The tasks and the baseline are the env side's
(:class:`~torchrl_grpo.rollout.env_side.EnvSide`, listed and scored once there), read at each evaluation.
"""
from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

from torchrl_grpo.distributed.data_parallel import SINGLE
from torchrl_grpo.rollout.evaluation import evaluate, format_eval_table
from torchrl_grpo.training.components import Components

__all__ = ["Evaluator"]

log = logging.getLogger(__name__)


class Evaluator:
    """Greedy accuracy / pass@k / pass^k of the current policy on a fixed list of eval tasks.

    Args:
        components: the run's :class:`~torchrl_grpo.training.components.Components`, read at each call:
            ``env_side`` (its ``eval_collector`` runs the greedy and sampled eval episodes, ``eval_tasks()`` gives
            the task indices and ``eval_baseline(tasks)`` the do-nothing scores, ``{}`` for envs without one; both
            computed once by the env side), ``sampling`` (the run's; the eval variants derive from it),
            ``settings.eval_greedy`` / ``eval_pass_k`` / ``progress_bar``, ``logger``, ``dp``, ``placement``. A
            trainer that switches env (a new ``components.env_side``) keeps its evaluator.

    Calling it with the trainer's step returns ``eval/*`` metrics (floats; :func:`evaluate`), the baseline's and
    ``eval/n_tasks`` (the n of the accuracy's binomial interval). Under torchrun each rank evaluates its share and
    ranks other than 0 return ``{}``. Every evaluated episode is appended to ``<run_dir>/eval_episodes.jsonl`` with
    the step (a write that fails is logged, never raised).
    """

    def __init__(self, components: Components) -> None:
        self.components = components

    @property
    def n_tasks(self) -> int | None:
        """How many tasks an evaluation of the current env side scores (None before it listed them: no evaluation
        yet)."""
        return self.components.env_side.n_eval_tasks

    def __call__(self, step: int, *, dp=None) -> dict[str, Any]:
        """Evaluate now; ``step`` labels the episode rows and the log line; ``dp`` the caller's data-parallel group
        (default: the components')."""
        c, s, side = self.components, self.components.settings, self.components.env_side
        dp = dp if dp is not None else (c.dp or SINGLE)
        tasks = side.eval_tasks()
        episodes: list[dict] = []
        placement = c.placement
        with placement.on_cores("inference") if placement is not None else nullcontext():
            out = evaluate(side.eval_collector, task_indices=tasks, sampling=c.sampling, greedy=s.eval_greedy,
                           pass_k=s.eval_pass_k, step=step, progress=s.progress_bar, episodes=episodes, dp=dp)
        if not dp.is_main:  # rank 0 logs for the run
            return {}
        try:  # per-episode outcomes and greedy conversations: a convenience, never stop a run for them
            c.logger.log_samples(episodes, step=step, name="eval_episodes.jsonl")
        except OSError as exc:
            log.warning("could not write eval_episodes.jsonl: %s", exc)
        out.update(side.eval_baseline(tasks))  # {} without one
        out["eval/n_tasks"] = float(len(tasks))
        log.info("evaluation at step %d (%d tasks):\n%s", step, len(tasks), format_eval_table(out))
        return out
