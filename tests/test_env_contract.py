"""The env contract (envs/contract.py) checked on every Gymnasium id the ``envs`` package registers.

The ids come from the registry (entry points under ``envs.``), so an env added later is tested
without editing this file; ``CHEAP_KWARGS`` only picks the cheapest split / customer per known id.
"""
from __future__ import annotations

import ast
from pathlib import Path

import gymnasium as gym
import pytest

import envs
from envs.spaces import ChatMessages

gym.register_envs(envs)

REGISTERED = sorted(
    env_id for env_id, spec in gym.registry.items()
    if isinstance(spec.entry_point, str) and spec.entry_point.startswith("envs.")
    and env_id not in envs.COMPAT_IDS  # another project's API (tau2's gym), tested in its own file
)

#: Cheapest construction per id (an id not listed here is built with its defaults).
CHEAP_KWARGS = {
    "GSM8K-v1": {"split": "test"},
    "tau2/airline-v0": {"split": "test", "user": "scripted"},
    "tau2/retail-v0": {"split": "test", "user": "scripted"},
    "tau2/telecom-v0": {"split": "small", "user": "solo"},
    "tau2/mock-v0": {"user": "scripted"},
}

PLAIN_TEXT = "Thanks, let me look into that for you."
#: A Hermes/Qwen tool call whose JSON is cut off (no digits: GSM8K cannot read an answer from it either).
MALFORMED_CALL = '<tool_call>{"name": "get_details", "arguments": {"id": </tool_call>'
NON_TEXT = [12345, None, ["hello"], 1.5, b"bytes", {"role": "user", "content": "hi"}, {"content": 5}]
INFO_KEYS = {"messages", "tools", "task_id", "index", "split"}


@pytest.fixture(params=REGISTERED)
def env(request):
    env_id = request.param
    kwargs = dict(CHEAP_KWARGS.get(env_id, {}))
    if env_id.startswith("GSM8K"):
        kwargs["data_dir"] = str(request.getfixturevalue("gsm8k_dir"))
    e = gym.make(env_id, **kwargs)
    yield e
    e.close()


def _check_info(env, info):
    assert INFO_KEYS <= set(info), f"missing info keys {INFO_KEYS - set(info)}"
    assert isinstance(info["tools"], list)
    assert ChatMessages().contains(info["messages"])
    assert isinstance(info["task_id"], str) and isinstance(info["index"], int)
    assert env.unwrapped.task_ids[info["index"]] == info["task_id"]


def _play_to_end(env, first_action, max_steps=50):
    """Step ``first_action`` then plain text until the episode ends; returns the last step's result."""
    action = first_action
    for _ in range(max_steps):
        obs, reward, terminated, truncated, info = env.step(action)
        assert ChatMessages().contains(obs)
        _check_info(env, info)
        if terminated or truncated:
            return reward, info
        assert reward == 0.0  # 0 until the end
        action = PLAIN_TEXT
    raise AssertionError(f"no episode end in {max_steps} steps")


def test_every_registered_id_is_covered():
    assert set(envs.ENV_IDS) <= set(REGISTERED)


def test_envs_never_imports_torchrl_grpo():
    root = Path(envs.__file__).parent
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "torchrl_grpo" for n in names), path


@pytest.mark.parametrize("action", NON_TEXT + ["", "text", {"content": None}, {"tool_calls": []},
                                    {"role": "assistant", "content": "x", "tool_calls": [{"bad": 1}]}], ids=repr)
def test_check_action_is_the_action_space(action):
    from envs.contract import check_action
    from envs.spaces import AssistantAction

    try:
        check_action(action)
        ok = True
    except TypeError:
        ok = False
    assert ok == AssistantAction().contains(action) == (action not in NON_TEXT)


def test_protocol_and_task_listing(env):
    from envs.contract import TextAgentEnv

    u = env.unwrapped
    assert isinstance(u, TextAgentEnv)
    ids = u.task_ids
    assert isinstance(u.num_tasks, int) and u.num_tasks == len(ids) > 0
    assert all(isinstance(i, str) for i in ids) and len(set(ids)) == len(ids)
    usable = u.usable_task_indices()
    assert usable == sorted(set(usable)) and set(usable) <= set(range(u.num_tasks)) and usable
    assert u.usable_task_indices(2) == usable[:2]
    k = usable[-1]
    obs_i, info_i = env.reset(seed=0, options={"index": k})
    obs_t, info_t = env.reset(seed=1, options={"task_id": ids[k]})
    assert (info_i["index"], info_i["task_id"]) == (info_t["index"], info_t["task_id"]) == (k, ids[k])
    assert obs_i == obs_t


