"""ReasoningGym-v1 against hostile answers (issues 34 and 36).

A. No model text reaches ``eval`` / sympy's ``parse_expr``: the audit of the installed library's verifiers finds
   every task that evaluates text, each is guarded by a grammar or refused at ``gym.make``, and attack payloads
   score 0 with ``action_error``, run nothing and return fast.
B. Every scan of model text in envs/reasoning_gym is linear: the pathological shapes at the full 4,096-character
   window take milliseconds (issue 34: ``^`` + 260 spaces + ``x`` took 6.5 s).
C. A guard never refuses a gold answer (hexadecimal ``0x176b9e643680`` was read as the exponent ``9e643680``).
D. Tasks whose items carry no gold answer have no demonstration, and SFT says which.
"""
from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest
import reasoning_gym  # noqa: F401 (the library whose verifiers are audited must import)

import envs
from envs.contract import STEP_TIME_BOUND_S
from envs.reasoning_gym.data import DEFAULT_TEST_SIZE, valid_tasks

gym.register_envs(envs)
REPO = Path(__file__).resolve().parents[1]

#: The verifiers issue 34 found evaluating the answer by reading the library (eval / sympy parse_expr).
ISSUE_EVALUATING = {"string_insertion", "spiral_matrix", "binary_matrix", "n_queens", "countdown", "puzzle24",
                    "polynomial_multiplication", "simple_integration", "intermediate_integration"}
#: Every task the audit reports for reasoning-gym 0.1.25: the issue's nine, and two that evaluate only the
#: generator's own text (bitwise_arithmetic's problem, number_sorting's gold), which the audit cannot tell apart.
GUARDED = sorted(ISSUE_EVALUATING | {"bitwise_arithmetic", "number_sorting"})
#: Tasks whose items carry no gold answer (the verifier checks a solution instead).
NO_GOLD = ("boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour")


def _env(task, **kw):
    kw.setdefault("split", "train")
    kw.setdefault("train_size", 3)
    kw.setdefault("test_size", 1)
    return gym.make("ReasoningGym-v1", task=task, **kw)


# ---------------------------------------------------------------------------------------------------- A: audit
def test_the_audit_finds_every_verifier_that_evaluates_text_and_each_is_guarded_or_refused(monkeypatch):
    from envs.reasoning_gym import data as rg_data
    from envs.reasoning_gym.answer_formats import GRAMMARS
    from envs.reasoning_gym.verifier_audit import evaluating_calls

    flagged = {t: evaluating_calls(t) for t in rg_data.valid_tasks() if evaluating_calls(t)}
    assert ISSUE_EVALUATING <= set(flagged), sorted(ISSUE_EVALUATING - set(flagged))  # it sees what a reader saw
    assert "eval" in flagged["string_insertion"] and "eval" in flagged["bitwise_arithmetic"]  # through a helper
    assert any(c.endswith("parse_expr") for c in flagged["countdown"])
    assert "chain_sum" not in flagged and "leg_counting" not in flagged  # Decimal / int: nothing evaluated
    for task in flagged:  # each is guarded by a grammar, or gym.make refuses it
        if task not in GRAMMARS:
            with pytest.raises(ValueError, match="evaluate the answer text as code"):
                _env(task)
    assert sorted(flagged) == GUARDED  # a library upgrade that adds one fails here until it is reviewed
    # a task reported by the audit and left without a grammar is refused at make, naming what it calls
    monkeypatch.delitem(GRAMMARS, "countdown")
    with pytest.raises(ValueError, match=r"'countdown' is refused.*parse_expr"):
        _env("countdown")


