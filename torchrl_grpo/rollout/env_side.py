"""The env side of a run: env constructors and task lists (GSM8K, IFEval, ReasoningGym and tau2 ids from :mod:`envs`),
and :func:`make_env_side`, the collectors and task lists of one env on a backend (:class:`EnvSide`; the trainer's own,
each Ray rollout worker's and each continual domain's).

Plain values in: ``gym.make`` ids and keyword arguments, counts, a seed. Which env and kwargs a run config asks for
(``econfig``, ``train_dataset``, ``valid_dataset``) is decided in :mod:`torchrl_grpo.assembly.environments`
(``env_kwargs_from_config``, ``check_data``, ``build_env_side``), the one layer that reads the config."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import gymnasium as gym

import envs
from torchrl_grpo.backends.base import RolloutBackend, SamplingConfig
from torchrl_grpo.rollout.collector import GroupCollector
from torchrl_grpo.rollout.evaluation import do_nothing_baseline

__all__ = ["make_env_fn", "num_tasks", "usable_task_indices", "train_task_indices", "EnvSide", "make_env_side"]

gym.register_envs(envs)


def make_env_fn(env_id: str, **kwargs) -> Callable[[], gym.Env]:
    """A zero-argument constructor for the collector's env pool (unwrapped: no TimeLimit/checker wrappers)."""
    return functools.partial(_make, env_id, kwargs)


def _make(env_id: str, kwargs: dict) -> gym.Env:
    return gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped


def num_tasks(env: gym.Env) -> int:
    """Number of distinct tasks an env can be reset to with ``options={"index": i}`` (``env.unwrapped.num_tasks``,
    :mod:`envs.contract`).

    Raises:
        TypeError: the env does not list its tasks (no ``num_tasks``).
    """
    n = getattr(env.unwrapped, "num_tasks", None)
    if n is None:
        raise TypeError(f"{type(env.unwrapped).__name__} has no num_tasks (see envs.contract.TextAgentEnv)")
    return int(n)


def usable_task_indices(env: gym.Env, limit: int | None = None) -> list[int]:
    """Task indices to train or evaluate on: the first ``limit`` (all with ``None``) that the env, as configured,
    can play -- ``env.unwrapped.usable_task_indices(limit)`` (:mod:`envs.contract`; e.g. tau2 in solo mode drops
    tasks whose history has customer turns). An env without that hook (a test double) plays all ``num_tasks``.
    """
    import logging

    u = env.unwrapped
    hook = getattr(u, "usable_task_indices", None)
    n = num_tasks(env)
    if hook is None:
        return list(range(n if limit is None else min(int(limit), n)))
    out = [int(i) for i in hook(limit)]
    wanted = n if limit is None else min(int(limit), n)
    if len(out) < wanted:
        logging.getLogger(__name__).warning("%d of %d tasks usable by %s as configured", len(out), wanted,
                                            type(u).__name__)
    return out


def train_task_indices(env: gym.Env, limit: int | None = None, start: int = 0) -> list[int]:
    """The train tasks of a run: the first ``limit`` (None: all) of :func:`usable_task_indices` whose index in the
    split is >= ``start`` (``train_dataset.limit`` / ``train_dataset.start``), ascending. With ``start=0`` this is
    :func:`usable_task_indices` itself."""
    if not start:
        return usable_task_indices(env, limit)
    out = [i for i in usable_task_indices(env, None) if i >= int(start)]
    return out if limit is None else out[:int(limit)]