#: Spellings of an index that are not its id: other scripts' digits, full-width digits, leading zeros, white space,
#: signs, underscores (issue 42: GSM8K, ReasoningGym and DigitSum read "٣" as 3 and "１", "0001" as 1).
NON_CANONICAL_IDS = ["٣", "１", "0001", "00", " 1", "1 ", "\t1", "+1", "-0", "1_0", "1.0", "¹"]


@pytest.mark.parametrize("task_id", NON_CANONICAL_IDS, ids=ascii)
def test_reset_refuses_a_task_id_that_is_not_an_id(env, task_id):
    """A task id is one of ``task_ids`` exactly; anything else is a ``ValueError`` / ``KeyError`` (bad reset input)."""
    u = env.unwrapped
    if task_id in u.task_ids:
        pytest.skip("an id of this split")
    with pytest.raises((ValueError, KeyError)):
        env.reset(seed=0, options={"task_id": task_id})


def test_reset_and_plain_text_step(env):
    with pytest.raises(RuntimeError):
        env.unwrapped.step(PLAIN_TEXT)  # before reset
    obs, info = env.reset(seed=0, options={"index": env.unwrapped.usable_task_indices(1)[0]})
    assert ChatMessages().contains(obs) and obs and obs == info["messages"]
    assert obs[0]["role"] in ("system", "user")
    _check_info(env, info)
    obs, reward, terminated, truncated, info = env.step(PLAIN_TEXT)
    assert ChatMessages().contains(obs)
    _check_info(env, info)
    assert {"role": "assistant", "content": PLAIN_TEXT} in info["messages"]
    if terminated or truncated:
        assert 0.0 <= reward <= 1.0 and "termination_reason" in info
    else:
        assert reward == 0.0 and "termination_reason" not in info


def test_malformed_tool_call_text_sets_action_error(env):
    env.reset(seed=0, options={"index": env.unwrapped.usable_task_indices(1)[0]})
    obs, _, _, _, info = env.step(MALFORMED_CALL)
    assert isinstance(info.get("action_error"), str) and info["action_error"]
    if info["tools"]:  # a tool-using env answers the call with a tool error message
        assert any(m["role"] == "tool" and m["content"].startswith("Error") for m in obs)
        assert info.get("num_errors", 1) >= 1


@pytest.mark.parametrize("action", NON_TEXT, ids=repr)
def test_non_text_action_is_a_type_error(env, action):
    _, info = env.reset(seed=0, options={"index": env.unwrapped.usable_task_indices(1)[0]})
    before = info["messages"]
    with pytest.raises(TypeError):
        env.step(action)
    # a caller's bug consumes nothing: the episode goes on from where it was
    *_, info = env.step(PLAIN_TEXT)
    n = len(before)
    assert info["messages"][:n] == before
    assert info["messages"][n] == {"role": "assistant", "content": PLAIN_TEXT}


def test_episode_end_and_step_after_end(env):
    u = env.unwrapped
    env.reset(seed=0, options={"index": u.usable_task_indices(1)[0]})
    first = u.do_nothing_action if u.do_nothing_action is not None else PLAIN_TEXT
    reward, info = _play_to_end(env, first)
    assert 0.0 <= reward <= 1.0
    assert isinstance(info["termination_reason"], str) and info["termination_reason"]
    with pytest.raises(RuntimeError, match="episode has ended; call reset()"):
        env.step(PLAIN_TEXT)
    env.reset(seed=0, options={"index": u.usable_task_indices(1)[0]})  # and a reset starts over
    env.step(PLAIN_TEXT)


@pytest.mark.parametrize("entry_point", sorted({gym.registry[i].entry_point for i in REGISTERED}))
def test_class_docstring_examples_run(entry_point, request, monkeypatch):
    """The env class docstring is the spec: its ``## Example`` must run as written (doctest)."""
    import doctest
    import importlib

    if "gsm8k" in entry_point:
        monkeypatch.setenv("GSM8K_DATA_DIR", str(request.getfixturevalue("gsm8k_dir")))
    module, name = entry_point.split(":")
    cls = getattr(importlib.import_module(module), name)
    for section in ("## Description", "## Action Space", "## Observation Space", "## Rewards",
                    "## Starting State", "## Episode End", "## Arguments", "## Example"):
        assert section in cls.__doc__, f"{name} docstring lacks {section}"
    runner = doctest.DocTestRunner()
    tests = [t for t in doctest.DocTestFinder().find(cls, name) if t.examples and t.name == name]
    assert tests, f"{name} docstring has no example"
    for t in tests:
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0
