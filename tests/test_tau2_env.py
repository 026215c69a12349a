"""Tau2Env protocol: registration, spaces, reset options, actions, endings, info, vectorization."""
import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs.tau2.tasks import load_tasks, task_splits

gym.register_envs(envs)

IDS = [f"tau2/{d}-v0" for d in envs.TAU2_DOMAINS]


def tool_call(name, **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


@pytest.mark.parametrize("env_id", IDS)
def test_check_env_every_id(env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)


def test_every_split_tau2_defines():
    expected = {
        "airline": {"train", "test", "base"},
        "retail": {"train", "test", "base"},
        "telecom": {"small", "train", "test", "base", "full"},
        "mock": {"base", "generated_train", "generated_test"},  # generated: envs/tau2/generated_tasks.py
    }
    for domain, splits in expected.items():
        assert set(task_splits(domain)) == splits
        for split in splits:
            ts = load_tasks(domain, split)
            assert len(ts) == len(task_splits(domain)[split]) > 0
    assert len(load_tasks("telecom", "full")) == 2285
    env = gym.make("tau2/airline-v0", split="test")
    _, info = env.reset(seed=0)
    assert info["split"] == "test" and info["task_id"] in task_splits("airline")["test"]


def test_task_files_load_once_per_process():
    from envs.tau2 import tasks

    load_tasks("telecom", "small")
    before = tasks._all_tasks.cache_info()
    for split in ("base", "train", "test", "full", "small"):
        load_tasks("telecom", split)
    after = tasks._all_tasks.cache_info()
    assert after.misses == before.misses  # tasks.json parsed once
    assert load_tasks("telecom", "small") is load_tasks("telecom", "small")
    full, small = load_tasks("telecom", "full"), load_tasks("telecom", "small")
    assert small[0] is full[full.index_of(small[0].id)]  # splits share the Task objects


def test_reset_by_task_id_index_and_seed():
    env = gym.make("tau2/airline-v0")
    u = env.unwrapped
    _, info = env.reset(options={"task_id": "3"})
    assert info["task_id"] == "3" and u.tasks[info["index"]].id == "3"
    _, info = env.reset(options={"index": 5})
    assert info["index"] == 5
    picks = [env.reset(seed=7)[1]["task_id"], env.reset(seed=7)[1]["task_id"]]
    assert picks[0] == picks[1]
    assert len({env.reset(seed=s)[1]["task_id"] for s in range(20)}) > 3
    with pytest.raises(KeyError):
        env.reset(options={"task_id": "no-such-task"})
    with pytest.raises(ValueError):
        env.reset(options={"index": 10_000})
    with pytest.raises(ValueError):
        env.reset(options={"tsk_id": "3"})


def test_reset_observation_and_info():
    env = gym.make("tau2/retail-v0")
    obs, info = env.reset(options={"index": 0})
    assert [m["role"] for m in obs] == ["system", "assistant", "user"]
    assert "<policy>" in obs[0]["content"] and "Retail agent policy" in obs[0]["content"]
    assert obs[1]["content"] == "Hi! How can I help you today?"
    assert "#W2378156" in obs[2]["content"]  # the task's reason for calling
    assert info["messages"] == obs
    names = [t["function"]["name"] for t in info["tools"]]
    assert "get_order_details" in names and "done" in names
    assert all(t["type"] == "function" and "parameters" in t["function"] for t in info["tools"])
    assert env.observation_space.contains(obs)


def test_solo_system_prompt_has_policy_and_ticket():
    env = gym.make("tau2/telecom-v0")  # solo by default
    obs, info = env.reset(options={"index": 0})
    u = env.unwrapped
    assert [m["role"] for m in obs] == ["system"]
    assert u.task.ticket in obs[0]["content"] and "<ticket>" in obs[0]["content"]
    names = {t["function"]["name"] for t in info["tools"]}
    assert {"toggle_airplane_mode", "get_customer_by_phone", "done"} <= names  # user + agent tools


def test_solo_rejected_for_airline_and_bad_kwargs():
    with pytest.raises(ValueError, match="solo"):
        gym.make("tau2/airline-v0", user="solo")
    with pytest.raises(ValueError):
        gym.make("tau2/airline-v0", user="nobody")
    with pytest.raises(ValueError):
        gym.make("tau2/airline-v0", user="llm")
    with pytest.raises(ValueError):
        gym.make("tau2/airline-v0", split="nope")
    with pytest.raises(ValueError):
        gym.make("tau2/airline-v0", reward="dense")


def test_tool_calls_run_in_order_and_errors_come_back():
    env = gym.make("tau2/airline-v0")
    env.reset(options={"task_id": "0"})
    u = env.unwrapped
    h0 = u.tau2_environment.get_db_hash()
    action = (
        "Let me check. "
        + tool_call("get_user_details", user_id="emma_kim_9957")
        + tool_call("no_such_tool", x=1)
        + tool_call("get_reservation_details", reservation_id=5)
        + '<tool_call>{"name": "get_user_details", "arguments": {"user_id": </tool_call>'
    )
    obs, r, term, trunc, info = env.step(action)
    assert not term and not trunc and r == 0.0
    assert [m["role"] for m in obs] == ["tool"] * 4
    assert [m["tool_call_id"] for m in obs] == [f"call_1_{i}" for i in range(4)]
    assert "emma_kim_9957" in obs[0]["content"] and not obs[0]["content"].startswith("Error")
    assert obs[1]["content"].startswith("Error") and "not found" in obs[1]["content"]
    assert obs[2]["content"].startswith("Error") and "reservation_id" in obs[2]["content"]
    assert obs[3]["content"].startswith("Error") and "not valid JSON" in obs[3]["content"]
    assert info["num_errors"] == 3
    assert u.tau2_environment.get_db_hash() == h0
    # the assistant turn is recorded with all four calls, answered in order
    msgs = info["messages"]
    assert msgs[-5]["role"] == "assistant" and len(msgs[-5]["tool_calls"]) == 4
    assert msgs[-5]["content"] == "Let me check."


def test_functional_and_dict_actions():
    env = gym.make("tau2/airline-v0")
    env.reset(options={"task_id": "0"})
    obs, *_ = env.step("get_user_details(user_id='emma_kim_9957')")
    assert obs[0]["role"] == "tool" and "emma_kim_9957" in obs[0]["content"]
    msg = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "x1", "type": "function", "function": {"name": "list_all_airports", "arguments": "{}"}}],
    }
    obs, *_ = env.step(msg)
    assert obs[0]["tool_call_id"] == "x1" and "JFK" in obs[0]["content"]


