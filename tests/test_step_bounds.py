"""What one step may cost and append is bounded, whatever the model writes (issue 34, item 3, env side).

Bounds under test (documented where they are enforced):

- tau2: at most ``max_tool_calls_per_action`` (default :data:`envs.tau2.env.MAX_TOOL_CALLS_PER_ACTION`, 16) tool calls
  per action; beyond it no call runs, the database is unchanged and the agent reads one tool error (the contract's
  ``info["action_error"]``). Before: a 1 MiB action of 7,300 airline calls took 3.9 s and grew the conversation to
  24.1 MB; ``<tool_call></tool_call>`` 45,588 times gave 18.8 MB.
- tau2: a tool answer shown to the agent is at most ``max_tool_result_chars`` (default
  :data:`envs.tau2.env.MAX_TOOL_RESULT_CHARS`) characters plus a one-line note, so one step appends at most the
  action, ``16 x (max_tool_result_chars + note)`` characters of tool answers and the customer's reply.
- IFEval: a response over ``max_response_chars`` (default :data:`envs.ifeval.env.MAX_RESPONSE_CHARS`) is not graded
  (reward 0, ``action_error``): if-verifiable's checkers are not all linear (``format:no_bullets_bullets`` took
  5.8 s at 100 KB over the server, ~60 s at 1 MiB).

The server's session byte cap (``envs/serve.py``) is tested with the server.
"""
from __future__ import annotations

import json
import logging
import time

import gymnasium as gym
import pytest

import envs
from envs.contract import STEP_TIME_BOUND_S

gym.register_envs(envs)

_ENVS: dict = {}


def _size(obj) -> int:
    """UTF-8 JSON bytes, as a server would send ``obj``."""
    return len(json.dumps(obj, ensure_ascii=False, default=str).encode("utf-8"))


def _hermes(name: str, arguments: dict) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _airline(**kwargs):
    """A fresh episode of airline test task 0 (the env is built once per kwargs: loading the databases is slow)."""
    key = tuple(sorted(kwargs.items()))
    if key not in _ENVS:
        _ENVS[key] = gym.make("tau2/airline-v0", split="test", user="scripted", **kwargs)
    env = _ENVS[key]
    env.reset(seed=0, options={"index": 0})
    return env


def _db_state(env):
    from tests.test_env_hardening import _db_hashes

    return _db_hashes(env)


def _a_user_and_reservation(env) -> tuple[str, str]:
    db = env.unwrapped.tau2_environment.tools.db
    user_id = next(iter(db.users))
    return user_id, next(iter(db.reservations))


def _timed_step(env, action):
    t0 = time.perf_counter()
    out = env.step(action)
    dt = time.perf_counter() - t0
    assert dt < STEP_TIME_BOUND_S, f"step took {dt:.2f} s (bound {STEP_TIME_BOUND_S} s)"
    return out


# ---------------------------------------------------------------------------------------------------------------
# tau2: tool calls per action
# ---------------------------------------------------------------------------------------------------------------
def _many_calls(form: str, n: int, reservation_id: str):
    call = {"name": "cancel_reservation", "arguments": {"reservation_id": reservation_id}}
    if form == "hermes":
        return "Cancelling.\n" + "\n".join(_hermes(call["name"], call["arguments"]) for _ in range(n))
    if form == "json_list":
        return json.dumps([call] * n)
    if form == "functional":
        return "\n".join(f"cancel_reservation(reservation_id='{reservation_id}')" for _ in range(n))
    return {"role": "assistant", "content": "Cancelling.",
            "tool_calls": [{"id": f"c{i}", "type": "function", "function": call} for i in range(n)]}