@dataclass
class EnvSide:
    """The env half of a run for one environment (:func:`make_env_side`): the train and eval collectors on a shared
    backend, the usable train task indices, the first ``n_eval`` (``eval.n_problems``) usable eval tasks
    (``eval_tasks()``, computed once) and the do-nothing baseline on a task list (``eval_baseline(tasks)``, once per
    list; ``{}`` for envs without one). It owns these: the run's :class:`~torchrl_grpo.training.components.Components`
    hold it (``env_side``) and every reader (trainer, evaluator) goes through that field. A continual run holds one
    per domain (:mod:`torchrl_grpo.continual.domains`) and switches the components' between them."""

    user_fn: Any  # local LLM user (None unless econfig.user / user_llm is "local")
    collector: Any
    eval_collector: Any
    train_tasks: list[int]
    _eval_tasks: Callable[[], list[int]]
    _baseline: Callable[[list[int]], dict[str, float]]
    _cache: dict = field(default_factory=dict)

    def eval_tasks(self) -> list[int]:
        if "tasks" not in self._cache:
            self._cache["tasks"] = self._eval_tasks()
        return self._cache["tasks"]

    @property
    def n_eval_tasks(self) -> int | None:
        """How many eval tasks :meth:`eval_tasks` lists; None until it has listed them (nothing is listed here)."""
        tasks = self._cache.get("tasks")
        return None if tasks is None else len(tasks)

    def eval_baseline(self, tasks: list[int]) -> dict[str, float]:
        key = ("baseline", tuple(tasks))
        if key not in self._cache:
            self._cache[key] = self._baseline(tasks)
        return self._cache[key]

    def close(self) -> None:
        self.collector.close()
        self.eval_collector.close()


def make_env_side(train: tuple[str, dict], valid: tuple[str, dict], backend: RolloutBackend, tokenizer,
                  sampling: SamplingConfig, *, max_turns: int, max_context_tokens: int, seed: int,
                  train_limit: int | None = None, n_eval: int | None = None, user_fn=None,
                  train_start: int = 0) -> EnvSide:
    """The collectors and task lists of one environment on an existing backend.

    Args:
        train / valid: ``(env_id, gym.make kwargs)`` of the train and the evaluation split (each kwargs holds its
            ``split``; a local tau2 user is already in them as ``user_fn``).
        backend, tokenizer: the rollout backend and its tokenizer (shared by both collectors).
        sampling: the run's sampling settings (the collectors' default; evaluation derives its own from it).
        max_turns: agent turns per episode; max_context_tokens: the context budget of an episode (tokens).
        seed: the train collector's seed (the eval collector takes ``seed + 1``).
        train_limit: the first ``train_limit`` usable train tasks (None: all) of those from ``train_start`` on.
        train_start: only train tasks whose index in the split is >= ``train_start`` (``train_dataset.start``: e.g.
            past the first ``sft.limit`` tasks an SFT phase learned from).
        n_eval: the first ``n_eval`` usable eval tasks (``EnvSide.eval_tasks``; None: all).
        user_fn: the local LLM user (:class:`torchrl_grpo.rollout.local_user.LocalUser`) batching customer turns,
            or None.

    Raises:
        ValueError: an empty train split (or selection).
    """
    env_id, kw = train
    collector = GroupCollector(make_env_fn(env_id, **kw), backend, tokenizer, sampling, max_turns=max_turns,
                               max_context_tokens=max_context_tokens, seed=seed, user_batcher=user_fn)
    train_tasks = train_task_indices(collector.probe_env, train_limit, train_start)
    if len(train_tasks) < 1:
        raise ValueError(f"train split {kw.get('split')!r} of {env_id} has no tasks"
                         + (f" from index {train_start} on" if train_start else "")
                         + (f" of at most {kw['max_intents']} sub-intents" if kw.get("max_intents") else ""))
    vid, vkw = valid
    eval_collector = GroupCollector(make_env_fn(vid, **vkw), backend, tokenizer, sampling, max_turns=max_turns,
                                    max_context_tokens=max_context_tokens, seed=seed + 1, user_batcher=user_fn)
    return EnvSide(user_fn=user_fn, collector=collector, eval_collector=eval_collector, train_tasks=train_tasks,
                   _eval_tasks=lambda: usable_task_indices(eval_collector.probe_env, n_eval),
                   _baseline=lambda tasks: do_nothing_baseline(make_env_fn(vid, **vkw), tasks))
