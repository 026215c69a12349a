"""GSM8K data loading and the Gymnasium env (envs.gsm8k.data, envs.gsm8k.env)."""
from __future__ import annotations

import json
import sys
import types

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs import task_list_cache
from envs.gsm8k.data import load_gsm8k
from envs.gsm8k.env import DEFAULT_SYSTEM_PROMPT, GSM8KEnv
from envs.spaces import AssistantAction, ChatMessages

from tests.gsm8k_data import DATA_DIR, needs_data  # noqa: E402

TOY = [
    {"question": "What is 2 + 3?", "answer": "5"},
    {"question": "A pen costs $1,200. What do 2 pens cost?", "answer": "#### 2,400"},
    {"question": "What is 7 - 10?", "answer": -3},
]


@pytest.fixture
def data_env(monkeypatch):
    monkeypatch.setenv("GSM8K_DATA_DIR", str(DATA_DIR))


@pytest.fixture
def toy_env():
    return GSM8KEnv(data=TOY)


# ----------------------------------------------------------------------------- data loading
@needs_data
def test_load_real_splits(data_env):
    train, test = load_gsm8k("train"), load_gsm8k("test")
    assert (len(train), len(test)) == (7473, 1319)
    assert train[0]["answer"] == "72" and train[0]["solution"].endswith("#### 72")
    assert set(train[0]) == {"question", "answer", "solution"}
    again = load_gsm8k("train", DATA_DIR)
    assert again == train and again is not train  # cached content, fresh list


def test_load_local_dir(tmp_path):
    rows = [{"question": "q1", "answer": "a\n#### 1,000"}, {"question": "q2", "answer": "#### -2"}]
    (tmp_path / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    probs = load_gsm8k("test", tmp_path)
    assert [p["answer"] for p in probs] == ["1000", "-2"]


def test_missing_data_dir_errors(tmp_path, monkeypatch):
    # (no data_dir and no $GSM8K_DATA_DIR loads the packaged copy: tests/test_gsm8k_packaged_data.py)
    monkeypatch.delenv("GSM8K_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_gsm8k("train", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"train\.jsonl"):
        load_gsm8k("train", tmp_path)  # directory exists but holds no train.jsonl
    monkeypatch.setenv("GSM8K_DATA_DIR", str(tmp_path / "nowhere"))
    gym.register_envs(envs)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        gym.make("GSM8K-v1")


def test_bad_split_and_malformed_lines(tmp_path):
    with pytest.raises(ValueError, match="split"):
        load_gsm8k("validation", tmp_path)
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n{not json}\n')
    with pytest.raises(ValueError, match=r"train\.jsonl:2"):
        load_gsm8k("train", tmp_path)
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "no marker"}\n')
    with pytest.raises(ValueError, match=r"test\.jsonl:1.*####"):
        load_gsm8k("test", tmp_path)
    sub = tmp_path / "b"
    sub.mkdir()
    (sub / "test.jsonl").write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match="missing"):
        load_gsm8k("test", sub)