def test_the_audit_follows_helpers_methods_and_references(monkeypatch):
    """An evaluator reached only through a method, a library helper or passed as a value is still found."""
    import functools

    from reasoning_gym.factory import DATASETS

    from envs.reasoning_gym import data as rg_data
    from envs.reasoning_gym.verifier_audit import evaluating_calls

    class Hidden:
        def score_answer(self, answer, entry):
            return self._parse(answer) == entry["answer"]

        def _parse(self, answer):
            return functools.reduce(lambda acc, f: f(acc), [eval], answer)  # eval as a value, not a call

    class Clean:
        def score_answer(self, answer, entry):
            return float(int(answer, 0) == int(entry["answer"]))

    monkeypatch.setitem(DATASETS, "hidden_eval_task", (Hidden, DATASETS["chain_sum"][1]))
    monkeypatch.setitem(DATASETS, "clean_task", (Clean, DATASETS["chain_sum"][1]))
    assert evaluating_calls.__wrapped__("hidden_eval_task") == ("eval",)
    assert evaluating_calls.__wrapped__("clean_task") == ()
    with pytest.raises(ValueError, match="'hidden_eval_task' is refused"):
        rg_data._resolve_one("hidden_eval_task", None, None)


# ---------------------------------------------------------------------------------------------------- A: attacks
#: Payloads that import, open files, spawn processes, allocate without bound or loop forever when evaluated.
ATTACKS = {
    "os.system": '__import__("os").system("touch MARKER")',
    "subprocess": '__import__("subprocess").run(["touch", "MARKER"])',
    "open": 'open("MARKER", "w").write("x")',
    "exec": "exec(\"open('MARKER', 'w')\")",
    "lambda": '(lambda: __import__("os").system("touch MARKER"))()',
    "nfkc dunder": '__\uff49mport__("os").system("touch MARKER")',  # fullwidth i: Python normalises it
    "subclasses": "().__class__.__base__.__subclasses__()",
    "attribute": "x.__class__",
    "sympify string": "sympify(\"__import__('os').system('touch MARKER')\")",
    "f-string": "f\"{__import__('os').system('touch MARKER')}\"",
    "allocate": "bytearray(10**13)",
    "allocate list": "[0] * 10**10",
    "loop forever": "sum(1 for _ in iter(int, 1))",
    "power tower": "9**9**9",
    "power of power": "(9**99)**99",
    "big exponent": "x**100000",
    "symbolic exponent": "x**(y*999)",
}


class _Hang(BaseException):
    """Raised by the alarm that stops a payload which runs away (so the test fails instead of hanging)."""


