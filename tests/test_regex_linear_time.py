"""Every regular expression applied to model text runs in linear time (issue 34, item 2).

Python's ``re`` backtracks: one pattern with adjacent or nested quantifiers over the same characters turns a long
run of those characters into quadratic or cubic work, and the GIL makes that work a freeze of every session on a
server and of the whole rollout in training (GSM8K's ``\\frac`` pattern: ``\\frac{`` plus 2,500 spaces took 9.4 s;
tau2's code-fence pattern: three backticks, 24k newlines, ``x``: 5.6 s).

The proof here is a timing test, generated from the patterns themselves so that a new pattern is covered without
editing the shapes:

1. **Inventory** (:data:`MODEL_TEXT_MODULES` / :data:`NOT_MODEL_TEXT`). Every ``re`` / ``re2`` / ``regex`` call in
   ``envs/`` and ``torchrl_grpo/`` is found from the AST (``re.compile(...)`` and inline ``re.sub/search/...``;
   ``envs/serve.py`` included) and must be either a module-level pattern of a model-text module (all of those are
   introspected and timed, so a new one is covered without editing this file) or listed in :data:`NOT_MODEL_TEXT`
   with the reason it never sees model text; :func:`test_every_pattern_is_inventoried` fails otherwise.
2. **Shapes** (:func:`shapes`): for each pattern, the prefixes of a shortest string it matches, cut where a
   literal run ends (``"\\\\frac"``, ``"```"``, ``"<tool_call>"``, ``"0,000/0"``...: the optional tokens), each
   followed by a long run of one character (spaces, newlines, tabs, braces, brackets, carets, backticks, digits,
   letters, quotes, backslashes, stars, dashes, ``<``/``>``, no-break spaces, and one character of each class the
   pattern uses), with and without a character that breaks the match at the end, interleaved
   (``(token + char) * k``), the token repeated, and the run before the token.
3. **Timing**: each pattern is run as its callers can run it (``sub``: through every match, which is what
   ``search``, ``findall`` and ``finditer`` cost at worst; and ``match`` at 0) on every shape at 1/16 of its sweep
   size (:data:`SWEEP_CHARS` or its window if smaller), the 12 slowest at the sweep size, the 4 slowest of those at
   the full window. Every call must take less than :data:`BOUND_S` (100 ms) up to 20,000 characters and
   :data:`BOUND_LARGE_S` (1 s) at the 1 MiB tau2 action window. Linear patterns take well under a millisecond at
   20,000 characters on an idle core; the superlinear ones this file caught took 0.9-7 s at 1,250-4,096 characters,
   so the bounds leave a 10x+ margin for a loaded 2-core machine and still fail any superlinear pattern. The small
   size runs first, so a cubic pattern fails in seconds instead of hanging for hours.
4. **Call sites**: the same shapes through the functions that apply the patterns (GSM8K's :func:`extract_answer`
   and :func:`has_final_answer_format`, tau2's :func:`parse_action`, :func:`json_depth`, the scripted customer,
   ReasoningGym's extraction and guard, the remote client's reply check), at their windows, where hand scanners
   replace patterns.

Inventory (``grep -rn "re\\." envs torchrl_grpo``, 2026-11-26), windows = how much model text a pattern can see:

=====================================  ==========================================  ================================
where                                  patterns                                    window
=====================================  ==========================================  ================================
envs/gsm8k/grading.py                  _NUMBER_RE _HASH_RE _BOXED_RE _BRACE_RE      MAX_GRADED_CHARS (20,000)
                                       _ANSWER_IS_RE _ANSWER_COLON_RE _FRAC_CMD_RE
                                       _SPACES_RE _TEXT_CMD_RE (the ``\\frac`` groups
                                       are read by a scanner, not a regex)
envs/tau2/actions.py                   _THINK_RE _TOOL_CALL_RE _NAME_RE             the whole action: 1 MiB, the
                                       _FUNCTIONAL_RE (the code fence is read by    server's body cap
                                       a scanner, not a regex)
envs/action_text.py                    _SURROGATE_RE (JSON string literals are      the whole action (1 MiB); a
                                       read by a scanner, not a regex, since        server's reply for the remote
                                       issue 49: :func:`json_shape`)                client: 8 MiB
envs/tau2/users.py                     _CLOSING_RE _CONFIRM_RE                      READ_CHARS (4,000)
envs/reasoning_gym/grading.py          _NUMBER _DIGIT_RUN (the answer tag and the   MAX_TEXT_CHARS (4,096)
                                       power guards are scanners since 2d47f0a)
library checkers (if-verifiable)       IFEval / IFBench ``check_following``         the IFEval env's
                                                                                    ``max_response_chars`` (tested
                                                                                    in tests/test_step_bounds.py)
tau2 ``parse_functional_tool_call``    ``^(\\w+)\\s*\\((.*)\\)$`` (linear), per line  the action, one line each
=====================================  ==========================================  ================================

Not model text (:data:`NOT_MODEL_TEXT`): GSM8K dataset ids and reference solutions, ReasoningGym's gold answers,
tau2 task instructions (``first_person``), TRL tool schemas and env ids, config strings, checkpoint directory names,
chat templates.
"""
from __future__ import annotations

