"""``gym.make_vec`` on our text envs, sync and async (issue 13, section 5): the batched spaces, reset/step with text
actions, and Gymnasium 1.x's default next-step autoreset. Async envs run in subprocesses: ``num_envs`` stays at 2."""
from __future__ import annotations

import copy
import multiprocessing as mp

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, create_empty_array, create_shared_memory, read_from_shared_memory, \
    write_to_shared_memory

import envs
from envs.gsm8k import GSM8KEnv
from envs.spaces import AssistantAction, ChatMessages, SharedChatBatch

gym.register_envs(envs)
MODES = ["sync", "async"]


def _check_spaces(venv, n: int) -> None:
    assert venv.num_envs == n and venv.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert isinstance(venv.single_observation_space, ChatMessages)
    assert isinstance(venv.single_action_space, AssistantAction)
    assert venv.observation_space == batch_space(venv.single_observation_space, n)
    assert venv.action_space == batch_space(venv.single_action_space, n)
    sample = venv.action_space.sample()
    assert isinstance(sample, tuple) and len(sample) == n and venv.action_space.contains(sample)


def _check_obs(venv, obs, n: int) -> None:
    assert type(obs) is tuple and len(obs) == n  # a plain tuple in both modes (async: copied out of shared memory)
    assert venv.observation_space.contains(obs)


@pytest.mark.parametrize("mode", MODES)
def test_make_vec_gsm8k_steps_and_autoresets(mode):
    n = 3 if mode == "sync" else 2
    venv = gym.make_vec("GSM8K-v1", num_envs=n, vectorization_mode=mode, split="test")
    try:
        _check_spaces(venv, n)
        obs, info = venv.reset(seed=7)
        _check_obs(venv, obs, n)
        single = GSM8KEnv(split="test")  # env i is seeded with seed + i
        assert info["index"].tolist() == [single.reset(seed=7 + i)[1]["index"] for i in range(n)]
        assert [o[-1]["content"] for o in obs] == [single._problems[i]["question"] for i in info["index"]]
        actions = [f"So the answer is\n#### {info['answer'][0]}"] + [{"role": "assistant", "content": "#### 0.5"}] * (n - 1)
        obs, rew, term, trunc, info = venv.step(actions)
        assert rew.tolist() == [1.0] + [0.0] * (n - 1) and term.all() and not trunc.any()
        assert obs == tuple([] for _ in range(n)) and info["termination_reason"].tolist() == ["answered"] * n
        # next-step autoreset: the step after the end ignores the actions, resets, returns reward 0, not done
        obs, rew, term, trunc, info = venv.step(("ignored",) * n)
        _check_obs(venv, obs, n)
        assert [[m["role"] for m in o] for o in obs] == [["system", "user"]] * n
        assert rew.tolist() == [0.0] * n and not term.any() and not trunc.any()
        obs, rew, term, _, _ = venv.step([f"#### {a}" for a in info["answer"]])  # the new problems are graded
        assert rew.tolist() == [1.0] * n and term.all()
    finally:
        venv.close()


@pytest.mark.parametrize("mode", MODES)
def test_make_vec_tau2_retail_default_user_and_autoreset(mode):
    venv = gym.make_vec("tau2/retail-v0", num_envs=2, vectorization_mode=mode, max_steps=2)
    try:
        _check_spaces(venv, 2)
        obs, info = venv.reset(seed=0)
        _check_obs(venv, obs, 2)
        assert info["user"].tolist() == ["scripted", "scripted"]  # retail's default customer: offline, scripted
        assert [[m["role"] for m in o] for o in obs] == [["system", "assistant", "user"]] * 2
        for _ in range(2):  # text actions, as a tuple of str / assistant-message dicts
            obs, rew, term, trunc, info = venv.step(("Could you give me your order id?",
                                                     {"role": "assistant", "content": "Let me check that."}))
            _check_obs(venv, obs, 2)
            assert all(o and o[-1]["role"] == "user" for o in obs)  # the scripted customer answers each turn
        assert trunc.all() and not term.any() and info["termination_reason"].tolist() == ["max_steps"] * 2
        obs, rew, term, trunc, _ = venv.step(("ignored", "ignored"))  # next-step autoreset
        assert [[m["role"] for m in o] for o in obs] == [["system", "assistant", "user"]] * 2
        assert rew.tolist() == [0.0, 0.0] and not term.any() and not trunc.any()
    finally:
        venv.close()


def test_single_envs_pass_gymnasium_check_env():
    check_env(gym.make("GSM8K-v1", split="test").unwrapped)
    check_env(gym.make("tau2/retail-v0").unwrapped, skip_render_check=True)  # default user (scripted)


def test_async_without_shared_memory():
    venv = gym.make_vec("GSM8K-v1", num_envs=2, vectorization_mode="async", split="test",
                        vector_kwargs={"shared_memory": False})
    try:
        obs, info = venv.reset(seed=0)
        assert type(obs) is tuple and [len(o) for o in obs] == [2, 2]
        _, rew, term, _, _ = venv.step([f"#### {a}" for a in info["answer"]])
        assert rew.tolist() == [1.0, 1.0] and term.all()
    finally:
        venv.close()


def test_shared_memory_slots_round_trip_and_overflow():
    space = ChatMessages(shared_memory_bytes=512)
    shm = create_shared_memory(space, n=3, ctx=mp.get_context())
    view = read_from_shared_memory(space, shm, n=3)
    assert isinstance(view, SharedChatBatch) and tuple(view) == ([], [], [])  # nothing written yet
    msgs = [{"role": "user", "content": "héllo ✓"}, {"role": "assistant", "content": None,
                                                     "tool_calls": [{"id": "1", "function": {"name": "f"}}]}]
    write_to_shared_memory(space, 1, msgs, shm)
    assert view[1] == msgs and view[0] == [] and view[-2] == msgs and view == ([], msgs, [])  # live view
    snapshot = copy.deepcopy(view)
    assert type(snapshot) is tuple and snapshot == ([], msgs, [])
    write_to_shared_memory(space, 1, [], shm)
    assert view[1] == [] and snapshot[1] == msgs  # the copy does not follow later writes
    with pytest.raises(ValueError, match="shared_memory"):
        write_to_shared_memory(space, 0, [{"role": "user", "content": "x" * 600}], shm)
    with pytest.raises(IndexError):
        view[3]
    assert create_empty_array(space, n=2) == ([], []) and create_empty_array(AssistantAction(), n=2) == ("", "")
    assert np.all([space.contains(o) for o in create_empty_array(space, n=2)])
