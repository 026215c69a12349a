"""A tiny verifiable text task for end-to-end trainer tests (no data files, instant rewards), and an env whose step
blocks (:class:`SlowStepEnv`, for the adapters' cancellation tests).

``ToyVowels-v0``: the prompt asks for vowels; the reward is the fraction of the reply's characters that are
lowercase vowels (in [0, 1]). A random policy already scores 0.1-0.4 with spread inside every group, so GRPO has
signal from step one and a learning policy visibly raises the mean reward.
"""
from __future__ import annotations

import threading

import gymnasium as gym
from gymnasium.envs.registration import register, registry


class ToyVowelsEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, split: str = "train", n_tasks: int = 8):
        self.split = split
        self.num_tasks = n_tasks
        self.observation_space = gym.spaces.Text(4096)
        self.action_space = gym.spaces.Text(4096)
        self._done = True

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        idx = int((options or {}).get("index", self.np_random.integers(self.num_tasks)))
        self._messages = [
            {"role": "system", "content": "You only write vowels."},
            {"role": "user", "content": f"Task {idx}: write many vowels."},
        ]
        self._done = False
        return list(self._messages), {"messages": list(self._messages), "index": idx}

    def step(self, action):
        if self._done:
            raise RuntimeError("reset() first")
        text = action if isinstance(action, str) else str(action.get("content", ""))
        self._done = True
        reward = sum(c in "aeiou" for c in text) / max(1, len(text))
        msgs = self._messages + [{"role": "assistant", "content": text}]
        return [], float(reward), True, False, {"messages": msgs}


if "ToyVowels-v0" not in registry:
    register(id="ToyVowels-v0", entry_point="tests.toy_envs:ToyVowelsEnv")


class ToyFlakyEnv(ToyVowelsEnv):
    """``ToyFlaky-v0``: ToyVowels whose infrastructure fails on some tasks (for the infra-failure filter).

    Task index ``i`` with ``i % 4 == 1``: ``step`` raises (an env/backend outage); ``i % 4 == 3``: the episode ends
    with ``termination_reason="user_error"`` (a failed customer simulator, as tau2 reports it); other tasks behave
    like ToyVowels.
    """

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self._idx = info["index"]
        return obs, info

    def step(self, action):
        if self._idx % 4 == 1:
            self._done = True
            raise RuntimeError("simulated infrastructure outage")
        obs, reward, term, trunc, info = super().step(action)
        if self._idx % 4 == 3:
            info = {**info, "termination_reason": "user_error", "user_error": "simulated customer failure"}
            reward = 0.0
        return obs, reward, term, trunc, info


if "ToyFlaky-v0" not in registry:
    register(id="ToyFlaky-v0", entry_point="tests.toy_envs:ToyFlakyEnv")


class SlowStepEnv(gym.Env):
    """``step`` blocks until :attr:`let_steps_end` is set (:meth:`rearm` clears both events for a new test);
    :attr:`overlaps` counts calls that began while another call on the same env ran. Observations are chat messages,
    as the verifiers adapters expect."""

    let_steps_end = threading.Event()
    step_started = threading.Event()

    def __init__(self):
        self.observation_space, self.action_space = gym.spaces.Text(100), gym.spaces.Text(100)
        self.busy, self.overlaps = False, 0

    @classmethod
    def rearm(cls) -> None:
        cls.let_steps_end.clear()
        cls.step_started.clear()

    def reset(self, *, seed=None, options=None):
        self.overlaps += self.busy
        return [{"role": "user", "content": "go"}], {}

    def step(self, action):
        self.overlaps += self.busy
        self.busy = True
        SlowStepEnv.step_started.set()
        SlowStepEnv.let_steps_end.wait(60)
        self.busy = False
        return [{"role": "user", "content": "ok"}], 1.0, True, False, {}


if "SlowStep-v0" not in registry:
    register(id="SlowStep-v0", entry_point="tests.toy_envs:SlowStepEnv", disable_env_checker=True)
