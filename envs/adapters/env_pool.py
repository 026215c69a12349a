"""Gymnasium envs lent one per rollout, and the summary of an episode that a rollout's state carries: shared by the
verifiers adapters (:mod:`envs.adapters.verifiers_env` for verifiers 0.3, :mod:`envs.adapters.verifiers_v1_env` for
0.4), whose rollouts run concurrently in one event loop's threads and each need an env of their own."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import gymnasium as gym


class EnvPool:
    """Gymnasium envs of one id and configuration, lent one per rollout (thread-safe); grows to the number of
    rollouts in flight (an idle env is reused: ``gym.make`` of a tau2 domain takes seconds).

    Args:
        make: makes one env (called when no idle env is left).

    Raises:
        RuntimeError: :meth:`acquire` after :meth:`close`.
    """

    def __init__(self, make: Callable[[], gym.Env]):
        self._make, self._idle, self._all, self._lock, self._closed = make, [], [], threading.Lock(), False

    def add(self, env: gym.Env) -> None:
        """Lend ``env`` too (one made already, e.g. to read the env's spaces)."""
        with self._lock:
            self._all.append(env)
            self._idle.append(env)

    def acquire(self) -> gym.Env:
        """An idle env, or a new one."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the environment was torn down")
            if self._idle:
                return self._idle.pop()
        env = self._make()
        with self._lock:
            self._all.append(env)
        return env

    def release(self, env: gym.Env) -> None:
        """Give ``env`` back (closed at once when the pool is closed)."""
        with self._lock:
            if not self._closed:
                self._idle.append(env)
                return
        env.close()

    def close(self) -> None:
        """Close every env made; envs lent out are closed when released."""
        with self._lock:
            self._closed, envs_, self._all, self._idle = True, self._all, [], []
        for env in envs_:
            env.close()


def episode_summary(task_id: str) -> dict[str, Any]:
    """The summary of an episode not ended yet: ``task_id``, ``reward`` (``None``), ``terminated``, ``truncated``,
    ``termination_reason`` and ``steps`` (0)."""
    return {"task_id": task_id, "reward": None, "terminated": False, "truncated": False, "termination_reason": None,
            "steps": 0}


def end_episode(summary: dict, reward: float, terminated: bool, truncated: bool, info: dict) -> None:
    """Record an episode's last step in its ``summary`` (:func:`episode_summary`): reward, end flags and the env's
    ``info["termination_reason"]`` as text."""
    reason = info.get("termination_reason")
    summary.update(reward=float(reward), terminated=bool(terminated), truncated=bool(truncated),
                   termination_reason=None if reason is None else str(reason))