@pytest.mark.parametrize("form", ["hermes", "json_list", "functional", "dict"])
def test_tau2_more_tool_calls_than_the_bound_run_none(form):
    env = _airline()
    bound = env.unwrapped.max_tool_calls_per_action
    assert bound == envs.tau2.env.MAX_TOOL_CALLS_PER_ACTION == 16
    _, reservation = _a_user_and_reservation(env)
    before = _db_state(env)
    obs, reward, terminated, truncated, info = _timed_step(env, _many_calls(form, bound + 1, reservation))
    assert [m["role"] for m in obs] == ["tool"], obs
    assert obs[0]["content"].startswith("Error:") and f"{bound + 1} tool calls" in obs[0]["content"]
    assert f"{bound + 1} tool calls" in info["action_error"] and info["num_errors"] == 1
    assert not terminated and not truncated and reward == 0.0
    assert _db_state(env) == before  # no cancellation ran
    last = info["messages"][-2]  # the assistant message, then its one tool answer
    assert last["role"] == "assistant" and len(last["tool_calls"]) == 1
    assert last["tool_calls"][0]["id"] == obs[0]["tool_call_id"]


def test_tau2_exactly_the_bound_runs_every_call():
    env = _airline(max_tool_calls_per_action=3)
    user, _ = _a_user_and_reservation(env)
    action = "".join(_hermes("get_user_details", {"user_id": user}) for _ in range(3))
    obs, *_, info = _timed_step(env, action)
    assert [m["role"] for m in obs] == ["tool"] * 3
    assert all(user in m["content"] and not m["content"].startswith("Error") for m in obs)
    assert "action_error" not in info
    obs, *_, info = _timed_step(env, action + _hermes("get_user_details", {"user_id": user}))
    assert len(obs) == 1 and "4 tool calls" in obs[0]["content"] and "at most 3" in info["action_error"]


def test_tau2_a_done_call_beyond_the_bound_does_not_end_the_episode():
    env = _airline(max_tool_calls_per_action=2)
    action = "".join(_hermes("calculate", {"expression": "1+1"}) for _ in range(2)) + _hermes("done", {})
    obs, reward, terminated, truncated, info = _timed_step(env, action)
    assert not terminated and len(obs) == 1 and obs[0]["content"].startswith("Error:")