import ast
import importlib
import re
import sys
import time
from pathlib import Path

import pytest

try:  # Python 3.11+: the parser moved; sre_parse is a deprecated alias
    from re import _parser as sre_parse
    from re import _constants as sre_constants
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants
    import sre_parse

ROOT = Path(__file__).resolve().parents[1]

#: Upper bound (seconds) on one call of a pattern (or a call site) on a shape of its full window, for windows up to
#: 20,000 characters. Linear code takes < 2 ms there on an idle core; quadratic code takes seconds.
BOUND_S = 0.1
#: The same for the 1 MiB tau2 action window: a linear pattern that matches at every character makes a million
#: matches there (``[\\ud800-\\udfff]`` on a MiB of surrogates: 0.26 s here); quadratic ones take hours.
BOUND_LARGE_S = 1.0

GSM8K_WINDOW = 20_000
ACTION_WINDOW = 1 << 20
USER_WINDOW = 4_000
RG_WINDOW = 4_096

#: module -> window (characters of model text its patterns can see). Every module-level compiled pattern of these
#: modules sees model text and is timed (introspection: a new one is covered without editing this file), except
#: those listed in :data:`NOT_MODEL_TEXT`; a pattern compiled inside a function fails the inventory test.
MODEL_TEXT_MODULES: dict[str, int] = {
    "envs.gsm8k.grading": GSM8K_WINDOW,
    "envs.tau2.actions": ACTION_WINDOW,
    "envs.action_text": ACTION_WINDOW,
    "envs.tau2.users": USER_WINDOW,
    "envs.reasoning_gym.grading": RG_WINDOW,
}


def _module_patterns(module: str) -> dict[str, re.Pattern]:
    """The module-level compiled patterns of ``module`` that see model text (not in :data:`NOT_MODEL_TEXT`)."""
    mod = importlib.import_module(module)
    path = module.replace(".", "/") + ".py"
    return {name: value for name, value in vars(mod).items()
            if isinstance(value, re.Pattern) and (path, name) not in NOT_MODEL_TEXT}


def model_text_patterns() -> dict[tuple[str, str], int]:
    """(module, attribute) -> window, for every compiled pattern that sees model text."""
    return {(m, name): w for m, w in MODEL_TEXT_MODULES.items() for name in _module_patterns(m)}


