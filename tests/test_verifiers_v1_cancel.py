"""verifiers 0.4 adapter (envs/adapters/verifiers_v1_env.py): a rollout cancelled during its env's step gives the env
back to the pool only once the step has finished (issue 49).

``GymEnv.run`` awaited ``asyncio.to_thread(env.step, ...)`` and gave the env back in its ``finally``: a cancelled
rollout (verifiers cancels on a timeout or at shutdown) gave it back at once while the step went on in its thread, so
the next episode could take that env and reset it during the step. Runs in the verifiers 0.4 venv (see
tests/test_verifiers_v1_env.py); skipped elsewhere (tests/test_env_pool.py checks the pool's lease everywhere).
"""
from __future__ import annotations

import asyncio
import contextlib
import types

import pytest

vf = pytest.importorskip("verifiers.v1", reason="needs verifiers 0.4 (verifiers.v1) in its own venv")


from envs.adapters import verifiers_v1_env  # noqa: E402
from envs.adapters.verifiers_v1_env import GymEnv  # noqa: E402
from tests.toy_envs import SlowStepEnv  # noqa: E402

GYM_ID = "SlowStep-v0"  # tests.toy_envs.SlowStepEnv


class _Interaction:
    """What ``GymEnv.run`` uses of verifiers' interaction: a trace's ``info`` and ``turn`` (one assistant message)."""

    def __init__(self):
        self.trace = types.SimpleNamespace(info={})

    async def turn(self, messages):
        message = types.SimpleNamespace(role="assistant", content="answer", tool_calls=[])
        return types.SimpleNamespace(terminated=False, messages=[message])


class _Agents:
    def __init__(self):
        self.agent = self

    @contextlib.asynccontextmanager
    async def interaction(self, task):
        yield _Interaction()


def test_a_rollout_cancelled_during_a_step_returns_its_env_only_after_the_step():
    task = types.SimpleNamespace(data=types.SimpleNamespace(gym_id=GYM_ID, make_kwargs={}, task_id="0"))
    SlowStepEnv.rearm()
    pool = verifiers_v1_env._pool(GYM_ID, {})

    async def main():
        rollout = asyncio.create_task(GymEnv.run(None, task, _Agents()))
        assert await asyncio.to_thread(SlowStepEnv.step_started.wait, 60)
        rollout.cancel()
        with pytest.raises(asyncio.CancelledError):
            await rollout
        lent_again = [e.unwrapped for e in pool._idle]
        stepping = [e.unwrapped for e in pool._all if e.unwrapped.busy]
        assert len(stepping) == 1 and stepping[0] not in lent_again, "the env of a running step went back"
        SlowStepEnv.let_steps_end.set()
        for _ in range(1000):
            if stepping[0] in [e.unwrapped for e in pool._idle]:
                break
            await asyncio.sleep(0.01)
        assert stepping[0] in [e.unwrapped for e in pool._idle] and not stepping[0].busy
        assert stepping[0].overlaps == 0

    try:
        asyncio.run(main())
    finally:
        SlowStepEnv.let_steps_end.set()
        pool.close()