def test_empty_actions_are_action_errors_and_non_text_is_a_type_error():
    env = gym.make("tau2/retail-v0", max_steps=50)
    env.reset(options={"index": 0})
    n = len(env.unwrapped._messages)
    for bad in ["", "   ", {"content": None}]:
        obs, r, term, trunc, info = env.step(bad)
        assert obs == [] and r == 0.0 and not term and "action_error" in info
    for bad in [None, 12, ["x"], {"role": "user", "content": "hi"}, {"content": 5}, {"tool_calls": "x"}]:
        with pytest.raises(TypeError, match="action"):
            env.step(bad)
    assert len(env.unwrapped._messages) == n and env.unwrapped._steps == 3


def test_malformed_and_unknown_tool_calls_set_action_error():
    env = gym.make("tau2/telecom-v0", split="small")
    env.reset(options={"index": 0})
    obs, r, term, trunc, info = env.step('<tool_call>{"name": "check_status_bar", "arguments": </tool_call>')
    assert obs[0]["content"].startswith("Error") and info["num_errors"] == 1 and "not valid JSON" in info["action_error"]
    obs, r, term, trunc, info = env.step(tool_call("no_such_tool"))
    assert info["num_errors"] == 2 and "no_such_tool" in info["action_error"]
    obs, r, term, trunc, info = env.step(tool_call("check_status_bar"))
    assert "action_error" not in info and info["num_errors"] == 2


def test_scripted_user_ends_the_conversation():
    env = gym.make("tau2/airline-v0")
    env.reset(options={"task_id": "0"})
    obs, r, term, trunc, info = env.step("Could you confirm you want me to cancel it?")
    assert not term and obs[0]["role"] == "user" and "yes" in obs[0]["content"].lower()
    obs, r, term, trunc, info = env.step("Done. Is there anything else I can help you with?")
    assert term and not trunc
    assert info["termination_reason"] == "user_stop" and "###STOP###" in obs[0]["content"]
    assert "reward_info" in info and r == info["reward_binary"]