@pytest.mark.parametrize("case", ["empty_blocks", "airline_calls"])
def test_tau2_the_issue_cases_append_little(case):
    """The issue's measurements: ``<tool_call></tool_call>`` x 45,588 (18.8 MB before) and a 1 MiB action of 7,300
    airline calls (3.9 s, conversation 24.1 MB before)."""
    env = _airline()
    user, _ = _a_user_and_reservation(env)
    if case == "empty_blocks":
        action = "<tool_call></tool_call>" * 45_588
    else:
        one = _hermes("get_user_details", {"user_id": user})
        action = one * ((1 << 20) // len(one))
    before = _size(env.unwrapped._messages)
    obs, *_, info = _timed_step(env, action)
    grown = _size(info["messages"]) - before
    assert len(obs) == 1 and obs[0]["content"].startswith("Error:")
    assert grown < 4096, f"one refused action grew the conversation by {grown} bytes"
    assert _size(obs) + _size(info) < 64 * 1024


# ---------------------------------------------------------------------------------------------------------------
# tau2: the size of one tool answer, and of one step's append
# ---------------------------------------------------------------------------------------------------------------
def test_tau2_tool_answers_are_cut_to_the_bound():
    env = _airline(max_tool_result_chars=100)
    user, _ = _a_user_and_reservation(env)
    obs, *_ = _timed_step(env, _hermes("get_user_details", {"user_id": user}))
    content = obs[0]["content"]
    assert content.startswith("{") or user in content
    assert len(content) <= 100 + 60 and content.endswith("more characters not shown]"), content
    # the trajectory tau2 grades keeps the whole answer
    assert len(env.unwrapped.trajectory[-1].content) > 100


def test_tau2_one_step_appends_at_most_the_documented_bound():
    """16 calls each echoing a 60,000-character argument in its error (1 MiB of action): the tool answers are cut,
    so the step appends at most the action plus 16 x (max_tool_result_chars + note)."""
    env = _airline(max_tool_result_chars=1000)
    arg = "x" * 60_000
    action = "".join(_hermes("get_user_details", {"user_id": arg + str(i)}) for i in range(16))
    before = _size(env.unwrapped._messages)
    obs, *_, info = _timed_step(env, action)
    assert len(obs) == 16 and all(len(m["content"]) <= 1000 + 60 for m in obs)
    assert len(info.get("action_error", "")) <= 16 * (1000 + 60 + 2)  # tau2's own errors set none
    grown = _size(info["messages"]) - before
    assert grown <= len(action) + 16 * (1000 + 200), grown


@pytest.mark.parametrize("kwargs", [{"max_tool_calls_per_action": 0}, {"max_tool_result_chars": 0},
                                    {"max_tool_calls_per_action": True}])
def test_tau2_bad_bounds_are_refused(kwargs):
    with pytest.raises(ValueError):
        gym.make("tau2/mock-v0", **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# IFEval: response length
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ifeval_env():
    pytest.importorskip("if_verifiable")
    logging.getLogger("envs.ifeval.env").setLevel(logging.ERROR)
    return gym.make("IFEval-v0", split="all")


def test_ifeval_a_response_over_the_bound_is_not_graded(ifeval_env):
    from envs.ifeval.env import MAX_RESPONSE_CHARS

    env = ifeval_env.unwrapped
    assert env.max_response_chars == MAX_RESPONSE_CHARS == 4096
    for text in ("a\n" * (1 << 19), "word " * 1000):  # 1 MiB of one-word lines (60 s before), 5,000 characters
        env.reset(options={"index": env.usable_task_indices()[0]})
        t0 = time.perf_counter()
        obs, reward, terminated, truncated, info = env.step(text)
        assert time.perf_counter() - t0 < 0.5
        assert reward == 0.0 and terminated and info["strict"] == info["loose"] == 0.0
        assert f"{len(text)} characters" in info["action_error"] and "4096" in info["action_error"]
        assert [i["strict"] for i in info["instructions"]] == [False] * len(info["instruction_id_list"])


def test_ifeval_a_response_at_the_bound_is_graded():
    pytest.importorskip("if_verifiable")
    env = gym.make("IFEval-v0", split="all", max_response_chars=64).unwrapped
    i = next(k for k in env.usable_task_indices()
             if env._prompts[k]["instruction_id_list"] == ["count:keywords_multiple"])
    env.reset(options={"index": i})
    *_, info = env.step("x" * 64)
    assert "action_error" not in info
    env.reset(options={"index": i})
    *_, info = env.step("x" * 65)
    assert "65 characters" in info["action_error"]


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_ifeval_bad_bound_is_refused(bad):
    pytest.importorskip("if_verifiable")
    with pytest.raises(ValueError):
        gym.make("IFEval-v0", split="all", max_response_chars=bad)


#: The slowest if-verifiable checkers found (every IFEval and IFBench checker on runs of 40 characters and
#: 17 short units at 4,000-32,000 characters), with their worst shape.
SLOW_CHECKERS = [
    ("detectable_content:number_placeholders", {"num_placeholders": 4}, "["),
    ("detectable_format:number_bullet_lists", {"num_bullets": 5}, "\n"),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "\t"),
    ("detectable_format:title", {}, "<<"),
    ("format:newline", {}, "a\n\n"),
    ("format:no_bullets_bullets", {}, "a\n"),
]
#: Bound on grading one instruction's worst shape at the default ``max_response_chars`` (seconds, loaded machine;
#: measured ~0.1-0.9 s here with 8 engineers sharing 2 cores).
IFEVAL_INSTRUCTION_BOUND_S = 4.0


@pytest.mark.parametrize("iid,kwargs,unit", SLOW_CHECKERS, ids=[c[0] for c in SLOW_CHECKERS])
def test_ifeval_slowest_checkers_at_the_bound(iid, kwargs, unit):
    pytest.importorskip("if_verifiable")
    from envs.ifeval.env import MAX_RESPONSE_CHARS
    from envs.ifeval.grading import score_response

    score_response("Warm up.", [iid], [kwargs], "Write.")  # imports, registry
    text = ("a " + unit * MAX_RESPONSE_CHARS)[:MAX_RESPONSE_CHARS]
    t0 = time.perf_counter()
    score_response(text, [iid], [kwargs], "Write.")
    dt = time.perf_counter() - t0
    assert dt < IFEVAL_INSTRUCTION_BOUND_S, f"{iid} took {dt:.2f} s on {len(text)} characters"


# ---------------------------------------------------------------------------------------------------------------
# rendering what a step appended (envs.chat_template): the trainer renders every env message with the chat template
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arguments", ["[" * 100_000, "[" * 5_000 + "]" * 5_000, "1" * 5_000,
                                       '{"a": ' * 50_000, "\"\\ud800\""])
