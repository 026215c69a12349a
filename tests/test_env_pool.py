"""envs/adapters/env_pool.py: an env lent to a rollout goes back to the pool only after its last call has finished
(issue 49: a verifiers 0.4 rollout cancelled during ``await asyncio.to_thread(env.step)`` gave its env back while the
step still ran in its thread, so the next episode could reset it concurrently)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from envs.adapters.env_pool import EnvPool


class SlowEnv:
    """A fake env whose ``step`` blocks until the test lets it go; records a reset or step that overlaps another
    call on the same env (what a concurrent reset by the next episode would be)."""

    made = 0

    def __init__(self):
        SlowEnv.made += 1
        self.name, self.busy, self.overlaps, self.closed = SlowEnv.made, False, 0, False
        self.step_started, self.let_step_end = threading.Event(), threading.Event()

    def _enter(self):
        if self.busy:
            self.overlaps += 1
        self.busy = True

    def reset(self, **kwargs):
        self._enter()
        self.busy = False
        return [], {}

    def step(self, action):
        self._enter()
        self.step_started.set()
        self.let_step_end.wait(30)
        self.busy = False
        return [], 1.0, True, False, {}

    def close(self):
        self.closed = True


async def _episode(pool: EnvPool, seen: list):
    async with pool.lease() as lease:
        seen.append(lease.env)
        await lease.run(lease.env.reset, options={"task_id": "0"})
        return await lease.run(lease.env.step, "answer")


def test_a_cancelled_step_keeps_its_env_until_the_step_has_finished():
    async def main():
        pool = EnvPool(SlowEnv)
        seen: list = []
        task = asyncio.create_task(_episode(pool, seen))
        while not seen:
            await asyncio.sleep(0.01)
        env = seen[0]
        assert await asyncio.to_thread(env.step_started.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        other = pool.acquire()  # the next episode, while the cancelled step still runs
        assert other is not env, "the env of a step still running was lent again"
        pool.release(other)
        env.let_step_end.set()
        for _ in range(500):  # the step's thread gives the env back when it ends
            if env in pool._idle:
                break
            await asyncio.sleep(0.01)
        assert env in pool._idle and not env.busy
        other.let_step_end.set()
        await _episode(pool, [])  # a whole episode on one of them: no call overlapped another on either env
        assert env.overlaps == 0 and other.overlaps == 0
        pool.close()
        assert env.closed and other.closed

    asyncio.run(main())


def test_an_episode_that_ends_gives_its_env_back_and_a_failed_call_raises():
    async def main():
        pool = EnvPool(SlowEnv)
        seen: list = []
        first = asyncio.create_task(_episode(pool, seen))
        while not seen:
            await asyncio.sleep(0.01)
        seen[0].let_step_end.set()
        assert (await first)[1] == 1.0
        assert pool._idle == [seen[0]]

        async def failing():
            async with pool.lease() as lease:
                await lease.run(lambda: 1 / 0)

        with pytest.raises(ZeroDivisionError):
            await failing()
        assert pool._idle == [seen[0]]  # reused, and back again after the error
        lease = pool.lease()
        async with lease:
            pass
        with pytest.raises(RuntimeError, match="lease has ended"):
            await lease.run(print)

    asyncio.run(main())


def test_a_rollout_cancelled_while_its_env_is_made_gives_the_env_back_when_made():
    gate = threading.Event()

    def slow_make():
        gate.wait(30)
        return SlowEnv()

    async def main():
        pool = EnvPool(slow_make)
        task = asyncio.create_task(_episode(pool, []))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()
        for _ in range(500):
            if pool._idle:
                break
            await asyncio.sleep(0.01)
        assert len(pool._idle) == 1 and len(pool._all) == 1

    asyncio.run(main())