#: (file, the variable the pattern is assigned to, or its source when inline) -> why it never sees model text.
NOT_MODEL_TEXT: dict[tuple[str, str], str] = {
    ("envs/gsm8k/data.py", "_HF_ID_RE"): "a dataset id from the config",
    ("envs/tau2/task_file.py", "_SURROGATE_ESCAPE_RE"): "a user's tasks file (size-capped first), never model text; "
                                                        "no nested quantifier: one pass",
    ("envs/serving/guard.py", "_HOST_RE"): "a request's Host header (uvicorn caps a header line), never model text",
    ("envs/gsm8k/env.py", "text"): "the dataset's reference solution (demonstrations)",
    ("envs/reasoning_gym/grading.py", "_NUMERIC_GOLD"): "the gold answer",
    ("envs/tau2/users.py", "p"): "_PRONOUN_RES: tau2's task instructions (first_person)",
    ("envs/adapters/trl_env.py", "'\\\\s+'"): "_one_line: tool schema descriptions",
    ("envs/adapters/trl_env.py", "parts"): "an env id",
    ("torchrl_grpo/config/allocation_mode.py", "_TERM"): "the allocation_mode config string",
    ("torchrl_grpo/config/allocation_mode.py", "'([dtp])(\\\\d+)'"): "the allocation_mode config string",
    ("torchrl_grpo/training/checkpoint.py", "_STEP_RE"): "checkpoint directory names",
    ("torchrl_grpo/training/checkpoint.py", "_ASIDE_RE"): "checkpoint directory names",
    ("torchrl_grpo/model_store/tokenizer.py", "_SMOLLM_DEFAULT_SYSTEM"): "the tokenizer's chat template",
    ("torchrl_grpo/model_store/resolve.py", "_HUB_ID"): "a model id",
}

_RE_FUNCS = {"compile", "search", "match", "fullmatch", "sub", "subn", "split", "findall", "finditer"}


def _pattern_sites() -> set[tuple[str, str]]:
    """``(file, name)`` of every ``re.X(pattern, ...)`` / ``re2.X(...)`` / ``regex.X(...)`` call in envs/ and
    torchrl_grpo/, found from the AST; ``name`` is the variable the result is assigned to, else the pattern's
    source text."""
    sites: set[tuple[str, str]] = set()
    for folder in ("envs", "torchrl_grpo"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            targets = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    targets[id(node.value)] = node.targets[0].id
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name) and node.func.value.id in ("re", "re2", "regex")
                        and node.func.attr in _RE_FUNCS and node.args):
                    sites.add((path.relative_to(ROOT).as_posix(), targets.get(id(node)) or ast.unparse(node.args[0])))
    return sites


def _model_text_sites() -> set[tuple[str, str]]:
    return {(mod.replace(".", "/") + ".py", attr) for mod, attr in model_text_patterns()}


def test_every_pattern_is_inventoried():
    """A pattern written anywhere in envs/ or torchrl_grpo/ is either timed here (it sees model text) or listed with
    the reason it never does; a stale entry fails too."""
    sites = _pattern_sites()
    timed = _model_text_sites()
    listed = timed | set(NOT_MODEL_TEXT)
    assert not timed & set(NOT_MODEL_TEXT)
    assert sites - listed == set(), f"patterns not inventoried (compile them at module level in a MODEL_TEXT_MODULES module, or list them in NOT_MODEL_TEXT): {sorted(sites - listed)}"
    assert listed - sites == set(), f"inventory entries that no longer exist: {sorted(listed - sites)}"


@pytest.mark.parametrize("module", sorted(MODEL_TEXT_MODULES))
def test_model_text_modules_hold_the_inventoried_patterns(module):
    """The GSM8K grader, the tau2 parser and the action-text cleaner read model text with module-level patterns only
    (introspected above); a list of patterns at module level (built at import) must be accounted for too."""
    mod = importlib.import_module(module)
    path = module.replace(".", "/") + ".py"
    for name, value in vars(mod).items():
        if isinstance(value, (list, tuple)) and value and all(
                isinstance(v, tuple) and v and isinstance(v[0], re.Pattern) for v in value):
            assert (path, name) in NOT_MODEL_TEXT or any(
                why.startswith(name + ":") for (f, _), why in NOT_MODEL_TEXT.items() if f == path), name
    assert _module_patterns(module) or module == "envs.reasoning_gym.grading"


