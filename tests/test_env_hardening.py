"""Issue 25, section A: nothing a model emits can hang, crash or exhaust an env.

One test per defect found (each failed on the code before its fix), then a property test over every Gymnasium id
the ``envs`` package registers (a new id is covered without editing this file): random and adversarial actions
never raise except the contract's ``TypeError``, every step returns within :data:`STEP_BOUND_S`, and a malformed call
never changes a tau2 database.

Bounds under test (documented where they are enforced):

- tau2 ``calculate``: no ``**``, at most :data:`envs.tau2.domain.MAX_CALCULATE_CHARS` characters
  (:mod:`envs.tau2.domain`);
- JSON in a tool call: nested at most :data:`envs.action_text.MAX_JSON_DEPTH` levels, checked before ``json.loads``
  (:mod:`envs.action_text`);
- GSM8K numbers: at most :data:`envs.gsm8k.grading.MAX_DIGITS` digits and ``|exponent| <=``
  :data:`envs.gsm8k.grading.MAX_EXPONENT`, checked before conversion (:mod:`envs.gsm8k.grading`);
- lone surrogates in action text become U+FFFD on entry (:func:`envs.action_text.clean_text`).
"""
from __future__ import annotations

import json
import time

import gymnasium as gym
import pytest

import envs

gym.register_envs(envs)

#: Upper bound on one ``step`` (seconds), whatever the action: generous for a loaded 2-core machine. The bounded
#: work is microseconds to milliseconds; the defects this file guards against took 6 s to 40 min.
STEP_BOUND_S = 2.0

