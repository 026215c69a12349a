"""1,000 fuzzed malformed actions per domain: no exception, every call answered with an error
tool message, database hashes unchanged, pristine snapshot untouched."""
import json
import random

import gymnasium as gym
import pytest

import envs
from envs.tau2.cow import db_hash

gym.register_envs(envs)

N_ACTIONS = 1000
_WRONG = {"string": 12345, "integer": "abc", "number": "abc", "boolean": "maybe", "array": "not-a-list", "object": 7}


def _invalid_arguments(rng: random.Random, schema: dict) -> dict:
    """Arguments that the tool's parameter model must reject."""
    params = schema["function"]["parameters"]
    props = params.get("properties", {})
    required = params.get("required", [])
    valid_like = {k: "x" for k in props}
    kind = rng.randrange(3)
    if kind == 0 or not props:  # an unknown key
        return {**valid_like, f"bogus_{rng.randrange(100)}": rng.choice([1, "x", None, [1]])}
    if kind == 1 and required:  # a required key missing
        args = {k: "x" for k in props}
        del args[rng.choice(required)]
        return args
    typed = [k for k, v in props.items() if v.get("type") in _WRONG]
    if typed:  # a wrongly typed value
        k = rng.choice(typed)
        return {**valid_like, k: _WRONG[props[k]["type"]]}
    return {**valid_like, "bogus": 1}


def _malformed_action(rng: random.Random, tools: list[dict]):
    names = [t["function"]["name"] for t in tools if t["function"]["name"] != "done"]
    kind = rng.randrange(9)
    if kind == 0:  # truncated JSON in a Hermes block
        full = json.dumps({"name": rng.choice(names), "arguments": {"a": "b" * rng.randrange(5)}})
        return f"<tool_call>{full[: rng.randrange(1, len(full) - 1)]}</tool_call>"
    if kind == 1:  # unknown tool
        return f'<tool_call>{{"name": "nope_{rng.randrange(10**6)}", "arguments": {{}}}}</tool_call>'
    if kind == 2:  # arguments not an object
        return json.dumps({"name": rng.choice(names), "arguments": rng.choice([[1, 2], 3, "str", True])})
    if kind == 3:  # no name
        return '<tool_call>{"arguments": {"x": 1}}</tool_call>'
    if kind == 4:  # invalid arguments for a real tool (Hermes)
        t = rng.choice([t for t in tools if t["function"]["name"] != "done"])
        return f'<tool_call>{json.dumps({"name": t["function"]["name"], "arguments": _invalid_arguments(rng, t)})}</tool_call>'
    if kind == 5:  # invalid arguments, OpenAI message dict, JSON-string arguments
        t = rng.choice([t for t in tools if t["function"]["name"] != "done"])
        args = json.dumps(_invalid_arguments(rng, t))
        return {"role": "assistant", "content": None, "tool_calls": [{"id": f"f{rng.randrange(99)}", "type": "function", "function": {"name": t["function"]["name"], "arguments": args}}]}
    if kind == 6:  # broken JSON string arguments in a dict
        return {"tool_calls": [{"function": {"name": rng.choice(names), "arguments": '{"a": '}}]}
    if kind == 7:  # tau2 functional syntax with unparsable arguments
        return f"{rng.choice(names)}(x=[1, 2)"
    # several malformed calls in one message, each a Hermes block (kinds 0, 1, 3, 4)
    blocks = []
    while len(blocks) < 3:
        a = _malformed_action(rng, tools)
        if isinstance(a, str) and a.startswith("<tool_call>"):
            blocks.append(a)
    return "\n".join(blocks)


@pytest.mark.parametrize("domain", envs.TAU2_DOMAINS)
def test_fuzzed_malformed_actions(domain):
    env = gym.make(f"tau2/{domain}-v0", max_steps=N_ACTIONS + 10)
    obs, info = env.reset(seed=0)
    u = env.unwrapped
    live = u.tau2_environment
    h_agent, h_user = live.get_db_hash(), live.get_user_db_hash()
    h_pristine = db_hash(u.domain.agent_snapshot.pristine)
    rng = random.Random(1234)
    n_tool_msgs = 0
    for k in range(N_ACTIONS):
        action = _malformed_action(rng, info["tools"])
        obs, r, term, trunc, info = env.step(action)
        assert not term and not trunc and r == 0.0, (k, action, info.get("termination_reason"))
        assert obs and all(m["role"] == "tool" and m["content"].startswith("Error") for m in obs), (action, obs)
        n_tool_msgs += len(obs)
        if k % 250 == 0:
            assert live.get_db_hash() == h_agent
    assert n_tool_msgs >= N_ACTIONS
    assert live.get_db_hash() == h_agent and live.get_user_db_hash() == h_user
    assert db_hash(u.domain.agent_snapshot.pristine) == h_pristine
