"""The evaluation every trainer runs (GRPO sync and async, SFT, each domain of a continual run): :class:`Evaluator`.

One place for what used to be copied per trainer: which tasks (the first ``eval.n_problems`` usable ones of the
valid split, listed once), the greedy / pass@k / pass^k rollouts (:func:`torchrl_grpo.rollout.evaluation.evaluate`,
on the inference cores of the placement), the per-episode rows in ``eval_episodes.jsonl``, the env's do-nothing
baseline on the same tasks (once), the console table.
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
        components: the run's :class:`~torchrl_grpo.training.components.Components`: ``eval_collector`` (greedy and
            sampled eval episodes), ``eval_tasks()`` (the task indices, called once, at the first evaluation),
            ``eval_baseline(tasks)`` (the do-nothing scores, ``{}`` for envs without one, called once),
            ``sampling`` (the run's; the eval variants derive from it), ``settings.eval_greedy`` /
            ``eval_pass_k`` / ``progress_bar``, ``logger``, ``dp``, ``placement``. The collector, tasks and
            baseline are read when the evaluator is made: a trainer that switches env makes a new one.

    Calling it with the trainer's step returns ``eval/*`` metrics (floats; :func:`evaluate`), the baseline's and
    ``eval/n_tasks`` (the n of the accuracy's binomial interval). Under torchrun each rank evaluates its share and
    ranks other than 0 return ``{}``. Every evaluated episode is appended to ``<run_dir>/eval_episodes.jsonl`` with
    the step (a write that fails is logged, never raised).
    """

    def __init__(self, components: Components) -> None:
        c = self.components = components
        self.collector, self._tasks_fn, self._baseline_fn = c.eval_collector, c.eval_tasks, c.eval_baseline
        self.dp = c.dp or SINGLE
        self.tasks: list[int] | None = None  # the eval task indices, once listed
        self._baseline: dict[str, float] | None = None

    @property
    def n_tasks(self) -> int | None:
        """How many tasks an evaluation scores (None before the first evaluation)."""
        return len(self.tasks) if self.tasks else None

    def __call__(self, step: int, *, dp=None) -> dict[str, Any]:
        """Evaluate now; ``step`` labels the episode rows and the log line; ``dp`` the caller's data-parallel group
        (default: the components')."""
        c, s = self.components, self.components.settings
        dp = dp if dp is not None else self.dp
        if self.tasks is None:
            self.tasks = self._tasks_fn()
        episodes: list[dict] = []
        placement = c.placement
        with placement.on_cores("inference") if placement is not None else nullcontext():
            out = evaluate(self.collector, task_indices=self.tasks, sampling=c.sampling, greedy=s.eval_greedy,
                           pass_k=s.eval_pass_k, step=step, progress=s.progress_bar, episodes=episodes, dp=dp)
        if not dp.is_main:  # rank 0 logs for the run
            return {}
        try:  # per-episode outcomes and greedy conversations: a convenience, never stop a run for them
            c.logger.log_samples(episodes, step=step, name="eval_episodes.jsonl")
        except OSError as exc:
            log.warning("could not write eval_episodes.jsonl: %s", exc)
        if self._baseline is None:
            self._baseline = self._baseline_fn(self.tasks)  # {} without one
        out.update(self._baseline)
        out["eval/n_tasks"] = float(len(self.tasks))
        log.info("evaluation at step %d (%d tasks):\n%s", step, len(self.tasks), format_eval_table(out))
        return out