@pytest.mark.parametrize("task", GUARDED)
def test_attack_payloads_score_zero_run_nothing_and_return_fast(task, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a payload that ran would write MARKER here
    env = _env(task)
    _, info = env.reset(options={"index": 0})
    _, reward, *_, info = env.step(f"<answer>{info['answer']}</answer>")
    assert reward == 1.0 and "action_error" not in info  # the gold answer still scores 1.0

    def hang(*_):
        raise _Hang

    old = signal.signal(signal.SIGALRM, hang)
    try:
        for name, payload in ATTACKS.items():
            env.reset(options={"index": 0})
            signal.alarm(10)
            t0 = time.perf_counter()
            try:
                _, reward, term, _, info = env.step(f"thinking...\n<answer>{payload}</answer>")
            except _Hang:
                pytest.fail(f"{task}: payload {name!r} ran for 10 s")
            finally:
                signal.alarm(0)
            dt = time.perf_counter() - t0
            assert not (tmp_path / "MARKER").exists(), f"{task}: payload {name!r} ran"
            assert term and reward == 0.0, (task, name, reward)
            assert "action_error" in info, (task, name)
            assert dt < STEP_TIME_BOUND_S, (task, name, dt)
    finally:
        signal.signal(signal.SIGALRM, old)


def test_a_verifier_that_runs_long_is_stopped_at_its_deadline():
    """Inside the grammar, sympy's simplify still has no cost bound: this answer took over 30 s in
    intermediate_integration's verifier; its worker process is killed at its CPU bound (envs/grader_process.py:
    1 s; the wall time allows for a loaded machine) and the answer scores 0 with ``grader_timeout``."""
    env = _env("intermediate_integration")
    _, info = env.reset(options={"index": 0})
    v = env.unwrapped._problems[0]["metadata"]["variable"]
    answer = "*".join(f"({v}+{k})**3" for k in range(1, 5)) + "*" + "*".join(
        f"{f}({v})" for f in ("sin", "cos", "exp", "log", "tan", "atan")) + " + C"

    def hang(*_):
        raise _Hang

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(60)
    t0 = time.perf_counter()
    try:
        _, reward, *_, info = env.step(f"<answer>{answer}</answer>")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert time.perf_counter() - t0 < 20.0 and reward == 0.0
    assert info["action_error"].startswith("grader_timeout: ") and info["grader_timeout"] is True


def test_math_expression_grammar():
    from envs.reasoning_gym.answer_formats import math_expression

    entry = {"answer": "-3*X**3*sin(X) + C", "metadata": {"variable": "X"}}
    for ok in ["-3*X**3*sin(X) - 9*X**2*cos(X) + 18*X*sin(X) + 18*cos(X) + C", "x**(3/2)/3 + C", "sqrt(2*x + 1)",
               "exp(-x**2)", "(x + 1)**2", "93 + 45 - 7*3", "(8 - 4) * (3 + 3)", "x**-2", "2.5*x", "log(Abs(x))",
               "atan(2*x)/2 + C", "x**16"]:
        assert math_expression(ok, entry) is None, ok
    for bad in ["x.real", "sin", "sin(x, 2)", "sin(x=1)", "N(x)", "Symbol('x')", "x**y", "x**17", "x[0]", "x ^ 2",
                "x % 2", "x // 2", "x if x else 1", "lambda: 1", "'a'", "[x]", "x == 1", "x; 1", "x \u00d7 2",
                "sin(*x)", "exp", "alpha + 1", "__import__", "1 + " * 200 + "1", "x**(1/0)", "1j*x"]:
        assert math_expression(bad, entry), bad
    wide = {"answer": "alpha**2 + beta", "metadata": {"variables": ["alpha", "beta"]}}
    assert math_expression("alpha*beta", wide) is None  # the item's own variable names
    assert math_expression("x**30", {"answer": "x**30 + 1", "metadata": {}}) is None  # the gold's own exponent


@pytest.mark.parametrize("task, ok, bad", [
    ("spiral_matrix", ["1 2 3 6 9 8 7 4 5", "[1, 2, 3]", "-1 0"], ["1, 2, 3 and 4", "print(1)", "a b"]),
    ("binary_matrix", ["0 1\n1 2", "[[0, 1], [1, 2]]"], ["[[0, 1], [1, x]]", "0 1\n1 two"]),
    ("n_queens", ["_ Q _ _\n_ _ _ Q", "[['_', 'Q'], ['Q', '_']]"], ["_Q", "__import__", "_ Q x"]),
    ("string_insertion", ["ABCDAE", "['A', 'B']", "'AB'"], ["A B", "__init__", "A.B", "ab1"]),
    ("number_sorting", ["['-1.2', '3.5']", "[1, 2.5, -3]", "1, 2"], ["1 2 3", "null", "[1, x]", "sorted([2, 1])"]),
    ("bitwise_arithmetic", ["0x176b9e643680", "-0x1f", "42", " 0b1_01 ", "0o17"],
     ["0x", "1e5", "0x1g", "1__0", "_1", "int('5')", "- 5"]),
])
def test_plain_and_literal_grammars(task, ok, bad):
    from envs.reasoning_gym.answer_formats import check_format

    for a in ok:
        assert check_format(task, a, {"answer": "", "metadata": {}}) is None, (task, a)
    for a in bad:
        assert check_format(task, a, {"answer": "", "metadata": {}}), (task, a)
    assert check_format("chain_sum", "__import__('os')", {"answer": "5"}) is None  # no evaluator, no grammar


# ---------------------------------------------------------------------------------------------------- B: linear time
#: Per call (best of 3), on a loaded 2-core machine; a scan of 4,096 characters takes 0.1-3 ms here (issue 34: the
#: old exponent regexes took 6.5 s on 278 characters and grew as ~N^4, so the old code times out at 120 s).
SCAN_BOUND_MS = 250
_TIMING_SCRIPT = r"""
import json, sys, time
from envs.reasoning_gym import grading
from envs.reasoning_gym.grading import MAX_TEXT_CHARS, answer_guard, extract_answer
try:
    from envs.reasoning_gym.answer_formats import check_format
except ImportError:
    check_format = None
heads = ["^", "**", "2**", "2**(", "(", "-", "1e", "1.", "1e+", "x", "<answer>", ")", "9"]
fills = [" ", "\n", "^", "**", "9", "(", ")", "{", "-", "+", "e", ".", "<answer>", "x", "9e", "1,", ") ^"]
tails = ["x", "**x", "</answer>"]
worst = (0.0, "")
for h in heads:
    for f in fills:
        for t in tails:
            body = f * ((MAX_TEXT_CHARS - len(h) - len(t)) // len(f))
            text = (h + body + t)[:MAX_TEXT_CHARS]
            calls = [lambda: answer_guard(text, "5"), lambda: extract_answer(text, "5"),
                     lambda: extract_answer(text, "cat"), lambda: answer_guard(text, "x**2 + 1")]
            if check_format is not None:
                calls += [lambda: check_format("countdown", text, {"answer": "1 + 2", "metadata": {}}),
                          lambda: check_format("binary_matrix", text, {"answer": "0 1", "metadata": {}})]
            for c in calls:
                dt = float("inf")
                for _ in range(3):  # best of 3 if slow: the machine is shared; a super-linear scan is slow each time
                    t0 = time.perf_counter()
                    c()
                    dt = min(dt, time.perf_counter() - t0)
                    if dt < 0.02:
                        break
                if dt > worst[0]:
                    worst = (dt, repr((h, f, t)))
import gymnasium as gym, envs
gym.register_envs(envs)
env = gym.make("ReasoningGym-v1", task="chain_sum", split="train", train_size=2, test_size=1)
step_worst = 0.0
for text in ["^" + " " * (MAX_TEXT_CHARS - 2) + "x", "**" + "(" * 30 + " " * 4000 + "x", "<answer>" * 512,
             "1," * 2048, "9e" * 2048, "2**(" + "\n" * 4000 + "9)"]:
    env.reset(options={"index": 0})
    t0 = time.perf_counter()
    _, reward, *_ = env.step(text)
    step_worst = max(step_worst, time.perf_counter() - t0)
    assert reward == 0.0, text[:20]
print(json.dumps({"worst_ms": worst[0] * 1000, "shape": worst[1], "step_worst_ms": step_worst * 1000}))
"""


def test_answer_scans_are_linear_on_pathological_shapes_at_the_full_window():
    """The scans (guard, extraction, grammars) and a whole chain_sum step, on every shape; in a subprocess with a
    deadline, so a super-linear scan fails the test instead of hanging it (a regex cannot be interrupted)."""
    try:
        p = subprocess.run([sys.executable, "-c", _TIMING_SCRIPT], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the answer scans did not finish the pathological shapes in 120 s (super-linear)")
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["worst_ms"] < SCAN_BOUND_MS and res["step_worst_ms"] < STEP_TIME_BOUND_S * 1000, res


def test_the_last_answer_block_is_read_as_the_librarys_regex_reads_it():
    import re

    from envs.reasoning_gym.grading import last_answer_block

    tag = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
    for text in ["<answer>a</answer>", "<answer>a<answer>b</answer>", "<answer> a </answer> <answer>\nb\n</answer>",
                 "<answer>a</answer><answer>b", "<answer></answer>", "x</answer><answer>y</answer>z", "none",
                 "<answer>a</answer></answer>", "<answer><answer></answer></answer>"]:
        found = tag.findall(text)
        got = last_answer_block(text)
        assert (got.strip() if got is not None else None) == (found[-1].strip() if found else None), text


# ---------------------------------------------------------------------------------------------------- C: gold passes
def test_hexadecimal_answers_are_not_read_as_exponents():
    from envs.reasoning_gym.grading import answer_guard

    for gold in ["0x176b9e643680", "0x1e500", "-0x9e999", "0XABCE123"]:
        assert answer_guard(gold, gold) is None, gold
    assert answer_guard("1e500", "5") and answer_guard("9e643680", "0x1") and answer_guard("2.5E+999", "1")
    assert answer_guard("1e150", "1e150") is None  # the gold's own exponent is allowed
    env = _env("bitwise_arithmetic", train_size=300)
    hexe = 0
    for i in range(env.unwrapped.num_tasks):
        _, info = env.reset(options={"index": i})
        if any(c in "eE" for c in info["answer"]):
            hexe += 1
            _, reward, *_, info = env.step(f"<answer>{info['answer']}</answer>")
            assert reward == 1.0 and "action_error" not in info, info["answer"]
    assert hexe > 0  # the train split holds such golds (the issue counted 4 of 300 with an 'e' before digits)


def test_a_gold_answer_longer_than_the_window_is_read_whole():
    """palindrome_partitioning's gold answers reach ~5,000 characters: the 4,096-character window cut the opening tag
    off, so the gold scored 0 (found by the every-task sweep)."""
    from envs.reasoning_gym.grading import MAX_TEXT_CHARS, answer_guard, extract_answer

    gold = "[" + ", ".join(['["a", "b"]'] * 600) + "]"
    assert len(gold) > MAX_TEXT_CHARS
    assert extract_answer(f"reasoning...\n<answer>{gold}</answer>", gold) == gold and answer_guard(gold, gold) is None
    assert answer_guard(gold, "5")  # the window widens for the gold's length only
    env = _env("palindrome_partitioning", train_size=10)
    longest = max(range(10), key=lambda i: len(env.unwrapped._problems[i]["answer"]))
    _, info = env.reset(options={"index": longest})
    assert len(info["answer"]) > MAX_TEXT_CHARS  # item 8 of the default train split: 4,904 characters
    _, reward, *_ = env.step(f"<answer>{info['answer']}</answer>")
    assert reward == 1.0


#: Golds the library's own verifier scores below 1, by task (a predicate on the gold): the sweep checks that the env
#: scores them as the library does. gsm_symbolic (reasoning-gym 0.1.25): score_answer reads the first match of
#: ``\b-?\d+(?:\.\d+)?\b``, whose ``\b`` cannot stand before a leading ``-``, so a negative gold reads as its
#: absolute value and scores 0.01 (1 of the 200 default test items, -2).
LIBRARY_GOLD_BUGS = {"gsm_symbolic": lambda gold: gold.strip().startswith("-")}


def _gold_sweep(tasks, items, split="train", first=None):
    """Every item's gold answer through the env (a split of ``items``; its first ``first`` only when given): scored 1
    as the library scores it, never refused."""
    failures = []
    for task in tasks:
        env = _env(task, split=split, train_size=items) if split == "train" else _env(task, split=split, test_size=items)
        ds = env.unwrapped._scorer
        for i in range(min(env.unwrapped.num_tasks, first or env.unwrapped.num_tasks)):
            _, info = env.reset(options={"index": i})
            gold = info["answer"]
            _, reward, *_, step_info = env.step(f"<answer>{gold}</answer>")
            p = env.unwrapped._problems[i]
            want = ds.score_answer(str(gold).strip(), {"question": p["question"], "answer": p["answer"],
                                                     "metadata": p["metadata"]})
            library_bug = want < 1.0 and LIBRARY_GOLD_BUGS.get(task, lambda g: False)(str(gold))
            if "action_error" in step_info or reward != want or (reward < 1.0 and not library_bug):
                failures.append((task, i, str(gold)[:60], reward, want, step_info.get("action_error")))
    return failures


def test_gold_answers_pass_on_the_guarded_tasks():
    assert _gold_sweep(GUARDED + ["chain_sum", "products", "basic_arithmetic", "decimal_arithmetic",
                                  "power_function"], 8) == []


def test_an_unevaluated_integral_gold_is_replaced_by_an_antiderivative():
    """The library's sympy.integrate left Integral(...) in 7 of 40 intermediate_integration test golds (depending on
    its cache state; the same integrand parsed afresh integrates): the grammar refuses Integral, so those
    demonstrations scored 0 (issue 42). The split's gold is now an antiderivative the verifier accepts."""
    from envs.reasoning_gym.data import evaluated_gold

    item = {"question": "q", "answer": "-3*Integral(x**3*cos(2*x), x) + C",
            "metadata": {"source_dataset": "intermediate_integration", "integrand": "-3*x**3*cos(2*x)",
                         "variable": "x"}}
    fixed = evaluated_gold(item)
    assert "Integral" not in fixed["answer"] and fixed["answer"].endswith(" + C")
    env = _env("intermediate_integration")
    entry = {"question": "q", "answer": fixed["answer"], "metadata": item["metadata"]}
    assert env.unwrapped._scorer.score_answer(fixed["answer"], entry) == 1.0
    plain = {"question": "q", "answer": "x**2/2 + C", "metadata": {"integrand": "x", "variable": "x"}}
    assert evaluated_gold(plain) is plain  # an evaluated gold is kept as it is


#: Tasks whose items take minutes to generate (futoshiki 530 s, knight_swap 507 s for the default test split at load
#: 10-15 on 2 cores): CI's slow stage sweeps a test split of 10, the nightly stage the default split.
SLOW_TO_GENERATE = ("futoshiki", "knight_swap")
#: Test golds per task in CI's slow stage (the first of the default split: the same items a user's run draws).
CI_GOLDS_PER_TASK = 50


@pytest.mark.slow
@pytest.mark.nightly  # every task's 200 default test golds: 1,953 s in all at load 10-15 on 2 cores
@pytest.mark.parametrize("task", [t for t in valid_tasks() if t not in NO_GOLD])
def test_gold_answers_pass_on_every_task(task):
    """Before (issue 42): intermediate_integration's test golds holding Integral(...) scored 0 (the sweep read 10
    train items, which had none)."""
    assert _gold_sweep([task], DEFAULT_TEST_SIZE, split="test") == []


@pytest.mark.slow  # the CI share of the sweep above: every task, its first CI_GOLDS_PER_TASK default test golds
@pytest.mark.parametrize("task", [t for t in valid_tasks() if t not in NO_GOLD])
def test_the_first_test_golds_pass_on_every_task(task):
    if task in SLOW_TO_GENERATE:  # a test split of 10 (drawing the default 200 takes minutes)
        assert _gold_sweep([task], 10, split="test") == []
    else:
        assert _gold_sweep([task], DEFAULT_TEST_SIZE, split="test", first=CI_GOLDS_PER_TASK) == []
# ---------------------------------------------------------------------------------------------------- D: no gold
@pytest.mark.parametrize("task", NO_GOLD)
def test_a_task_without_gold_answers_has_no_demonstration(task):
    env = _env(task)
    u = env.unwrapped
    assert u._problems[0]["answer"] is None  # the library's items carry none
    with pytest.raises(ValueError, match=f"'{task}'.*no gold answer"):
        u.demonstration({"index": 0})


def test_sft_reports_which_tasks_have_no_demonstration(tok, caplog):
    from torchrl_grpo.backends.base import SamplingConfig
    from torchrl_grpo.rollout.collector import GroupCollector
    from torchrl_grpo.rollout.demonstrations import ScriptedBackend, gold_demonstrations

    def make_env():
        return gym.make("ReasoningGym-v1", tasks={"chain_sum": 1.0, "rubiks_cube": 1.0, "boxnet": 1.0},
                        task_config={"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}},
                        train_size=12, test_size=2)

    collector = GroupCollector(make_env, ScriptedBackend(tok.eos_token_id), tok, SamplingConfig(max_new_tokens=16))
    names = [p["metadata"]["source_dataset"] for p in collector.probe_env.unwrapped._problems]
    with caplog.at_level(logging.WARNING, logger="torchrl_grpo.rollout.demonstrations"):
        batch, stats = gold_demonstrations(collector, range(len(names)))
    assert stats["demo/dropped_no_demo"] == names.count("rubiks_cube") + names.count("boxnet") > 0
    assert stats["demo/kept"] == names.count("chain_sum") and batch.shape[0] == names.count("chain_sum")
    report = [r.getMessage() for r in caplog.records if "no demonstration" in r.getMessage()]
    assert len(report) == 1, report  # one summary, not a line per task
    assert "'rubiks_cube'" in report[0] and "'boxnet'" in report[0] and str(names.count("boxnet")) in report[0]
