"""Answer extraction from model text, and the bounds put on it before the library's ``score_answer`` sees it.

Extraction (:func:`extract_answer`), on the last :func:`window_chars` characters of the response only
(:data:`MAX_TEXT_CHARS`, or the gold answer's length plus :data:`GOLD_MARGIN_CHARS` when that is more: a few tasks'
gold answers are longer, e.g. palindrome_partitioning's reach ~5,000 characters):

1. the content of the last ``<answer>...</answer>`` block (stripped), if there is one -- the format of the
   library's own prompts (read as ``reasoning_gym.utils.extract_answer``'s regex reads it, by a linear scan:
   :func:`last_answer_block`);
2. else, when the gold answer is a number (``-12``, ``3.5``, ``1,000``), the last number in the text;
3. else the last non-empty line (stripped);
4. else (empty / whitespace text) nothing: ``None``, which scores 0.

Why not tags only: with SmolLM2-135M-Instruct and a system prompt asking for "the final answer alone on the last
line", answer-tag-only extraction scored 0 on every task tried, tag / last number / last line scored 0.58 greedy
on 1-digit ``products`` (a throwaway probe recorded in issue 26).

Every model output is hostile, and some of the library's scorers convert or evaluate the answer (``Decimal``,
``int(s, 0)``, ``eval``, sympy's ``parse_expr``). So before any conversion (:func:`answer_guard`), an extracted
answer scores 0 (with a reason) when it holds

* more than :func:`window_chars` characters;
* a run of more than ``max(MAX_DIGITS, longest digit run of the gold answer)`` digits;
* brackets nested deeper than ``max(MAX_NESTING, the gold answer's depth)``;
* a scientific exponent (``1e100000000``; a decimal float literal: ``0x176b9e643680`` is a hexadecimal integer, not
  ``9e643680``) or a power exponent (``9**99999``, ``2^99999``) above ``max(MAX_EXPONENT, the gold answer's
  largest)``, or a power of a power (``9**9**9``, ``(9**9)**9``) when the gold answer has none.

Each bound widens to the gold answer's own value, so a gold answer always passes (issue 36). Then, for a task whose
verifier can evaluate text (:mod:`.verifier_audit`), the answer must match its task's grammar
(:mod:`.answer_formats`) or it scores 0 (with a reason): no model text reaches ``eval`` or ``parse_expr`` unless
it cannot name an attribute, a dunder, an import or a call (issue 34). Every scan of model text here is linear in
its length (hand-written scans and regexes without nested or adjacent optional repeats; issue 34 measured the old
exponent regexes at 6.5 s on 278 characters). The grammars are the first, cheap filter: they stop payloads.

The cost of the library's verifier is bounded by running it in a killable worker process
(:mod:`envs.grader_process`: CPU time, address space, a wall-clock backstop), every task's, not only the
evaluating ones: sympy's ``simplify`` has no cost bound even on answers inside a grammar
(``exp(100000000*log(3))`` is ``3**100000000``, one C call that held the GIL for 122 s, issue 42), and
propositional_logic's parser is quadratic and recursive (``"¬"*4000 + "P"``: 9 s). A verifier past a bound, or one
that raises, scores 0 with ``action_error`` ``grader_timeout: ...`` / ``grader_memory: ...`` / ``grader_error: ...``
(:class:`envs.grader_process.GraderFailure`), and the grade carries the flags ``grader_timeout`` /
``grader_memory`` / ``grader_error``. (Until issue 42 a watchdog thread raised an exception into the verifier's
thread after 1.5 s: it could not interrupt one C call.)

The library's score is then taken as it is (never re-written): e.g. chain_sum / products compare with ``Decimal``
after removing commas and give ``len(gold) / len(answer)`` partial credit when the gold string occurs inside a
wrong answer (``"15"`` for gold ``"5"`` scores 0.5).
"""
from __future__ import annotations

import re
from typing import Any

from envs.action_text import clean_text
from envs.contract import GRADER_ERROR, checked_reward, grader_flags
from envs.grader_process import grade, register_worker_module
from envs.reasoning_gym.answer_formats import check_format

__all__ = ["MAX_TEXT_CHARS", "GOLD_MARGIN_CHARS", "window_chars", "MAX_DIGITS", "MAX_NESTING", "MAX_EXPONENT", "extract_answer", "last_answer_block",
           "answer_guard", "score"]