#: ``<tool_call>`` text calling ``name`` with ``arguments`` (a dict, dumped as JSON).
def _hermes(name: str, arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _timed_step(env, action):
    t0 = time.perf_counter()
    out = env.step(action)
    dt = time.perf_counter() - t0
    assert dt < STEP_BOUND_S, f"step took {dt:.2f} s (bound {STEP_BOUND_S} s) on {action!r:.120}"
    return out


def _encodable(obj) -> None:
    """What a server would send back: must encode as UTF-8 JSON (a lone surrogate cannot)."""
    json.dumps(obj, ensure_ascii=False, default=str).encode("utf-8")


_TAU2_ENVS: dict = {}


def _tau2(domain: str):
    """One env per tau2 domain for the whole module (construction loads the databases)."""
    if domain not in _TAU2_ENVS:
        kwargs = {"split": "test", "user": "scripted"} if domain in ("airline", "retail") else {}
        _TAU2_ENVS[domain] = gym.make(f"tau2/{domain}-v0", max_steps=1000, **kwargs)
    env = _TAU2_ENVS[domain]
    env.reset(seed=0, options={"index": env.unwrapped.usable_task_indices(1)[0]})
    return env


def _db_hashes(env):
    live = env.unwrapped.tau2_environment
    return live.get_db_hash(), live.get_user_db_hash()


# ---------------------------------------------------------------------------------------------------------------
# Defect 1: tau2 `calculate` evaluated `**` towers (`9**9**8` held the GIL 80 s)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_calculate_refuses_exponentiation_with_an_error_the_agent_sees(domain):
    env = _tau2(domain)
    before = _db_hashes(env)
    obs, reward, terminated, truncated, info = _timed_step(env, _hermes("calculate", {"expression": "2**10"}))
    assert obs[0]["role"] == "tool" and obs[0]["content"].startswith("Error") and "**" in obs[0]["content"], obs
    assert "**" in info["action_error"] and info["num_errors"] == 1
    # the tower itself: refused before anything is evaluated
    obs, *_ = _timed_step(env, _hermes("calculate", {"expression": "9**9**8"}))
    assert obs[0]["content"].startswith("Error") and "**" in obs[0]["content"]
    obs, *_ = _timed_step(env, "calculate(expression='9 ** 9 ** 9')")
    assert obs[0]["content"].startswith("Error") and "**" in obs[0]["content"]
    # ordinary arithmetic is still tau2's answer
    obs, *_, info = _timed_step(env, _hermes("calculate", {"expression": "(299.99 + 45.5) * 2 / 4"}))
    assert obs[0]["content"] == "172.75" and "action_error" not in info
    assert _db_hashes(env) == before


def test_calculate_bounds_the_expression_length():
    """Without ``**``, cost grows with length (a product of 250 literals of 4,000 digits is ~10^6 digits): bounded."""
    from envs.tau2.domain import MAX_CALCULATE_CHARS

    env = _tau2("retail")
    long_product = "*".join(["9" * 4000] * 250)
    obs, *_, info = _timed_step(env, _hermes("calculate", {"expression": long_product}))
    assert obs[0]["content"].startswith("Error") and str(MAX_CALCULATE_CHARS) in obs[0]["content"]
    ok = "+".join(["1"] * (MAX_CALCULATE_CHARS // 2))  # at the bound: still evaluated by tau2
    obs, *_ = _timed_step(env, _hermes("calculate", {"expression": ok}))
    assert obs[0]["content"] == f"{float(MAX_CALCULATE_CHARS // 2)}"


# ---------------------------------------------------------------------------------------------------------------
# Defect 2: GSM8K grading converted any number (`#### 1e-30000000` ran > 6 min, `#### 1e5000` raised)
# ---------------------------------------------------------------------------------------------------------------
ABSURD_ANSWERS = [
    "#### 1e5000",  # raised ValueError (int -> str over 4,300 digits)
    "#### " + "9" * 5000,
    "The answer is \\boxed{1e400}",
    "#### 3/" + "7" * 5000,
    "#### 1e10000000",  # 6.1 s, then raised
    "#### 1e30000000",  # 32.8 s, then raised
    "#### 1e-30000000",  # > 6 min
]


@pytest.mark.parametrize("text", ABSURD_ANSWERS, ids=lambda t: t[:24])
def test_gsm8k_absurd_number_scores_zero_with_a_reason_in_microseconds(text, gsm8k_dir):
    from envs.gsm8k.grading import gsm8k_reward

    t0 = time.perf_counter()
    reward, grade = gsm8k_reward(text, "72")
    assert time.perf_counter() - t0 < 0.1  # microseconds in fact; generous for a loaded machine
    assert reward == 0.0 and grade["extracted"] is None and not grade["correct"]

    env = gym.make("GSM8K-v0", split="test", data_dir=str(gsm8k_dir))
    env.reset(seed=0, options={"index": 0})
    _, reward, terminated, _, info = _timed_step(env, text)
    assert reward == 0.0 and terminated
    assert "out of range" in info["action_error"], info["action_error"]


def test_gsm8k_numbers_at_the_bound_still_grade():
    from envs.gsm8k.grading import MAX_DIGITS, MAX_EXPONENT, gsm8k_reward, is_correct, normalize_number

    assert gsm8k_reward("#### 7.2e1", "72")[0] == 1.0
    big = "9" * MAX_DIGITS
    assert gsm8k_reward(f"#### {big}", big)[0] == 1.0
    assert normalize_number(f"1e{MAX_EXPONENT}") == "1" + "0" * MAX_EXPONENT
    assert normalize_number(f"1e{MAX_EXPONENT + 1}") is None and normalize_number("9" * (MAX_DIGITS + 1)) is None
    assert normalize_number(10 ** 5000) is None  # an int too: no 4,300-digit ValueError
    assert not is_correct(10 ** 5000, "72")


# ---------------------------------------------------------------------------------------------------------------
# Defect 3: deep JSON in a tool call raised RecursionError (~995 levels, ~1 KB)
# ---------------------------------------------------------------------------------------------------------------
DEEP = "[" * 5000 + "]" * 5000
DEEP_ACTIONS = {
    "hermes_args": '<tool_call>{"name": "calculate", "arguments": {"x": ' + DEEP + "}}</tool_call>",
    "hermes_whole": "<tool_call>" + DEEP + "</tool_call>",
    "bare_json": '{"name": "calculate", "arguments": {"x": ' + DEEP + "}}",
    "bare_json_list": "[" * 5000 + '{"name": "calculate"}' + "]" * 5000,
    "dict_string_args": {"tool_calls": [{"function": {"name": "calculate", "arguments": '{"x": ' + DEEP + "}"}}]},
    "double_encoded": {"tool_calls": [{"function": {"name": "calculate", "arguments": json.dumps(DEEP)}}]},
}


def _nested_dict(depth: int) -> dict:
    d: dict = {}
    for _ in range(depth):
        d = {"a": d}
    return d


@pytest.mark.parametrize("kind", [*DEEP_ACTIONS, "dict_python_args"])
def test_deep_json_tool_call_is_the_models_error(kind):
    env = _tau2("retail")
    action = DEEP_ACTIONS.get(kind) or {"tool_calls": [{"function": {"name": "calculate",
                                                                       "arguments": _nested_dict(5000)}}]}
    before = _db_hashes(env)
    obs, reward, terminated, truncated, info = _timed_step(env, action)
    assert isinstance(info.get("action_error"), str) and info["action_error"]
    assert _db_hashes(env) == before
    assert obs and obs[0]["role"] == "tool" and obs[0]["content"].startswith("Error"), obs
    assert "nested deeper than" in obs[0]["content"]
    _encodable(info)


def test_parse_action_bounds_depth_before_json_loads():
    from envs.action_text import MAX_JSON_DEPTH
    from envs.tau2.actions import parse_action

    ok = {"x": [[[1]]]}
    for depth, fine in ((MAX_JSON_DEPTH - 2, True), (MAX_JSON_DEPTH + 1, False)):
        args = "[" * depth + "]" * depth  # inside {"name", "arguments": {"x": ...}}: depth + 2 levels
        parsed = parse_action('<tool_call>{"name": "t", "arguments": {"x": ' + args + "}}</tool_call>")
        assert parsed.tool_calls[0].ok is fine, parsed.tool_calls[0].error
    parsed = parse_action(_hermes("t", ok))
    assert parsed.tool_calls[0].arguments == ok


# ---------------------------------------------------------------------------------------------------------------
# Defect 4: a lone surrogate in the action made every reply unencodable (HTTP 500 until reset)
# ---------------------------------------------------------------------------------------------------------------
SURROGATE_ACTIONS = [
    "hello \ud800 there",
    "\udfff",
    "<tool_call>" + json.dumps({"name": "calculate", "arguments": {"expression": "1+1\ud800"}}) + "</tool_call>",
    '<tool_call>{"name": "calculate", "arguments": {"expression": "1+1\\ud800"}}</tool_call>',  # JSON escape
    {"role": "assistant", "content": "a\ud800b"},
    {"tool_calls": [{"id": "c\udc00", "function": {"name": "calculate\ud800", "arguments": {"e\ud801": "x\ud802"}}}]},
    "calculate(expression='1+\\ud800')",
]


@pytest.mark.parametrize("action", SURROGATE_ACTIONS, ids=lambda a: ascii(a)[:40])
def test_lone_surrogates_are_replaced_on_entry_tau2(action):
    env = _tau2("retail")
    obs, reward, terminated, truncated, info = _timed_step(env, action)
    _encodable(obs)
    _encodable(info)
    _encodable([m.model_dump(mode="json") for m in env.unwrapped.trajectory])


def test_lone_surrogates_are_replaced_on_entry_gsm8k(gsm8k_dir):
    env = gym.make("GSM8K-v0", split="test", data_dir=str(gsm8k_dir))
    _, info0 = env.reset(seed=0, options={"index": 0})
    _, reward, _, _, info = _timed_step(env, f"\ud800 so #### {info0['answer']} \udfff")
    assert reward == 1.0
    _encodable(info)
    assert info["messages"][-1]["content"] == f"\ufffd so #### {info0['answer']} \ufffd"


def test_clean_text_keeps_valid_text_and_pairs():
    from envs.action_text import clean_text

    assert clean_text("plain ascii") == "plain ascii"
    assert clean_text("caf\u00e9 \U0001F600") == "caf\u00e9 \U0001F600"
    assert clean_text("\ud83d\ude00") == "\U0001F600"  # a surrogate *pair* written as two code points is one char
    assert clean_text("a\ud800b\udc00") == "a\ufffdb\ufffd"
    assert clean_text("\ude00\ud83d") == "\ufffd\ufffd"  # reversed: both lone