def test_hf_dataset_id(monkeypatch):
    """A hub id goes through datasets.load_dataset (stubbed here: no network in tests)."""
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        if name != "openai/gsm8k":
            raise ConnectionError("offline")
        return [{"question": "q", "answer": "x\n#### 3"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setattr(task_list_cache, "TASK_LISTS", task_list_cache.TaskListCache())  # a fresh cache
    probs = load_gsm8k("test", "openai/gsm8k")
    assert probs == [{"question": "q", "answer": "3", "solution": "x\n#### 3"}]
    assert calls == [("openai/gsm8k", "main", "test")]
    load_gsm8k("test", "openai/gsm8k")
    assert len(calls) == 1  # cached
    with pytest.raises(FileNotFoundError, match="offline"):
        load_gsm8k("test", "someone/missing")


def test_hf_id_without_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
    monkeypatch.setattr(task_list_cache, "TASK_LISTS", task_list_cache.TaskListCache())  # a fresh cache
    with pytest.raises(ImportError, match="datasets"):
        load_gsm8k("test", "openai/gsm8k")


# ----------------------------------------------------------------------------- env
@needs_data
def test_check_env(data_env):
    gym.register_envs(envs)
    check_env(gym.make("GSM8K-v1", split="test").unwrapped)


def test_check_env_toy(toy_env):
    check_env(toy_env)


@needs_data
def test_reset_by_index(data_env):
    env = GSM8KEnv(split="test")
    problems = load_gsm8k("test")
    obs, info = env.reset(options={"index": 5})
    assert [m["role"] for m in obs] == ["system", "user"]
    assert obs[0]["content"] == DEFAULT_SYSTEM_PROMPT
    assert obs[1]["content"] == problems[5]["question"]
    assert info["answer"] == problems[5]["answer"]
    assert (info["index"], info["task_id"], info["split"]) == (5, "5", "test")
    assert info["messages"] == obs and info["messages"] is not obs
    assert env.observation_space.contains(obs)
    obs2, info2 = env.reset(options={"task_id": "5"})
    assert obs2 == obs


def test_reset_sampling_is_seeded(toy_env):
    a = [toy_env.reset(seed=s)[1]["index"] for s in range(6)]
    b = [toy_env.reset(seed=s)[1]["index"] for s in range(6)]
    assert a == b and len(set(a)) > 1


@pytest.mark.parametrize("options", [{"index": 3}, {"index": -1}, {"index": "a"}, {"task_id": "x"}])
def test_reset_bad_index(toy_env, options):
    with pytest.raises(ValueError):
        toy_env.reset(options=options)


@pytest.mark.parametrize(
    "index,action,reward,correct",
    [
        (0, "2 + 3 = 5\n#### 5", 1.0, True),
        (0, "#### 6", 0.0, False),  # well-formed, wrong: correctness-only by default
        (0, "I think it is 6", 0.0, False),  # no format, wrong
        (0, "it is 5", 1.0, True),  # right without the format
        (1, "2 * 1,200 = 2,400\n#### $2,400.00", 1.0, True),
        (2, "The answer is −3.", 1.0, True),
        (2, {"role": "assistant", "content": "\\boxed{-3}"}, 1.0, True),
        (2, {"content": "#### 3"}, 0.0, False),
    ],
)
def test_step_rewards(toy_env, index, action, reward, correct):
    toy_env.reset(options={"index": index})
    obs, r, terminated, truncated, info = toy_env.step(action)
    assert r == pytest.approx(reward)
    assert (terminated, truncated) == (True, False)
    assert obs == []
    assert info["correct"] is correct
    assert info["answer"] == ["5", "2400", "-3"][index]
    assert info["messages"][-1]["role"] == "assistant"
    assert "action_error" not in info and "error" not in info
    assert info["tools"] == [] and info["termination_reason"] == "answered"


@pytest.mark.parametrize("action", [None, 123, ["#### 5"], {"role": "user", "content": "#### 5"},
                                    {"content": 5}])
def test_non_text_action_is_a_type_error(toy_env, action):
    # env contract: an action outside the action space is the caller's bug; it consumes nothing
    toy_env.reset(options={"index": 0})
    with pytest.raises(TypeError, match="action"):
        toy_env.step(action)
    assert toy_env.step("#### 5")[1] == 1.0


@pytest.mark.parametrize("text", ["", "I do not know", '<tool_call>{"name": "calc", "arguments": </tool_call>'])
def test_unreadable_answer_sets_action_error(toy_env, text):
    toy_env.reset(options={"index": 0})
    obs, r, terminated, _, info = toy_env.step(text)
    assert r == 0.0 and terminated and info["extracted"] is None
    assert info["action_error"] and info["termination_reason"] == "answered"


def test_step_order_errors(toy_env):
    with pytest.raises(RuntimeError, match="before reset"):
        toy_env.step("#### 5")
    toy_env.reset(options={"index": 0})
    toy_env.step("#### 5")
    with pytest.raises(RuntimeError, match=r"episode has ended; call reset\(\)"):
        toy_env.step("#### 5")


def test_env_options():
    env = GSM8KEnv(data=TOY, system_prompt=None, format_reward=0.5, render_mode="ansi")
    obs, _ = env.reset(options={"index": 0})
    assert [m["role"] for m in obs] == ["user"]
    assert env.step("#### 4")[1] == 0.5
    assert "[assistant]\n#### 4" in env.render()
    with pytest.raises(ValueError):
        GSM8KEnv(data=[{"question": "q", "answer": "none"}])
    with pytest.raises(ValueError):
        GSM8KEnv(data=[])


def test_spaces():
    obs_space, act_space = ChatMessages(seed=0), AssistantAction(seed=0)
    assert obs_space.contains(obs_space.sample()) and act_space.contains(act_space.sample())
    assert obs_space.contains([]) and not obs_space.contains([{"role": "bot", "content": ""}])
    assert act_space.contains({"content": None, "tool_calls": []})
    assert not act_space.contains(3) and not act_space.contains({"role": "user", "content": ""})


@needs_data
def test_gym_make(data_env):
    gym.register_envs(envs)
    env = gym.make("GSM8K-v1", split="test")
    obs, info = env.reset(seed=0, options={"index": 0})
    _, reward, terminated, _, info = env.step(f"#### {info['answer']}")
    assert reward == 1.0 and terminated and info["extracted"] == info["answer"]
    env.close()


@needs_data
def test_make_vec(data_env):
    gym.register_envs(envs)
    venv = gym.make_vec("GSM8K-v1", num_envs=3, vectorization_mode="sync", split="test")
    obs, info = venv.reset(seed=0)
    assert isinstance(obs, tuple) and len(obs) == 3
    answers = list(info["answer"])
    actions = (f"#### {answers[0]}", "#### 0.123", "no idea")
    obs, rewards, terminated, truncated, info = venv.step(actions)
    np.testing.assert_allclose(rewards, [1.0, 0.0, 0.0])
    assert terminated.all() and not truncated.any()
    venv.close()


def test_sync_vector_env_toy():
    venv = gym.vector.SyncVectorEnv([lambda: GSM8KEnv(data=TOY) for _ in range(2)])
    venv.reset(seed=1, options={"index": 0})
    _, rewards, terminated, _, _ = venv.step(("#### 5", "#### 4"))
    np.testing.assert_allclose(rewards, [1.0, 0.0])
    assert terminated.all()
    venv.close()