#: Only the last this many characters of a response are read (the final answer is at its end), unless the gold
#: answer is longer (:func:`window_chars`).
MAX_TEXT_CHARS = 4096
#: Room for the tags and white space around a gold answer longer than :data:`MAX_TEXT_CHARS`.
GOLD_MARGIN_CHARS = 256
#: Longest run of digits an answer may hold (or the gold answer's longest run, if longer).
MAX_DIGITS = 64
#: Deepest bracket nesting an answer may hold (or the gold answer's, if deeper).
MAX_NESTING = 32
#: Largest exponent (scientific ``e`` or ``**`` / ``^``) an answer may write.
MAX_EXPONENT = 100

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?![\w])")
_NUMERIC_GOLD = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
_DIGIT_RUN = re.compile(r"\d+")
_OPEN_TAG, _CLOSE_TAG = "<answer>", "</answer>"
_BASE_PREFIXES = ("0x", "0X", "0b", "0B", "0o", "0O")


def is_numeric(gold: str) -> bool:
    """Whether the gold answer is a plain number (``-12``, ``3.5``, ``1,000``): extraction then takes the last number."""
    return _NUMERIC_GOLD.fullmatch(gold.strip()) is not None


def last_answer_block(window: str) -> str | None:
    r"""The content of the last ``<answer>...</answer>`` block of ``window``, as ``re.findall(r"<answer>\s?(.*?)\s?
    </answer>", window, re.DOTALL)[-1]`` reads it (the library's regex: blocks left to right, each closed by the
    first ``</answer>`` after its opening, a nested ``<answer>`` part of the content), unstripped; ``None`` when there
    is none. A scan with ``str.find``: linear in ``len(window)`` whatever it holds (the regex retried every later
    opening when one was never closed: quadratic)."""
    last, pos = None, 0
    while True:
        i = window.find(_OPEN_TAG, pos)
        if i < 0:
            return last
        j = window.find(_CLOSE_TAG, i + len(_OPEN_TAG))
        if j < 0:  # no closing after this opening, so none after any later one either
            return last
        last, pos = window[i + len(_OPEN_TAG):j], j + len(_CLOSE_TAG)


def window_chars(gold: str) -> int:
    """How many characters at the end of a response are read: ``max(MAX_TEXT_CHARS, len(gold) + GOLD_MARGIN_CHARS)``,
    so that the gold answer written in tags always fits."""
    return max(MAX_TEXT_CHARS, len(gold) + GOLD_MARGIN_CHARS)


def extract_answer(text: str, gold: str) -> str | None:
    """The answer read from a response (the rules in the module docstring); ``None`` when there is none.

    Cost: linear in ``min(len(text), window_chars(gold))``.
    """
    window = clean_text(text[-window_chars(gold):])
    block = last_answer_block(window)
    if block is not None:
        return block.strip()
    if is_numeric(gold):
        numbers = _NUMBER.findall(window)
        if numbers:
            return numbers[-1]
    lines = [ln.strip() for ln in window.splitlines() if ln.strip()]
    return lines[-1] if lines else None


def _depth(s: str) -> int:
    depth = best = 0
    for ch in s:
        if ch in "([{":
            depth += 1
            best = max(best, depth)
        elif ch in ")]}":
            depth = max(0, depth - 1)
    return best