# ---------------------------------------------------------------------------------------------------------------
# shapes generated from a pattern
# ---------------------------------------------------------------------------------------------------------------
#: Characters run next to each token: the classes of the issue (spaces, newlines, braces, carets, backticks,
#: digits) and the others model text is made of.
RUN_CHARS = " \n\t{}[]()^`0a_.,-*/\\\"<>:$e\u00a0"
_BREAK = "\x01"  # matches nothing a pattern here looks for


def _rep_char(items) -> str:
    """One character matched by an ``IN`` class (its items), ``""`` for a negated class."""
    for op, _av in items:
        if op is sre_constants.NEGATE:
            return ""
    for op, av in items:
        if op is sre_constants.LITERAL:
            return chr(av)
        if op is sre_constants.RANGE:
            return chr(av[0])
        if op is sre_constants.CATEGORY:
            name = str(av)
            return "0" if "DIGIT" in name else " " if "SPACE" in name else "a" if "WORD" in name else ""
    return ""


def _min_string(item) -> str:
    """A shortest string matching one parsed item (first branch, minimum repeats, assertions empty)."""
    op, av = item
    if op is sre_constants.LITERAL:
        return chr(av)
    if op is sre_constants.NOT_LITERAL:
        return "a" if av != ord("a") else "b"
    if op is sre_constants.ANY:
        return "a"
    if op is sre_constants.IN:
        return _rep_char(av)
    if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, getattr(sre_constants, "POSSESSIVE_REPEAT", None)):
        lo, _, sub = av
        return "".join(_min_string(x) for x in sub) * lo
    if op is sre_constants.SUBPATTERN:
        return "".join(_min_string(x) for x in av[-1])
    if op is sre_constants.BRANCH:
        return "".join(_min_string(x) for x in av[1][0])
    return ""  # AT, ASSERT, ASSERT_NOT, GROUPREF, ...


def _prefixes(seq, head: str = "", out: set | None = None, limit: int = 24) -> set[str]:
    """Prefixes of shortest matching strings, cut where a literal run ends (``"\\\\frac"``, ``"\\\\frac{"``, ...):
    optional items are also taken once, branches and groups are followed into."""
    out = set() if out is None else out
    seq = list(seq)
    for k, (op, av) in enumerate(seq):
        if len(out) >= limit:
            break
        if op is sre_constants.BRANCH:
            for branch in av[1]:
                _prefixes(branch, head, out, limit)
            head += _min_string((op, av))
        elif op is sre_constants.SUBPATTERN:
            _prefixes(av[-1], head, out, limit)
            head += _min_string((op, av))
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT) and av[0] == 0:
            once = "".join(_min_string(x) for x in av[2])
            if once:
                out.add(head + once)
        else:
            head += _min_string((op, av))
        literal_continues = op is sre_constants.LITERAL and k + 1 < len(seq) and seq[k + 1][0] is sre_constants.LITERAL
        if head and not literal_continues:
            out.add(head)
    return out


def _class_chars(seq, acc: set) -> set:
    for op, av in seq:
        if op is sre_constants.IN:
            c = _rep_char(av)
            if c:
                acc.add(c)
        elif op is sre_constants.LITERAL:
            acc.add(chr(av))
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
            _class_chars(av[2], acc)
        elif op is sre_constants.SUBPATTERN:
            _class_chars(av[-1], acc)
        elif op is sre_constants.BRANCH:
            for b in av[1]:
                _class_chars(b, acc)
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            _class_chars(av[1], acc)
    return acc


