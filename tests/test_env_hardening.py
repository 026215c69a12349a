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
from envs.contract import STEP_TIME_BOUND_S, check_action
from envs.tau2.cow import db_hash
from tests.test_env_contract import CHEAP_KWARGS, REGISTERED

gym.register_envs(envs)

#: Upper bound on one ``step`` (seconds), whatever the action (the contract's): generous for a loaded 2-core machine.
#: The bounded work is microseconds to milliseconds; the defects this file guards against took 2 s to 40 min.
STEP_BOUND_S = STEP_TIME_BOUND_S

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


_ENVS: dict = {}


def _env(env_id: str, gsm8k_dir=None):
    """One env per id for the whole module (tau2 construction loads the databases: ~20 s for airline on a loaded
    machine), built with the contract test's cheapest arguments."""
    if env_id not in _ENVS:
        kwargs = dict(CHEAP_KWARGS.get(env_id, {}))
        if env_id.startswith("GSM8K"):
            kwargs["data_dir"] = str(gsm8k_dir)
        if env_id.startswith("tau2/"):
            kwargs["max_steps"] = 1000
        _ENVS[env_id] = gym.make(env_id, **kwargs)
    return _ENVS[env_id]


def _tau2(domain: str):
    """The module's tau2 env of ``domain``, reset on its first usable task."""
    env = _env(f"tau2/{domain}-v0")
    env.reset(seed=0, options={"index": env.unwrapped.usable_task_indices(1)[0]})
    return env


class _DBState:
    """The agent and user databases of a tau2 env, comparable by ``==`` with tau2's hash semantics.

    A full ``get_db_hash`` costs ~0.5 s on airline (it serialises the whole database); the env's databases are
    copy-on-write copies, so the touched records (:meth:`envs.tau2.cow.DBSnapshot.delta`, compared with
    :meth:`~envs.tau2.cow.DBSnapshot.same`, the machinery of the reward's DB check) say the same in milliseconds.
    A database that is not a copy falls back to tau2's hash.
    """

    def __init__(self, env):
        u = env.unwrapped
        live, dom = u.tau2_environment, u.domain
        user_db = live.user_tools.db if live.user_tools is not None else None
        self.parts = []
        for snap, db in ((dom.agent_snapshot, live.tools.db), (dom.user_snapshot, user_db)):
            if snap is not None and snap.is_copy(db):
                self.parts.append((snap, snap.delta(db)))
            else:
                self.parts.append((None, db_hash(db) if db is not None else None))

    def __eq__(self, other) -> bool:
        return all((sa is None and sb is None and a == b) or (sa is sb and sa is not None and sa.same(a, b))
                   for (sa, a), (sb, b) in zip(self.parts, other.parts))


def _db_hashes(env) -> _DBState:
    return _DBState(env)


# ---------------------------------------------------------------------------------------------------------------
# Defect 1: tau2 `calculate` evaluated `**` towers (`9**9**8` held the GIL 80 s)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_calculate_refuses_exponentiation_with_an_error_the_agent_sees(domain):
    env = _tau2(domain)
    before = _db_hashes(env)
    live = env.unwrapped.tau2_environment
    full_before = live.get_db_hash(), live.get_user_db_hash()
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
    assert (live.get_db_hash(), live.get_user_db_hash()) == full_before  # tau2's own hash agrees


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

    env = _env("GSM8K-v1", gsm8k_dir)
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


def test_gsm8k_grades_a_1mb_response_on_its_tail():
    """Found by the property test: a 1 MB response ('1e9 ' x 250,000) took 3.4 s to grade (regex scans of the whole
    text); it is graded on its last MAX_GRADED_CHARS characters."""
    from envs.gsm8k.grading import MAX_GRADED_CHARS, gsm8k_reward

    for text, want in (("1e9 " * 250_000 + "#### 8", 1.0), ("x" * 1_000_000, 0.0), ("#### 8 " + "y" * MAX_GRADED_CHARS, 0.0)):
        t0 = time.perf_counter()
        reward, _ = gsm8k_reward(text, "8")
        assert time.perf_counter() - t0 < STEP_BOUND_S / 4 and reward == want


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


