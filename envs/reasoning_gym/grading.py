"""Answer extraction from model text, and the bounds put on it before the library's ``score_answer`` sees it.

Extraction (:func:`extract_answer`), on the last :data:`MAX_TEXT_CHARS` characters of the response only:

1. the content of the last ``<answer>...</answer>`` block (stripped), if there is one -- the format of the
   library's own prompts (``reasoning_gym.utils.extract_answer``, same regex);
2. else, when the gold answer is a number (``-12``, ``3.5``, ``1,000``), the last number in the text;
3. else the last non-empty line (stripped);
4. else (empty / whitespace text) nothing: ``None``, which scores 0.

Why not tags only: with SmolLM2-135M-Instruct and a system prompt asking for "the final answer alone on the last
line", answer-tag-only extraction scored 0 on every task tried, tag / last number / last line scored 0.58 greedy
on 1-digit ``products`` (a throwaway probe recorded in issue 26).

Every model output is hostile, and some of the library's scorers convert or evaluate the answer (``Decimal``,
``int(s, 0)``, ``eval``, sympy's ``parse_expr`` in countdown / puzzle24). So before any conversion
(:func:`answer_guard`), an extracted answer scores 0 (with a reason) when it holds

* a run of more than ``max(MAX_DIGITS, longest digit run of the gold answer)`` digits;
* brackets nested deeper than ``max(MAX_NESTING, the gold answer's depth)``;
* a scientific exponent (``1e100000000``) or a power exponent (``9**99999``, ``2^99999``) above
  :data:`MAX_EXPONENT`, or a power of a power (``9**9**9``, ``(9**9)**9``) when the gold answer has none.

The library's score is then taken as it is (never re-written): e.g. chain_sum / products compare with ``Decimal``
after removing commas and give ``len(gold) / len(answer)`` partial credit when the gold string occurs inside a
wrong answer (``"15"`` for gold ``"5"`` scores 0.5); an exception inside a scorer scores 0 (with a reason).
"""
from __future__ import annotations

import re
from typing import Any

from envs.action_text import clean_text

__all__ = ["MAX_TEXT_CHARS", "MAX_DIGITS", "MAX_NESTING", "MAX_EXPONENT", "extract_answer", "answer_guard",
           "score"]

#: Only the last this many characters of a response are read (the final answer is at its end).
MAX_TEXT_CHARS = 4096
#: Longest run of digits an answer may hold (or the gold answer's longest run, if longer).
MAX_DIGITS = 64
#: Deepest bracket nesting an answer may hold (or the gold answer's, if deeper).
MAX_NESTING = 32
#: Largest exponent (scientific ``e`` or ``**`` / ``^``) an answer may write.
MAX_EXPONENT = 100

_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?![\w])")
_NUMERIC_GOLD = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
_DIGIT_RUN = re.compile(r"\d+")
_SCI_EXP = re.compile(r"\d\.?\s*[eE]\s*[-+]?\s*(\d+)")
_POW_EXP = re.compile(r"(?:\*\*|\^)\s*[-+]?\s*\(?\s*[-+]?\s*(\d+)")
_POW_OF_POW = re.compile(r"(?:\*\*|\^)\s*[-+]?\s*\(?\s*[-+]?\s*[\w.]+\s*\)?\s*(?:\*\*|\^)|\)\s*(?:\*\*|\^)")


def is_numeric(gold: str) -> bool:
    """Whether the gold answer is a plain number (``-12``, ``3.5``, ``1,000``): extraction then takes the last number."""
    return _NUMERIC_GOLD.fullmatch(gold.strip()) is not None


def extract_answer(text: str, gold: str) -> str | None:
    """The answer read from a response (the rules in the module docstring); ``None`` when there is none.

    Cost: linear in ``min(len(text), MAX_TEXT_CHARS)`` (the tag regex is quadratic in the number of ``<answer>``
    openings within that window, at most ~500).
    """
    window = clean_text(text[-MAX_TEXT_CHARS:])
    tags = _ANSWER_TAG.findall(window)
    if tags:
        return tags[-1].strip()
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


def answer_guard(answer: str, gold: str) -> str | None:
    """Why ``answer`` is refused before scoring (a ``str``), or ``None`` when it may be scored. Linear in its length;
    converts nothing longer than 4 digits (exponents are compared as digit strings first)."""
    digits = max(MAX_DIGITS, _longest_run(gold))
    if _longest_run(answer) > digits:
        return f"answer holds a number with more than {digits} digits; scored 0 without converting it"
    nesting = max(MAX_NESTING, _depth(gold))
    if _depth(answer) > nesting:
        return f"answer nests brackets deeper than {nesting}; scored 0 without parsing it"
    for pattern in (_SCI_EXP, _POW_EXP):
        for exp in pattern.findall(answer):
            exp = exp.lstrip("0") or "0"
            if len(exp) > 4 or int(exp) > MAX_EXPONENT:
                return f"answer writes an exponent above {MAX_EXPONENT}; scored 0 without evaluating it"
    if _POW_OF_POW.search(answer) and not _POW_OF_POW.search(gold):
        return "answer raises a power to a power; scored 0 without evaluating it"
    return None


def score(dataset: Any, text: str, entry: dict) -> tuple[float, dict]:
    """Grade a response with the library's ``dataset.score_answer(extracted, entry)``.

    Returns:
        ``(reward, grade)``: ``reward`` in ``[0, 1]``; ``grade`` holds ``extracted`` (``str | None``) and, when the
        response was refused or unreadable, ``error`` (a non-empty ``str``: the env's ``action_error``).
    """
    gold = str(entry["answer"])
    extracted = extract_answer(text, gold)
    if extracted is None:
        return 0.0, {"extracted": None, "error": "no answer could be read from the response (it is empty)"}
    refused = answer_guard(extracted, gold)
    if refused:
        return 0.0, {"extracted": extracted[:256], "error": refused}
    try:
        reward = float(dataset.score_answer(extracted, entry))
    except Exception as e:  # noqa: BLE001 -- a scorer's failure on a model's text is the model's 0, not a crash
        return 0.0, {"extracted": extracted, "error": f"the library's score_answer raised {type(e).__name__}: {e}"}
    if not 0.0 <= reward <= 1.0:  # every library scorer returns [0, 1]; anything else is a library bug
        raise RuntimeError(f"reasoning_gym score_answer returned {reward} outside [0, 1] for {entry['metadata']}")
    return reward, {"extracted": extracted}
