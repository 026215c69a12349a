"""``tau2/agent-gym-v0`` (envs/tau2/agent_gym_compat.py) is a drop-in for tau2's ``AgentGymEnv``.

The same scripted agent loop runs against tau2's own ``tau2.gym.AgentGymEnv`` and against ours,
with the same offline customer (as ``benchmarks/env_bench.py``: our deterministic ``ScriptedUser``
in both; telecom in solo mode, tau2's ``DummyUser``), and every step must give identical
observation strings, rewards and termination flags, and the same ``info`` (tools, policy, task,
the final ``reward_info``). The agent: the gold actions of the first 3 base tasks of airline,
retail and telecom (:func:`envs.tau2.oracle.oracle_functional_actions`: tau2's JSON tool calls and
plain text; the first gold call rewritten in tau2's functional syntax), preceded by an empty action
(not consumed), a call to an unknown tool in functional syntax (an error answer) and, with a
customer, a plain text the customer answers.
"""
from __future__ import annotations

import json

import gymnasium as gym
import pytest

import envs
from envs.tau2.agent_gym_compat import AgentGymCompatEnv, format_observation, tau2_action_to_message
from envs.tau2.logs import set_tau2_logging
from envs.tau2.oracle import oracle_functional_actions
from envs.tau2.tasks import load_tasks

gym.register_envs(envs)
set_tau2_logging(False)

SOLO = {"airline": False, "retail": False, "telecom": True}
CASES = [(d, i) for d in ("airline", "retail", "telecom") for i in range(3)]


def tau2_env(domain: str, task_id: str, solo: bool, **kwargs):
    """tau2's AgentGymEnv with the scripted customer instead of an LLM (as benchmarks/env_bench.py)."""
    from tau2.gym import AgentGymEnv

    from envs.tau2.users import ScriptedUser

    class ScriptedAgentGymEnv(AgentGymEnv):
        def _get_task(self):  # tau2 re-reads the task file on every call (telecom: ~1 s); same Task
            if getattr(self, "_task_cache", None) is None:
                self._task_cache = super()._get_task()
            return self._task_cache

        def _get_user(self):
            if self.solo_mode:
                return super()._get_user()
            return ScriptedUser(self._get_task().user_scenario.instructions)

    return ScriptedAgentGymEnv(domain=domain, task_id=task_id, solo_mode=solo, **kwargs)


def agent_actions(task, solo: bool) -> list[str]:
    from tau2.data_model.message import ToolCall
    from tau2.utils.tools import to_functional_format

    gold = oracle_functional_actions(task, solo)
    first = json.loads(gold[0]) if gold[0].startswith("{") else None
    if first is not None and first["name"] != "done":
        gold[0] = to_functional_format(ToolCall(name=first["name"], arguments=first["arguments"]))
    chat = [] if solo else ["Let me look into that for you (one moment)."]  # answered by the customer
    return ["   ", "lookup_everything(query='all')"] + chat + gold


def _close_tau2(env) -> None:
    t = env._orchestrator_thread
    if t is not None:
        t.join(timeout=5)


@pytest.mark.parametrize("domain,index", CASES, ids=[f"{d}-{i}" for d, i in CASES])
def test_same_scripted_loop_same_strings_and_rewards(domain, index):
    solo = SOLO[domain]
    task = load_tasks(domain, "base")[index]
    theirs = tau2_env(domain, task.id, solo)
    ours = gym.make("tau2/agent-gym-v0", domain=domain, task_id=task.id, solo_mode=solo, user="scripted")
    try:
        obs_t, info_t = theirs.reset()
        obs_o, info_o = ours.reset()
        assert isinstance(obs_o, str) and obs_o == obs_t
        assert solo or obs_o.startswith("user: ")
        assert info_o.keys() == info_t.keys() == {"task", "simulation_run", "tools", "policy"}
        assert [t.name for t in info_o["tools"]] == [t.name for t in info_t["tools"]]
        assert [t.openai_schema for t in info_o["tools"]] == [t.openai_schema for t in info_t["tools"]]
        assert info_o["policy"] == info_t["policy"]
        assert info_o["task"] == info_t["task"]
        assert info_o["simulation_run"] == info_t["simulation_run"] == "{}"

        actions = agent_actions(task, solo)
        for step, action in enumerate(actions):
            out_t = theirs.step(action)
            out_o = ours.step(action)
            where = f"{domain} task {task.id} step {step} action {action[:60]!r}"
            assert out_o[0] == out_t[0], where
            assert out_o[1:4] == out_t[1:4], where  # reward, terminated, truncated
            info_t, info_o = out_t[4], out_o[4]
            assert info_o.keys() == info_t.keys(), where
            if out_t[2]:
                break
        assert out_t[2] and out_o[2], "the gold episode ends"
        assert step == len(actions) - 1, "both end on the last gold action"
        assert out_o[1] == out_t[1] == 1.0, "gold replay scores 1"
        rt, ro = json.loads(info_t["reward_info"]), json.loads(info_o["reward_info"])
        assert ro["reward"] == rt["reward"] and ro["reward_basis"] == rt["reward_basis"]
        assert ro["db_check"] == rt["db_check"]
        assert json.loads(info_o["simulation_run"])["task_id"] == task.id
        # a step after the end: tau2 answers ("", 0.0, True, False, info) instead of raising
        after_t, after_o = theirs.step("anything"), ours.step("anything")
        assert after_o[:4] == after_t[:4] == ("", 0.0, True, False)
    finally:
        _close_tau2(theirs)
        ours.close()