@pytest.mark.parametrize("action", [
    _hermes("get_user_details", {"user_id": "x"}).replace('"x"', "1" * 5000),
    '{"name": "get_user_details", "arguments": {"user_id": ' + "1" * 5000 + "}}",
    {"tool_calls": [{"function": {"name": "get_user_details", "arguments": '{"user_id": ' + "1" * 5000 + "}"}}]},
    {"tool_calls": [{"function": {"name": "get_user_details", "arguments": {"user_id": 10 ** 5000}}}]},
], ids=["hermes", "bare_json", "dict_string_args", "dict_python_int"])
def test_json_integer_beyond_pythons_digit_limit_is_the_models_error(action):
    """Found by the property test below: ``json.loads`` raises ``ValueError`` (not ``JSONDecodeError``) on an integer
    of more than 4,300 digits, and ``json.dumps`` raises on such an int in a dict action."""
    env = _tau2("retail")
    before = _db_hashes(env)
    obs, *_, info = _timed_step(env, action)
    assert obs[0]["role"] == "tool" and obs[0]["content"].startswith("Error") and info["action_error"]
    assert _db_hashes(env) == before
    _encodable(info)


def test_scripted_customer_reads_a_1mb_message_in_bounded_time():
    """Found by the property test: the scripted customer's phrase regexes took 1.2 s on a 1 MB message (2.1 s per
    step on a loaded machine); it reads the last READ_CHARS characters."""
    from envs.tau2.users import READ_CHARS

    env = _tau2("mock")
    for text, closing in (("1" * 1_000_000, False), ("z" * 1_000_000 + " Anything else?", True),
                          ("Anything else? " + "z" * READ_CHARS, False)):
        env.reset(seed=0, options={"index": 0})
        obs, reward, terminated, *_ = _timed_step(env, text)
        assert ("###STOP###" in obs[-1]["content"]) is closing and terminated is closing


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
    brackets_in_a_string = {"note": "[{" * 1000 + '\\"' + "]" * 5}  # not nesting: inside a JSON string
    parsed = parse_action(_hermes("t", brackets_in_a_string))
    assert parsed.tool_calls[0].arguments == brackets_in_a_string


@pytest.mark.parametrize("text,depth", [
    ("[" * 100 + '"\\' * 500_000, 100),  # unterminated strings full of escapes (a naive string regex is quadratic)
    ("[" * 100 + '"\\"' * 300_000, 100),
    ('{"a": "' + "[" * 1_000_000 + '"}', 1),  # brackets inside a string do not nest
    ("[]" * 500_000, 1),
    ("[" * 1_000_000, 1_000_000),
], ids=["unterminated_escapes", "escaped_quotes", "brackets_in_string", "flat", "deep"])
def test_json_depth_is_linear_and_ignores_strings(text, depth):
    from envs.action_text import json_depth

    t0 = time.perf_counter()
    assert json_depth(text) == depth
    assert time.perf_counter() - t0 < STEP_BOUND_S / 4


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
    env = _env("GSM8K-v1", gsm8k_dir)
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


# ---------------------------------------------------------------------------------------------------------------
# Property: every registered id, random and adversarial actions
# ---------------------------------------------------------------------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