def shapes(pattern: re.Pattern, size: int) -> list[str]:
    """Pathological strings of about ``size`` characters for ``pattern`` (see the module docstring)."""
    parsed = sre_parse.parse(pattern.pattern, pattern.flags)
    tokens = sorted(_prefixes(list(parsed)) | {""})
    chars = sorted(set(RUN_CHARS) | _class_chars(list(parsed), set()))
    out = []
    for t in tokens:
        if t:
            out.append(t * max(1, size // len(t)))
        for c in chars:
            n = max(1, size - len(t) - 1)
            out.append(t + c * n)
            out.append(t + c * n + _BREAK)
            out.append(c * n + t)
            if t:
                out.append((t + c) * max(1, size // (len(t) + 1)))
    return list(dict.fromkeys(out))


def _run(pattern: re.Pattern, text: str) -> float:
    """Seconds to run ``pattern`` over ``text`` as its callers can: through every match (``sub``; what ``search``,
    ``findall`` and ``finditer`` cost at worst) and anchored at 0 (``match``). CPU seconds of this thread (see
    :func:`_timed`: load-proof, and a backtracking pattern still pays them)."""
    t0 = time.thread_time()
    pattern.sub("", text)
    pattern.match(text)
    return time.thread_time() - t0


#: Every shape is timed at 1/16 of this many characters, then at this many (or the window, if smaller).
SWEEP_CHARS = 20_000


def _bound(window: int) -> float:
    return BOUND_LARGE_S if window > SWEEP_CHARS else BOUND_S


def _check_pattern(pattern: re.Pattern, window: int) -> None:
    """Every shape at 1/16 of the sweep size (a cubic pattern already fails there, instead of hanging), the 12
    slowest at the sweep size, the 4 slowest of those at the full window when it is larger."""
    sweep = min(window, SWEEP_CHARS)
    ranked = []
    for s in shapes(pattern, sweep // 16):
        dt = _run(pattern, s)
        assert dt < BOUND_S, (f"{pattern.pattern!r} took {dt:.3f} s on {len(s)} characters "
                              f"({s[:24]!r}...{s[-8:]!r}); bound {BOUND_S} s at {sweep} characters")
        ranked.append((dt, s))
    by_shape = {(b[:24], b[-8:]): b for b in shapes(pattern, sweep)}
    at_sweep = []
    for _, small in sorted(ranked, key=lambda t: -t[0])[:12]:
        big = by_shape.get((small[:24], small[-8:]))
        if big is None:
            continue
        dt = _run(pattern, big)
        assert dt < BOUND_S, (f"{pattern.pattern!r} took {dt:.3f} s on {len(big)} characters "
                              f"({big[:24]!r}...{big[-8:]!r}); bound {BOUND_S} s")
        at_sweep.append((dt, big))
    if window == sweep:
        return
    bound = _bound(window)
    by_shape = {(b[:24], b[-8:]): b for b in shapes(pattern, window)}
    for _, small in sorted(at_sweep, key=lambda t: -t[0])[:4]:
        big = by_shape.get((small[:24], small[-8:]))
        if big is None:
            continue
        dt = _run(pattern, big)
        assert dt < bound, (f"{pattern.pattern!r} took {dt:.3f} s on {len(big)} characters "
                            f"({big[:24]!r}...{big[-8:]!r}); bound {bound} s at the window {window}")


def _model_text_params():
    for key, window in model_text_patterns().items():
        yield pytest.param(key, window, id=f"{key[0].split('.')[-2]}.{key[1]}")


@pytest.mark.parametrize("key,window", list(_model_text_params()))
def test_pattern_is_linear_on_pathological_shapes(key, window):
    pattern = getattr(importlib.import_module(key[0]), key[1])
    _check_pattern(pattern, window)


# ---------------------------------------------------------------------------------------------------------------
# call sites (scanners included), with the known bad shapes and every pattern's shapes at the call's window
# ---------------------------------------------------------------------------------------------------------------
def _timed(fn, text: str, bound: float) -> None:
    # CPU time of this thread, not wall time: a quadratic scan costs CPU whatever the machine's load, while wall time
    # also counts the time a loaded machine (CI beside other jobs, a training run) did not schedule this process --
    # a 0.8 ms check once read 0.137 s of wall time beside a training run.
    t0 = time.thread_time()
    fn(text)
    dt = time.thread_time() - t0
    assert dt < bound, f"{getattr(fn, '__name__', fn)} took {dt:.3f} s of CPU on {len(text)} characters ({text[:24]!r}...)"


#: Tokens the scanners read (they are not in a pattern any more): their groups and fences.
SCANNER_TOKENS = ("\\frac{", "\\frac{1}{", "\\dfrac {1} {", "\\boxed{", "\\boxed{\\text{", "```", "```json", "<tool_call>```",
                  '<tool_call>{"name": "done", "arguments": ', '{"name": "done", "arguments": ')


def _call_site_shapes(window: int, modules: tuple[str, ...]) -> list[str]:
    """Shapes of every model-text pattern of ``modules`` and of :data:`SCANNER_TOKENS`, at ``window``, thinned to
    the token-then-run ones."""
    out = [t + c * max(1, window - len(t) - 1) + "x" for t in SCANNER_TOKENS for c in " \n{}^`0\\"]
    for (mod, attr), _ in model_text_patterns().items():
        if mod in modules:
            pattern = getattr(importlib.import_module(mod), attr)
            parsed = sre_parse.parse(pattern.pattern, pattern.flags)
            for t in sorted(_prefixes(list(parsed))):
                for c in " \n{}^`0":
                    n = max(1, window - len(t) - 1)
                    out.append(t + c * n + "x")
    return list(dict.fromkeys(out))


#: name -> (head, run character, tail, run length): the issue's measured cases (9.4 s and 5.6 s before the fix).
KNOWN_BAD = {
    "gsm8k_frac": ("\\frac{", " ", "x", GSM8K_WINDOW - 7),
    "gsm8k_frac_2": ("\\frac{1}{", " ", "x", GSM8K_WINDOW - 10),
    "gsm8k_dfrac_newlines": ("\\dfrac {", "\n", "x", GSM8K_WINDOW - 9),
    "tau2_fence": ("```", "\n", "x", 24_000),
    "tau2_fence_json": ("```json", " ", "x", 24_000),
    "tau2_fence_in_block": ("<tool_call>```", "\n", "x", 24_000),
}


@pytest.mark.parametrize("name", sorted(KNOWN_BAD))
def test_known_pathological_inputs(name):
    """The issue's measured cases through the public functions, at 1/64, 1/8 and all of their length (so that the
    cubic case fails in seconds instead of hanging)."""
    from envs.gsm8k.grading import extract_answer, has_final_answer_format
    from envs.tau2.actions import parse_action

    head, c, tail, n = KNOWN_BAD[name]
    fns = (extract_answer, has_final_answer_format) if name.startswith("gsm8k") else (parse_action,)
    for k in (n // 64, n // 8, n):
        for fn in fns:
            _timed(fn, head + c * k + tail, BOUND_S)


def test_gsm8k_call_sites_at_the_window():
    from envs.gsm8k.grading import extract_answer, gsm8k_reward

    for s in _call_site_shapes(GSM8K_WINDOW, ("envs.gsm8k.grading",)):
        _timed(extract_answer, s, BOUND_S)
    _timed(lambda t: gsm8k_reward(t, "12"), "\\frac{" + " " * 10 * GSM8K_WINDOW, BOUND_S)  # beyond the window


def test_tau2_parse_action_at_the_window():
    from envs.tau2.actions import parse_action

    names = ["get_user_details", "done"]
    texts = _call_site_shapes(ACTION_WINDOW // 16, ("envs.tau2.actions", "envs.action_text"))
    for s in texts:
        _timed(lambda t: parse_action(t, tool_names=names), s, BOUND_S * 2)
    for s in "```" + "\n" * ACTION_WINDOW + "x", "<tool_call>```json" + "\n" * ACTION_WINDOW:
        _timed(lambda t: parse_action(t, tool_names=names), s, BOUND_LARGE_S)


def test_scripted_customer_reply_at_any_length():
    from envs.tau2.users import ScriptedUser

    user = ScriptedUser("You are Raj. Your user id is raj_1.")
    for s in _call_site_shapes(4 * USER_WINDOW, ("envs.tau2.users",)):
        _timed(lambda t: user.reply(t, 1), s, BOUND_S)


#: A remote server's reply, as large as a client accepts (``ClientBounds.max_reply_bytes``).
REPLY_WINDOW = 8 << 20


#: The client's string-literal pattern that :func:`envs.action_text.json_shape` replaced (quadratic on ``"`` +
#: ``\\"`` * n: each quote rescans to the end when the string is never closed). Its shapes drive the call site below.
_OLD_CLIENT_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def test_remote_client_reply_check_at_its_window():
    """The client's JSON shape check (:func:`envs.adapters.remote_env.check_json_shape`) reads a reply with
    :func:`envs.action_text.json_shape`, the server's scanner (issue 49: the client's own copy of a string pattern
    was listed here as "not model text" and so never timed; it took 2.9 s on 16 KB of ``"`` + ``\\"`` * n). Every
    shape of that pattern at 1/128 of the window (``(token + char) * k`` is the issue's input), then the issue's
    input and the runs of quotes, backslashes and escapes at the whole window, behind a bracket (so that the
    scanner runs)."""
    from envs.adapters.remote_env import RemoteBoundError, check_json_shape

    def check(text: str) -> None:
        try:
            check_json_shape(text, 64, 100_000)
        except RemoteBoundError:
            pass

    for s in shapes(_OLD_CLIENT_STRING, REPLY_WINDOW // 128):
        _timed(check, "[" + s, BOUND_S)
    for s in ('"' + '\\"' * (REPLY_WINDOW // 2), '"' + "\\" * REPLY_WINDOW, '"' * REPLY_WINDOW,
              '{"a": "' + "\\u" * (REPLY_WINDOW // 2), '"' + '\\\\\\"' * (REPLY_WINDOW // 4)):
        _timed(check, "[" + s, 2 * BOUND_LARGE_S)


def test_reasoning_gym_call_sites_at_the_window():
    from envs.reasoning_gym.grading import answer_guard, extract_answer

    for s in _call_site_shapes(RG_WINDOW, ("envs.reasoning_gym.grading",)):
        _timed(lambda t: extract_answer(t, "12"), s, BOUND_S)
        _timed(lambda t: answer_guard(t, "12"), s, BOUND_S)


if __name__ == "__main__":  # pragma: no cover - a quick report of the slowest shape per pattern
    for key, window in model_text_patterns().items():
        p = getattr(importlib.import_module(key[0]), key[1])
        worst = max((_run(p, s), s[:20]) for s in shapes(p, window // 16))
        print(f"{key[0]}.{key[1]}: {worst[0] * 1000:.2f} ms at {window // 16} chars ({worst[1]!r})", file=sys.stderr)


# ---------------------------------------------------------------------------------------------------------------
# the scanners that replaced superlinear patterns give what those patterns gave
# ---------------------------------------------------------------------------------------------------------------
_OLD_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]*?)\s*\}\s*\{\s*([^{}]*?)\s*\}")  # cubic: short inputs only
_OLD_FENCE = re.compile(r"^```(?:json|JSON)?\s*\n?(.*?)\n?```$", re.DOTALL)  # quadratic: short inputs only


def _random_texts(alphabet: list[str], n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14))) for _ in range(n)]


def test_frac_scanner_equals_the_pattern_it_replaced():
    from envs.gsm8k.grading import _replace_fracs

    alphabet = ["\\frac", "\\dfrac", "\\tfrac", "\\", "frac", "{", "}", " ", "\n", "\t", "1", "22", "a", "d", "\u00a0"]
    for text in _random_texts(alphabet, 20_000, 0) + ["\\frac{ 3 }{ 4 }", "\\frac {1}\n{2} and \\dfrac{a b}{c}"]:
        assert _replace_fracs(text) == _OLD_FRAC.sub(r"\1/\2", text), repr(text)


def test_fence_scanner_equals_the_pattern_it_replaced():
    from envs.tau2.actions import _unfence

    alphabet = ["```", "`", "json", "JSON", "js", "\n", " ", "\t", "x", "{}", "\u2028"]
    for text in _random_texts(alphabet, 20_000, 1) + ['```json\n{"name": "a"}\n```', "``````", "```json```"]:
        body = text.strip()
        m = _OLD_FENCE.match(body)
        assert _unfence(body) == (m.group(1).strip() if m else body), repr(body)