def test_all_messages_as_observation_matches_tau2():
    """``all_messages_as_observation=True``: the whole agent-visible history, tool calls written
    in functional syntax, on one airline task (customer) and one telecom task (solo)."""
    for domain in ("airline", "telecom"):
        solo = SOLO[domain]
        task = load_tasks(domain, "base")[0]
        theirs = tau2_env(domain, task.id, solo, all_messages_as_observation=True)
        ours = gym.make(
            "tau2/agent-gym-v0", domain=domain, task_id=task.id, solo_mode=solo, user="scripted",
            all_messages_as_observation=True,
        )
        try:
            assert ours.reset()[0] == theirs.reset()[0]
            for action in agent_actions(task, solo):
                out_t, out_o = theirs.step(action), ours.step(action)
                assert out_o[:4] == out_t[:4], (domain, action)
                if out_t[2]:
                    break
            assert out_o[2] and out_o[1] == 1.0
        finally:
            _close_tau2(theirs)
            ours.close()


@pytest.mark.parametrize(
    "domain,max_steps,text_last",
    [("retail", 6, False), ("retail", 7, False), ("retail", 4, True), ("retail", 5, True), ("telecom", 4, False), ("telecom", 5, False)],
)
def test_step_limit_ends_on_the_same_action(domain, max_steps, text_last):
    """tau2's ``max_steps`` counts orchestrator messages: both envs end on the same action with the
    same observation (a text at the limit: answered for odd ``max_steps``, not for even)."""
    solo = SOLO[domain]
    task = load_tasks(domain, "base")[1]
    actions = ["lookup_everything(query='all')"] * 8
    if text_last:
        actions = ["Let me check."] * 8
    theirs = tau2_env(domain, task.id, solo, max_steps=max_steps)
    ours = gym.make("tau2/agent-gym-v0", domain=domain, task_id=task.id, solo_mode=solo, user="scripted", max_steps=max_steps)
    try:
        assert ours.reset()[0] == theirs.reset()[0]
        for n, action in enumerate(actions, 1):
            out_t, out_o = theirs.step(action), ours.step(action)
            assert out_o[:4] == out_t[:4], (n, out_o[:4], out_t[:4])
            if out_t[2]:
                break
        assert out_t[2] and json.loads(out_o[4]["simulation_run"])["termination_reason"] == "max_steps"
    finally:
        _close_tau2(theirs)
        ours.close()


def test_solo_text_is_an_agent_error_with_empty_observation():
    """In solo mode a text message ends the episode (tau2's agent_error, reward 0, obs "")."""
    task = load_tasks("telecom", "base")[0]
    theirs = tau2_env("telecom", task.id, True)
    ours = AgentGymCompatEnv("telecom", task.id, solo_mode=True)
    try:
        assert ours.reset()[0] == theirs.reset()[0] == ""
        out_t, out_o = theirs.step("Let me check."), ours.step("Let me check.")
        assert out_o[:4] == out_t[:4] == ("", 0.0, True, False)
        assert json.loads(out_o[4]["simulation_run"])["termination_reason"] == "agent_error"
    finally:
        _close_tau2(theirs)


def test_step_before_reset_raises_and_default_user_is_tau2s_llm():
    from tau2.config import DEFAULT_LLM_USER

    env = AgentGymCompatEnv("airline", "0")
    assert env.env.user_kind == "llm" and env.user_llm == DEFAULT_LLM_USER
    with pytest.raises(RuntimeError):
        env.step("hello")


def test_action_parsing_and_formatting_follow_tau2():
    assert tau2_action_to_message('{"name": "get_user_details", "arguments": {"user_id": "u1"}}') == {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "get_user_details", "arguments": {"user_id": "u1"}}}],
    }
    assert tau2_action_to_message("get_user_details(user_id='u1')")["tool_calls"][0]["function"]["arguments"] == {"user_id": "u1"}
    assert tau2_action_to_message("Sure (I can help)") == {"role": "assistant", "content": "Sure (I can help)"}
    with pytest.raises(ValueError, match="empty"):
        tau2_action_to_message("  ")
    msgs = [
        {"role": "system", "content": "policy"},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "I need help"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"b": 2, "a": "x"}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
    ]
    assert format_observation(msgs) == "tool: ok"
    assert format_observation(msgs, all_messages=True) == "assistant: Hi!\nuser: I need help\nassistant: f(a='x', b=2)\ntool: ok"