_MB = 1_000_000
#: Actions any model could emit (plus non-str values, which must raise the contract's TypeError).
ADVERSARIAL = [
    "", "   ", "\n" * 1000,
    "9**9**8", "calculate(expression='9**9**9')", _hermes("calculate", {"expression": "9**9**9"}),
    _hermes("calculate", {"expression": "*".join(["9" * 4000] * 250)}),
    _hermes("calculate", {"expression": "(" * 999 + "1" + ")" * 999}),
    _hermes("calculate", {"expression": "-" * 999 + "1"}),
    "#### 1e-30000000", "#### 1e10000000", "\\boxed{" + "9" * 5000 + "}", "The answer is 1e" + "9" * 5000,
    *DEEP_ACTIONS.values(),
    {"tool_calls": [{"function": {"name": "calculate", "arguments": _nested_dict(5000)}}]},
    *SURROGATE_ACTIONS,
    "x" * _MB, "1" * _MB, "[" * (_MB // 2) + "]" * (_MB // 2), "{" * _MB, '"\\' * (_MB // 2),
    "<tool_call>" * (_MB // 11), "<think>" * (_MB // 7), "1e9 " * (_MB // 4), "#### " + "9," * (_MB // 2),
    "calculate(x=" + "[" * _MB + ")", "\\boxed{" * (_MB // 7),
    {"content": "y" * _MB, "tool_calls": [{"function": {"name": "z" * _MB, "arguments": "w" * _MB}}]},
    {"tool_calls": [{"function": {"name": "get_user_details", "arguments": '{"user_id": ' + "1" * 5000 + "}"}}]},
    {"tool_calls": [{"bad": 1}, None, 7, [], "s"]},
    # outside the action space: the contract's TypeError, nothing consumed
    12345, None, b"bytes", ["x"], {"role": "user", "content": "hi"}, {"content": 5}, {"tool_calls": "x"},
]

#: Pieces from which random actions are assembled (tool-call syntax, numbers, escapes, surrogates).
FRAGMENTS = ["<tool_call>", "</tool_call>", '{"name": "', '"calculate"', '"get_user_details"', '"arguments": {',
             '"expression": "', "}", "]", "[", "{", '"', "\\", "\\ud800", "\ud800", "\udfff", "**", "9", "1e9999999",
             "1e-9999999", "####", "\\boxed{", "calculate(", "expression=", ")", "<think>", "</think>", "```json\n",
             "###STOP###", ",", "/", "0", "-"]
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
                     max_leaves=10)
_texts = st.lists(st.one_of(st.text(st.characters(codec=None), max_size=30), st.sampled_from(FRAGMENTS)),
                  max_size=12).map("".join)
_calls = st.one_of(
    st.fixed_dictionaries({"function": st.fixed_dictionaries({"name": st.sampled_from(["calculate", "nope", ""]),
                                                             "arguments": st.one_of(_json, _texts)})}),
    _json,
)
RANDOM_ACTIONS = st.one_of(
    _texts,
    st.fixed_dictionaries({"content": st.one_of(st.none(), _texts)}, optional={"tool_calls": st.lists(_calls, max_size=3)}),
)

def _check_step(env, action) -> None:
    """One step of ``action`` on a fresh episode: never raises (except TypeError for a non-action), bounded time,
    an encodable reply, and no database change unless a tool call actually ran."""
    u = env.unwrapped
    env.reset(seed=0, options={"index": u.usable_task_indices(1)[0]})
    tau2 = hasattr(u, "tau2_environment")
    before = _db_hashes(env) if tau2 else None
    try:
        check_action(action)
    except TypeError:
        with pytest.raises(TypeError):
            _timed_step(env, action)
        return
    obs, reward, terminated, truncated, info = _timed_step(env, action)
    _encodable(obs)
    _encodable(info)
    assert 0.0 <= reward <= 1.0
    if tau2:
        ran = any(m["role"] == "tool" and not str(m["content"]).startswith("Error") for m in obs)
        if not ran:
            assert _db_hashes(env) == before, f"a call that did not run changed the database: {action!r:.200}"


@pytest.mark.parametrize("env_id", REGISTERED)
def test_adversarial_actions_on_every_registered_id(env_id, gsm8k_dir):
    env = _env(env_id, gsm8k_dir)
    for action in ADVERSARIAL:
        _check_step(env, action)


@pytest.mark.parametrize("env_id", REGISTERED)
@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(action=RANDOM_ACTIONS)
def test_random_actions_on_every_registered_id(env_id, gsm8k_dir, action):
    _check_step(_env(env_id, gsm8k_dir), action)