def test_template_messages_never_raise_on_recorded_arguments(arguments):
    """A malformed call is recorded as written (``arguments`` = the model's text); ``template_messages`` decoded it
    with ``json.loads``, which raises ``RecursionError`` on deep nesting and ``ValueError`` on a 5,000-digit integer:
    the trainer's renderer crashed on the env's own conversation."""
    from envs.chat_template import template_messages

    msg = {"role": "assistant", "content": None,
           "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "f", "arguments": arguments}}]}
    t0 = time.perf_counter()
    out = template_messages([msg])
    assert time.perf_counter() - t0 < 0.5
    args = out[0]["tool_calls"][0]["function"]["arguments"]
    assert args == arguments or isinstance(args, dict)
    json.dumps(out, ensure_ascii=False).encode("utf-8")


def test_a_too_deep_tool_call_recorded_by_tau2_renders():
    from envs.chat_template import template_messages

    env = _airline()
    deep = '<tool_call>{"name": "get_user_details", "arguments": ' + "[" * 5_000 + "]" * 5_000 + "}</tool_call>"
    obs, *_, info = _timed_step(env, deep)
    assert obs[0]["content"].startswith("Error:")
    template_messages(info["messages"])  # raised RecursionError before


#: Units run to the response bound for :func:`test_every_ifeval_checker_at_the_response_bound`: single characters
#: (spaces, newlines, tabs, brackets, braces, markdown, punctuation, letters, digits) and short units (words,
#: sentences, bullet lines, titles, postscripts).
CHECKER_UNITS = [" ", "\n", "\t", "*", "-", "#", "<", ">", "[", "{", "}", "^", "`", "0", "a", "A", ".", ",", '"',
                 "a ", "a.", "a. ", "* a\n", "a\n", "a\n\n", "<<", "# a\n", "- a\n", "a, ", "Aa ", "P.S.", "a b c. "]


@pytest.mark.slow
def test_every_ifeval_checker_at_the_response_bound():
    """Every IFEval and IFBench checker that runs here, on every unit run to ``MAX_RESPONSE_CHARS`` (a library
    upgrade that adds a slow checker fails here): one ``check_following`` call must take less than
    ``IFEVAL_INSTRUCTION_BOUND_S / 9`` (a step runs it up to 9 times per instruction)."""
    pytest.importorskip("if_verifiable")
    import random

    from envs.ifeval.env import MAX_RESPONSE_CHARS
    from envs.ifeval.grading import _registry, instruction_available

    logging.disable(logging.CRITICAL)  # langdetect logs every text it cannot classify
    try:
        slow = []
        for registry in ("ifeval", "ifbench"):
            for iid, cls in _registry(registry).items():
                if not instruction_available(iid):
                    continue
                random.seed(0)
                checker = cls(iid)
                try:
                    checker.build_description()
                except ValueError:  # combination:repeat_prompt needs its prompt
                    checker.build_description(prompt_to_repeat="Write a poem about cats.")
                args = checker.get_instruction_args()
                if args and "prompt" in args:
                    checker.build_description(prompt="Write a poem about cats.")
                for unit in CHECKER_UNITS:
                    text = ("a " + unit * MAX_RESPONSE_CHARS)[:MAX_RESPONSE_CHARS]
                    t0 = time.perf_counter()
                    try:
                        checker.check_following(text)
                    except Exception:  # noqa: BLE001 - a checker may reject a shape; only its time matters here
                        pass
                    dt = time.perf_counter() - t0
                    if dt > IFEVAL_INSTRUCTION_BOUND_S / 9:
                        slow.append((iid, repr(unit), round(dt, 3)))
    finally:
        logging.disable(logging.NOTSET)
    assert not slow, slow
