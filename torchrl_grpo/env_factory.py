"""Build env constructors and task lists from the run config (GSM8K and tau2 ids from :mod:`envs`)."""
from __future__ import annotations

import functools
from typing import Callable

import gymnasium as gym

import envs

__all__ = ["env_kwargs_from_config", "make_env_fn", "num_tasks", "usable_task_indices"]

gym.register_envs(envs)


def env_kwargs_from_config(cfg, split: str, dataset_path: str | None = None, user_fn=None) -> tuple[str, dict]:
    """Map the ``econfig`` / dataset sections to ``(env_id, gym.make kwargs)``.

    tau2 users: ``econfig.user`` (solo | scripted | llm | local) or, when unset, ``solo`` if ``econfig.solo_mode``
    else ``scripted``; ``econfig.user_llm=local`` (or ``user=local``) plays the customer with ``user_fn`` (a
    :class:`torchrl_grpo.local_user.LocalUser` built by the trainer); another ``user_llm`` value selects tau2's
    LLM user against ``user_llm_base_url``.

    Raises:
        ValueError: an unknown env id, or a local user without ``user_fn``.
    """
    e = cfg.econfig
    env_id = e.env_id
    if env_id == "GSM8K-v0":
        kw: dict = {"split": split, "format_reward": float(e.format_reward)}
        if dataset_path:
            kw["data_dir"] = dataset_path
        if e.system_prompt:
            kw["system_prompt"] = e.system_prompt
        return env_id, kw
    if env_id.startswith("tau2/") or env_id == "tau2":
        domain = e.domain if env_id == "tau2" else env_id.split("/")[1].rsplit("-v", 1)[0]
        kw = {"split": split, "max_steps": int(e.max_steps), "reward": e.reward}
        user = e.user or ("local" if e.user_llm == "local" else "llm" if e.user_llm
                          else "solo" if e.solo_mode else "scripted")
        if user == "local":
            if user_fn is None:
                raise ValueError("econfig.user_llm=local needs a user_fn (built by the trainer from its backend)")
            kw["user_fn"] = user_fn
            user = "callable"
        kw["user"] = user
        if user == "llm":
            kw.update(user_llm=e.user_llm, user_llm_base_url=e.user_llm_base_url, user_llm_args=dict(e.user_llm_args))
        return f"tau2/{domain}-v0", kw
    if env_id not in gym.registry:
        raise ValueError(f"unknown econfig.env_id {env_id!r}; registered: {sorted(envs.ENV_IDS)}")
    return env_id, {"split": split}


def make_env_fn(env_id: str, **kwargs) -> Callable[[], gym.Env]:
    """A zero-argument constructor for the collector's env pool (unwrapped: no TimeLimit/checker wrappers)."""
    return functools.partial(_make, env_id, kwargs)


def _make(env_id: str, kwargs: dict) -> gym.Env:
    return gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped


def num_tasks(env: gym.Env) -> int:
    """Number of distinct tasks / problems an env can be reset to with ``options={"index": i}``."""
    env = env.unwrapped
    for attr in ("num_tasks", "num_problems"):
        n = getattr(env, attr, None)
        if n is not None:
            return int(n)
    tasks = getattr(env, "tasks", None)
    if tasks is not None:
        return len(tasks)
    raise TypeError(f"{type(env).__name__} exposes none of num_tasks, num_problems, tasks")


def usable_task_indices(env: gym.Env, limit: int | None = None, *, check: bool = False) -> list[int]:
    """Task indices to train or evaluate on: ``0..n-1`` (first ``limit``), skipping with a warning the tasks whose
    ``reset`` raises when ``check`` is set (e.g. tau2 tasks whose history has customer turns cannot run solo)."""
    import logging

    n = num_tasks(env)
    out: list[int] = []
    for i in range(n):
        if limit is not None and len(out) >= limit:
            break
        if check:
            try:
                env.reset(seed=0, options={"index": i})
            except Exception as exc:  # a task the env cannot play in this mode
                logging.getLogger(__name__).warning("task %d skipped: %s", i, exc)
                continue
        out.append(i)
    return out
