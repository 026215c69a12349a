"""Gymnasium envs lent one per rollout, and the summary of an episode that a rollout's state carries: shared by the
verifiers adapters (:mod:`envs.adapters.verifiers_env` for verifiers 0.3, :mod:`envs.adapters.verifiers_v1_env` for
0.4), whose rollouts run concurrently in one event loop's threads and each need an env of their own."""
from __future__ import annotations

import asyncio
import contextvars
import functools
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

    def lease(self) -> "Lease":
        """An env lent to one rollout of an event loop (:class:`Lease`): ``async with pool.lease() as lease``."""
        return Lease(self)


class Lease:
    """One env of an :class:`EnvPool` lent to one rollout that drives it from an event loop, its blocking calls
    (``gym.make``, ``reset``, ``step``) on threads: ``async with pool.lease() as lease: await lease.run(lease.env.step,
    action)``.

    The env goes back to the pool only once the rollout has left the ``async with`` **and** no call on it is still
    running. A thread cannot be stopped: when the rollout is cancelled while ``await lease.run(env.step, ...)`` waits
    (verifiers cancels rollouts: a timeout, a shutdown), the step goes on in its thread, and an env given back at once
    could be reset by the next episode while that step still runs (issue 49). Such a call finishes first and gives
    the env back itself; a cancelled ``gym.make`` / acquire likewise.

    Attributes:
        env: the env lent (``None`` until the ``async with`` has entered).
    """

    def __init__(self, pool: EnvPool):
        self._pool, self.env = pool, None
        self._lock, self._running, self._ended = threading.Lock(), 0, False

    async def __aenter__(self) -> "Lease":
        try:
            await self.run(self._acquire)
        except BaseException:
            self._end()  # cancelled while the env is made: it goes back when made
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._end()

    def _acquire(self) -> None:
        env = self._pool.acquire()
        with self._lock:
            self.env = env

    async def run(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on a thread of the running loop's default executor (as ``asyncio.to_thread``, the
        caller's context variables included); the env is not given back while it runs, even when this await is
        cancelled (the call itself is not: it runs to its end).

        Raises:
            RuntimeError: after the lease ended. Whatever ``fn`` raises.
        """
        with self._lock:
            if self._ended:
                raise RuntimeError("this env's lease has ended")
            self._running += 1
        call = functools.partial(contextvars.copy_context().run, self._call, fn, args, kwargs)
        try:
            future = asyncio.get_running_loop().run_in_executor(None, call)
        except BaseException:
            self._finished()
            raise
        future.add_done_callback(_retrieve)  # its error is the caller's, or nobody's once the caller is cancelled
        return await asyncio.shield(future)  # cancelling the caller must not cancel a call not started yet either

    def _call(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            self._finished()

    def _finished(self) -> None:
        with self._lock:
            self._running -= 1
            env = self._take() if self._ended and self._running == 0 else None
        if env is not None:
            self._pool.release(env)

    def _end(self) -> None:
        with self._lock:
            self._ended = True
            env = self._take() if self._running == 0 else None
        if env is not None:
            self._pool.release(env)

    def _take(self) -> Any:
        env, self.env = self.env, None
        return env


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


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