def _longest_run(s: str) -> int:
    return max((len(m) for m in _DIGIT_RUN.findall(s)), default=0)


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _tokens(s: str) -> list[tuple[str, str]]:
    """``s`` as ``(kind, text)`` tokens, white space dropped, in one left-to-right pass (linear): ``"num"`` a run of
    word characters and dots that starts with a digit (``1.5e-3``, ``0x1f``; a sign right after its ``e``/``E`` and
    the digits after it included, as Python's tokenizer reads a float), ``"word"`` a run of word characters and dots
    that starts with another character (``x``, ``0x176b9e643680``'s tail is part of its number), ``"pow"`` for ``**``
    or ``^``, else one character."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(s)
    while i < n:
        ch = s[i]
        if ch.isspace():
            i += 1
        elif _is_word(ch) or (ch == "." and i + 1 < n and s[i + 1].isdecimal()):
            j = i + 1
            numeric = ch.isdecimal() or ch == "."
            decimal = numeric and not s.startswith(_BASE_PREFIXES, i)
            while j < n:
                c = s[j]
                if _is_word(c) or c == ".":
                    j += 1
                elif decimal and c in "+-" and s[j - 1] in "eE" and j + 1 < n and s[j + 1].isdecimal():
                    j += 2
                else:
                    break
            out.append(("num" if numeric else "word", s[i:j]))
            i = j
        elif s.startswith("**", i):
            out.append(("pow", "**"))
            i += 2
        elif ch == "^":
            out.append(("pow", "^"))
            i += 1
        else:
            out.append((ch, ch))
            i += 1
    return out


def _sci_exponent(num: str) -> str | None:
    """The exponent digits of a decimal float literal (``1.5e-300`` -> ``"300"``, underscores dropped); ``None`` when
    ``num`` is not one (``0x1e5``, ``12``, ``1e``)."""
    if num.lower().startswith(("0x", "0b", "0o")):
        return None
    k = max(num.rfind("e"), num.rfind("E"))
    if k <= 0:
        return None
    mantissa, exp = num[:k].replace("_", ""), num[k + 1:].replace("_", "")
    exp = exp[1:] if exp[:1] in ("+", "-") else exp
    digits = mantissa.replace(".", "", 1)
    if not digits or not digits.isdecimal() or not exp or not exp.isdecimal():
        return None
    return exp


def _leading_digits(num: str) -> str:
    """The exponent a power reads from a number token: its value for ``0x`` / ``0o`` / ``0b`` literals, else its
    leading decimal digits."""
    if num.lower().startswith(("0x", "0b", "0o")):
        try:
            return str(int(num, 0))
        except ValueError:
            return "0"
    k = 0
    while k < len(num) and (num[k].isdecimal() or num[k] == "_"):
        k += 1
    return num[:k].replace("_", "") or "0"


def _scan(s: str) -> tuple[list[str], bool]:
    """``(exponents, power_of_power)`` of ``s`` in one pass over its tokens: every scientific exponent and every
    exponent of ``**`` / ``^`` (after any signs and opening parentheses) as a digit string, and whether a power is
    raised to a power (``9**9**9``, ``2^(3)^4``, or a ``)`` followed by a power, as in ``(9**9)**9``)."""
    toks = _tokens(s)
    exps: list[str] = []
    pow_of_pow = False
    n = len(toks)
    for k, (kind, text) in enumerate(toks):
        if kind == "num":
            e = _sci_exponent(text)
            if e is not None:
                exps.append(e)
        elif kind == ")" and k + 1 < n and toks[k + 1][0] == "pow":
            pow_of_pow = True
        elif kind == "pow":
            j = k + 1
            while j < n and toks[j][0] in ("+", "-", "("):
                j += 1
            if j < n and toks[j][0] == "num":
                exps.append(_leading_digits(toks[j][1]))
            if j < n and toks[j][0] in ("num", "word"):
                j += 1
                while j < n and toks[j][0] == ")":
                    j += 1
                if j < n and toks[j][0] == "pow":
                    pow_of_pow = True
    return exps, pow_of_pow


def _over(exp: str, bound: int) -> bool:
    exp = exp.lstrip("0") or "0"
    return len(exp) > len(str(bound)) or int(exp) > bound


def answer_guard(answer: str, gold: str) -> str | None:
    """Why ``answer`` is refused before scoring (a ``str``), or ``None`` when it may be scored.

    Each bound is the larger of its constant and the gold answer's own value, so the gold answer always passes:
    digit runs (:data:`MAX_DIGITS`), bracket nesting (:data:`MAX_NESTING`), exponents (:data:`MAX_EXPONENT`), a power
    of a power (refused when the gold answer has none); an answer over :func:`window_chars` characters is refused.
    Linear in ``len(answer)`` (hand-written scans, no backtracking regex); converts no number longer than the
    bound's own digits.
    """
    if len(answer) > window_chars(gold):
        return f"answer is longer than {window_chars(gold)} characters; scored 0 without reading it"
    digits = max(MAX_DIGITS, _longest_run(gold))
    if _longest_run(answer) > digits:
        return f"answer holds a number with more than {digits} digits; scored 0 without converting it"
    nesting = max(MAX_NESTING, _depth(gold))
    if _depth(answer) > nesting:
        return f"answer nests brackets deeper than {nesting}; scored 0 without parsing it"
    gold_exps, gold_pow_of_pow = _scan(gold)
    bound = max([MAX_EXPONENT] + [int(e) for e in gold_exps if not _over(e, 10**9)])
    exps, pow_of_pow = _scan(answer)
    if any(_over(e, bound) for e in exps):
        return f"answer writes an exponent above {bound}; scored 0 without evaluating it"
    if pow_of_pow and not gold_pow_of_pow:
        return "answer raises a power to a power; scored 0 without evaluating it"
    return None


#: Datasets rebuilt in a grader worker, by (class, repr of config): at most this many kept.
_WORKER_DATASETS_MAX = 64
_worker_datasets: dict[tuple[type, str], Any] = {}


def _worker_dataset(cls: type, config: Any) -> Any:
    """In a grader worker: ``cls(config)``, built once per worker and config (a dataset is rebuilt from its config,
    not sent: some hold megabytes of word lists, some hold lambdas that do not pickle). :func:`score` has it run as
    the grade's preparation (:meth:`envs.grader_process.GraderPool.call`), before the grade's CPU clock starts: a cold
    build (arc_agi 0.66 s, group_anagrams 0.45 s, figlet_font 0.45 s here) is not charged to the 1 s of a grade whose
    scoring takes 0.1 ms (issue 49)."""
    key = (cls, repr(config))
    dataset = _worker_datasets.get(key)
    if dataset is None:
        if len(_worker_datasets) >= _WORKER_DATASETS_MAX:
            _worker_datasets.clear()
        dataset = _worker_datasets[key] = cls(config)
    return dataset


def _score_in_worker(cls: type, config: Any, answer: str, entry: dict) -> float:
    """In a grader worker (:mod:`envs.grader_process`): ``cls(config).score_answer(answer, entry)`` as a float, the
    dataset from :func:`_worker_dataset` (built by the call's preparation)."""
    return float(_worker_dataset(cls, config).score_answer(answer, entry))


def _judge(dataset: Any, task: str) -> Any:
    """The dataset whose ``score_answer`` judges ``task``'s items: the one task's, or the one a mix (the library's
    composite) dispatches them to (its ``score_answer`` forwards to ``datasets[source_dataset]``)."""
    datasets = getattr(dataset, "datasets", None)
    return datasets[task] if isinstance(datasets, dict) and task in datasets else dataset


register_worker_module(__name__)


def score(dataset: Any, text: str, entry: dict, task: str) -> tuple[float, dict]:
    """Grade a response with the library's ``dataset.score_answer(extracted, entry)``: the answer is extracted, then
    refused (0, with a reason) when it breaks the bounds (:func:`answer_guard`) or, for a task whose verifier evaluates
    text, its grammar (:func:`envs.reasoning_gym.answer_formats.check_format`); else the library scores it.

    Args:
        dataset: the library dataset whose ``score_answer`` judges (a composite one dispatches on the item).
        text: the model's response.
        entry: the item (``answer``, ``metadata``).
        task: the generator the item comes from (``metadata["source_dataset"]``): picks the grammar.

    Returns:
        ``(reward, grade)``: ``reward`` in ``[0, 1]``; ``grade`` holds ``extracted`` (``str | None``), the flags
        ``grader_timeout`` / ``grader_memory`` / ``grader_error`` (``bool``: the verifier ran past a bound of
        :mod:`envs.grader_process` or raised) and, when the response was refused, unreadable or the verifier failed,
        ``error`` (a non-empty ``str``: the env's ``action_error``; ``grader_<kind>: ...`` for a failed verifier).

    A library score within :data:`envs.contract.REWARD_TOLERANCE` outside ``[0, 1]`` is clamped (spell_backward's
    float sum gives 1.0000000000000002); one further outside is a library bug: 0 with ``grader_error``.
    """
    gold = str(entry["answer"])
    extracted = extract_answer(text, gold)
    if extracted is None:
        return 0.0, {"extracted": None, "error": "no answer could be read from the response (it is empty)",
                     **grader_flags()}
    refused = answer_guard(extracted, gold) or check_format(task, extracted, entry)
    if refused:
        return 0.0, {"extracted": extracted[:256], "error": refused, **grader_flags()}
    judge = _judge(dataset, task)
    reward, failure = grade(_score_in_worker, type(judge), judge.config, extracted, entry,
                            prepare=(_worker_dataset, (type(judge), judge.config)))
    if failure is not None:  # past a bound, or raised: the model's 0, not a crash
        return 0.0, {"extracted": extracted, "error": failure.action_error, **failure.flags()}
    reward, bad = checked_reward(reward)  # spell_backward's float sum gives 1.0000000000000002 for gold + "x": 1.0
    if bad is not None:  # further outside [0, 1]: a library bug, scored 0 as an observation (envs.contract, Graders)
        return 0.0, {"extracted": extracted, "error": bad, **grader_flags(GRADER_ERROR)}
    return reward, {"extracted": extracted, **grader_flags()}