def test_scripted_user_hangs_up_after_max_turns_and_on_transfer():
    env = gym.make("tau2/retail-v0", scripted_max_turns=3)
    env.reset(options={"index": 0})
    ends = [env.step("Please hold on.")[2] for _ in range(3)]
    assert ends == [False, False, True]
    env.reset(options={"index": 0})
    obs, *_ = env.step(tool_call("transfer_to_human_agents", summary="customer wants a human"))
    assert obs[0]["content"] == "Transfer successful"
    obs, r, term, trunc, info = env.step("YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON.")
    assert term and obs[0]["content"] == "###TRANSFER###" and info["termination_reason"] == "user_stop"


def test_solo_text_message_is_an_agent_error_and_done_stops():
    env = gym.make("tau2/telecom-v0")
    env.reset(options={"index": 0})
    obs, r, term, trunc, info = env.step("I will now help you.")
    assert term and info["termination_reason"] == "agent_error" and r == 0.0
    env.reset(options={"index": 0})
    obs, r, term, trunc, info = env.step(tool_call("check_status_bar") + tool_call("done"))
    assert term and info["termination_reason"] == "agent_stop"
    assert obs[0]["role"] == "tool" and len(obs) == 1  # the call before done ran


def test_max_steps_truncates_and_max_errors_terminates():
    env = gym.make("tau2/mock-v0", max_steps=3)
    env.reset(options={"index": 0})
    flags = [env.step(tool_call("no_such_tool"))[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    env = gym.make("tau2/mock-v0", max_errors=2)
    env.reset(options={"index": 0})
    env.step(tool_call("no_such_tool"))
    obs, r, term, trunc, info = env.step(tool_call("no_such_tool"))
    assert term and info["termination_reason"] == "too_many_errors"
    with pytest.raises(RuntimeError, match=r"episode has ended; call reset\(\)"):
        env.step("hello")  # after the end (env contract: as Gymnasium's own envs)


def test_mock_task_with_history():
    env = gym.make("tau2/mock-v0")
    obs, info = env.reset(options={"task_id": "update_task_with_message_history"})
    roles = [m["role"] for m in obs]
    assert roles[0] == "system" and "tool" in roles
    with pytest.raises(ValueError, match="solo"):
        gym.make("tau2/mock-v0", user="solo").reset(options={"task_id": "update_task_with_message_history"})


def test_make_vec_sync():
    venv = gym.make_vec("tau2/mock-v0", num_envs=2, vectorization_mode="sync")
    obs, info = venv.reset(seed=0)
    assert len(obs) == 2 and all(isinstance(o, list) for o in obs)
    obs, rew, term, trunc, info = venv.step(("###STOP###", tool_call("no_such_tool")))
    assert term.tolist() == [True, False] and rew.dtype == np.float64
    assert info["termination_reason"][0] == "agent_stop"
    venv.close()


def test_render_ansi():
    env = gym.make("tau2/mock-v0", render_mode="ansi")
    env.reset(options={"index": 0})
    text = env.render()
    assert text.startswith("[system]") and "[user]" in text


def test_import_is_offline_and_quiet():
    """Importing and using the env opens no socket; tau2's loguru output is off by default."""
    code = (
        "import socket\n"
        "def _deny(*a, **k): raise RuntimeError('network access at import')\n"
        "socket.socket.connect = _deny\n"
        "socket.create_connection = _deny\n"
        "socket.getaddrinfo = _deny\n"
        "import gymnasium as gym, envs\n"
        "gym.register_envs(envs)\n"
        "env = gym.make('tau2/mock-v0')\n"
        "env.reset(options={'index': 0})\n"
        "env.step('<tool_call>{\"name\": \"no_such_tool\", \"arguments\": {}}</tool_call>')\n"
        "print('OK')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("OK")
    assert "| DEBUG" not in out.stderr and "| INFO" not in out.stderr and len(out.stderr) < 2000, out.stderr[-2000:]


def test_usable_task_indices_are_the_tasks_reset_accepts():
    env = gym.make("tau2/mock-v0", user="solo").unwrapped
    accepted = []
    for i in range(env.num_tasks):
        try:
            env.reset(seed=0, options={"index": i})
            accepted.append(i)
        except ValueError as e:
            assert "solo mode" in str(e)
    assert env.usable_task_indices() == accepted and len(accepted) == 7 < env.num_tasks == 9
    assert env.usable_task_indices(3) == accepted[:3]
    assert gym.make("tau2/mock-v0", user="scripted").unwrapped.usable_task_indices() == list(range(9))
