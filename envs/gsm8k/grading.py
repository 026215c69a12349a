"""Final-answer extraction and grading for GSM8K.

GSM8K (Cobbe et al., 2021, "Training Verifiers to Solve Math Word Problems", arXiv:2110.14168)
solutions end with a line ``#### <number>``; a problem is solved when the model's final number
equals that gold number. This module turns free-form model text into that number and scores it.

Reward scheme (:func:`gsm8k_reward`):

* ``1.0`` — the extracted final answer equals the gold number (numeric equality, see
  :func:`is_correct`);
* ``format_reward`` (default ``0.0``, i.e. off) — wrong, but the text ends in a well-formed final
  answer (:func:`has_final_answer_format`); the "format credit" of TorchRL's
  ``torchrl.envs.llm.GSM8KRewardParser`` (which grants it for an ``<answer>`` tag), here granted
  for the GSM8K ``####`` line, ``\\boxed{}`` or "The answer is N";
* ``0.0`` — otherwise.

Why correctness-only by default: with ``format_reward = 0`` the reward of an episode *is* its
graded accuracy, the evaluation metric, so no policy can raise its expected reward without
answering correctly more often (the verifiable reward of RLVR: Lambert et al. 2024, "Tulu 3",
arXiv:2411.15124, §6, reward only when the answer is verified correct, else 0). A group in which
nobody is correct has zero reward variance and gives no gradient, instead of a gradient towards
whatever earns partial credit.

Failure mode of the format credit (measured, ``benchmarks/results/gsm8k_qwen_run.md`` / issue 14):
a response cut off at ``max_new_tokens`` while still reasoning has no final answer and scores 0,
while a one-line wrong guess ``#### 450`` scores ``format_reward``. GRPO's group-relative advantage
then pushes the policy from reasoning to short guesses (Qwen2.5-Coder-0.5B, credit 0.1: greedy
accuracy 0.19 -> 0.01, mean response 236 -> 52 tokens in 10 steps). The grader cannot see
truncation; the trainer's ``episode/truncated_fraction`` and ``episode/response_tokens`` metrics (and
their warnings) are the guard. Enable the credit only for models that never produce the format at
all (e.g. SmolLM2-135M, where correctness alone gives no signal), with a length budget that lets
reasoning finish (watch ``episode/truncated_fraction``).

Numbers are compared as exact rationals (:class:`fractions.Fraction`) with a relative tolerance of
``1e-6``, never as strings, so ``"1,200"``, ``"$1200.00"`` and ``"1200"`` are the same answer.

Cost bound (issue 25): a number is converted only if it has at most :data:`MAX_DIGITS` digits (mantissa
and denominator each) and an exponent of at most :data:`MAX_EXPONENT` in absolute value, checked on the
text before any conversion; so every answer grades in microseconds. Only the last
:data:`MAX_GRADED_CHARS` characters of a response are read (every rule looks for the *last*
answer); the regex scans cost ~1 s per MB on a loaded machine, so a 1 MB response took 2-3 s. Unbounded, ``#### 1e-30000000``
built ``10**30000000`` through ``Decimal``/``Fraction`` for more than 6 minutes and ``#### 1e5000``
raised ``ValueError`` (an int of over 4,300 digits cannot be printed). A final answer out of range is
no answer: it scores 0 and ``gsm8k_reward`` reports ``out_of_range`` (no GSM8K answer has more than
a dozen digits).
"""
from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

__all__ = [
    "extract_answer",
    "normalize_number",
    "parse_gold",
    "is_correct",
    "has_final_answer_format",
    "gsm8k_reward",
    "MAX_DIGITS",
    "MAX_EXPONENT",
    "MAX_GRADED_CHARS",
]

#: Relative tolerance used by :func:`is_correct` (absolute below magnitude 1).
REL_TOL = 1e-6
#: A response is graded on its last this many characters (~5,000 tokens; longer answers are degenerate).
MAX_GRADED_CHARS = 20_000
#: Most digits a number (its mantissa, or its denominator) may have to be converted; more is out of range.
MAX_DIGITS = 100
#: Largest ``|exponent|`` of a number in scientific notation (``1e100``) that is converted; more is out of range.
MAX_EXPONENT = 100


_INT_BOUND = 10**MAX_DIGITS


class _OutOfRange(ValueError):
    """A number in the text exceeds :data:`MAX_DIGITS` / :data:`MAX_EXPONENT` (raised before converting it)."""

# Characters that mean "minus" in model output: ASCII hyphen, U+2212 MINUS SIGN, U+FE63 SMALL
# HYPHEN-MINUS, U+FF0D FULLWIDTH HYPHEN-MINUS.
_MINUS_CHARS = "\u2212\ufe63\uff0d"
_CURRENCY = "$€£¥₹"

# One number token: optional sign (only when not glued to a preceding word/digit, so "5-3" is not
# "-3"), optional currency, digits with optional thousands commas and decimals, optional "/den".
_NUMBER_RE = re.compile(
    r"(?P<sign>(?<![A-Za-z0-9_.)\]])-)?"
    r"(?:(?<![A-Za-z0-9_.])[" + re.escape(_CURRENCY) + r"]\s*)?"
    r"(?<![A-Za-z0-9_.])(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:(?P<exp>[eE][-+]?\d+)(?![A-Za-z]))?"
    r"(?:\s*/\s*(?P<den>\d+(?:\.\d+)?))?"
    r"(?![\d,]\d)"
)
_HASH_RE = re.compile(r"####")
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_RE = re.compile(r"[{}]")
_ANSWER_IS_RE = re.compile(
    r"(?:the\s+)?(?:final\s+)?answer\s+is\s*:?", re.IGNORECASE
)
_ANSWER_COLON_RE = re.compile(r"(?:final\s+)?answer\s*:", re.IGNORECASE)
# ``\frac{a}{b}`` is read by :func:`_replace_fracs` (a scanner), not by one pattern: the former
# ``\\[dt]?frac\s*\{\s*([^{}]*?)\s*\}\s*\{\s*([^{}]*?)\s*\}`` let ``\s*`` and ``[^{}]*?`` share every space, so
# ``\frac{`` plus 2,500 spaces took 9.4 s (cubic; hours at the 20,000-character window). Issue 34.
_FRAC_CMD_RE = re.compile(r"\\[dt]?frac")
_SPACES_RE = re.compile(r"\s*")
_TEXT_CMD_RE = re.compile(r"\\text\s*\{[^{}]*\}")


def _brace_group(text: str, i: int) -> tuple[str, int] | None:
    r"""``(content stripped, index after "}")`` of a ``\s*{...}`` group without inner braces at ``text[i:]``; else
    ``None``. Reads up to the next brace only."""
    i = _SPACES_RE.match(text, i).end()
    if i >= len(text) or text[i] != "{":
        return None
    close = _BRACE_RE.search(text, i + 1)
    if close is None or text[close.start()] != "}":
        return None
    return text[i + 1 : close.start()].strip(), close.end()


def _replace_fracs(text: str) -> str:
    r"""``\frac{a}{b}`` (also ``\dfrac``, ``\tfrac``; spaces allowed around the groups, none inside ``a``/``b``'s
    braces) -> ``a/b``, left to right, as ``re.sub`` of the pattern above would. Linear: each candidate reads its
    groups up to the next brace, and the next candidate's ``{`` stops the read of the one before."""
    out, pos = [], 0
    while True:
        m = _FRAC_CMD_RE.search(text, pos)
        if m is None:
            break
        num = _brace_group(text, m.end())
        den = _brace_group(text, num[1]) if num is not None else None
        if den is None:
            out.append(text[pos : m.start() + 1])
            pos = m.start() + 1
            continue
        out.append(text[pos : m.start()])
        out.append(f"{num[0]}/{den[0]}")
        pos = den[1]
    out.append(text[pos:])
    return "".join(out)


def _clean(text: str) -> str:
    """Undo LaTeX and unicode spellings of numbers so that one regex can read them. Linear in ``len(text)``."""
    for ch in _MINUS_CHARS:
        text = text.replace(ch, "-")
    text = text.replace("{,}", ",").replace("\\,", "").replace("\\!", "")
    text = text.replace("\\$", "$").replace("\\%", "%")
    if "frac" in text:
        text = _replace_fracs(text)
    return text


def _check_size(num: str, exp: str | None, den: str | None) -> None:
    """Raise :class:`_OutOfRange` unless the number's text is within the bounds (no conversion done)."""
    # ``num`` is digits, thousands commas and at most one ".", ``den`` digits and at most one "." (_NUMBER_RE)
    if len(num) - num.count(",") - num.count(".") > MAX_DIGITS or (
        den is not None and len(den) - den.count(".") > MAX_DIGITS
    ):
        raise _OutOfRange(f"more than {MAX_DIGITS} digits")
    if exp is not None:
        digits = exp[1:].lstrip("+-").lstrip("0")
        if len(digits) > len(str(MAX_EXPONENT)) or (digits and int(digits) > MAX_EXPONENT):
            raise _OutOfRange(f"an exponent beyond +-{MAX_EXPONENT}")


def _to_fraction(
    sign: str | None, num: str, exp: str | None, den: str | None
) -> Fraction | None:
    """The number's value; ``None`` if it is invalid (``x/0``).

    Raises:
        _OutOfRange: more than :data:`MAX_DIGITS` digits or ``|exponent| > MAX_EXPONENT`` (checked first).
    """
    _check_size(num, exp, den)
    try:
        value = Fraction(Decimal(num.replace(",", "") + (exp or "")))
        if den is not None:
            d = Fraction(Decimal(den))
            if d == 0:
                return None
            value /= d
    except (InvalidOperation, ValueError, ZeroDivisionError):
        return None
    return -value if sign else value


def _format_fraction(value: Fraction) -> str:
    """Canonical string: integers as ``"12"``, terminating decimals as ``"0.75"``, else ``"1/3"``."""
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den != 1:  # non-terminating decimal: keep exact
        return f"{value.numerator}/{value.denominator}"
    text = format(Decimal(value.numerator) / Decimal(value.denominator), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _match_number(m: re.Match) -> str | None:
    """Canonical string of one ``_NUMBER_RE`` match; ``None`` if invalid (e.g. ``x/0``)."""
    value = _to_fraction(m.group("sign"), m.group("num"), m.group("exp"), m.group("den"))
    return None if value is None else _format_fraction(value)


def _first_number(text: str) -> str | None:
    """The first valid number in ``text`` (already cleaned)."""
    for m in _NUMBER_RE.finditer(text):
        num = _match_number(m)
        if num is not None:
            return num
    return None


def _last_number(text: str) -> str | None:
    """The last valid number in ``text`` (already cleaned); converts only from the end."""
    for m in reversed(list(_NUMBER_RE.finditer(text))):
        num = _match_number(m)
        if num is not None:
            return num
    return None


def normalize_number(s: str | int | float | None) -> str | None:
    """Canonical string form of one number written the way people and models write it.

    Accepts thousands commas (``"1,200"``), currency (``"$5"``), percent (``"50%"``), trailing
    ``.``/``.0``/zeros (``"72."``, ``"3.50"``), negatives with ASCII or unicode minus
    (``"−4"``), leading-dot decimals (``".5"``), simple fractions (``"3/4"``, ``\\frac{3}{4}``),
    scientific notation (``"1e3"``) and surrounding whitespace or a trailing unit word.

    Args:
        s: the text of one number (or an ``int``/``float``).

    Returns:
        ``"72"``, ``"-3.5"``, ``"0.75"`` (terminating decimals are written out), ``"1/3"``
        (exact fraction when the decimal does not terminate); ``None`` when ``s`` holds no
        number, its first number is out of range (more than :data:`MAX_DIGITS` digits or
        ``|exponent| >`` :data:`MAX_EXPONENT`; an ``int`` of more than :data:`MAX_DIGITS` digits
        too), or ``s`` is not a string/number.
    """
    if s is None or isinstance(s, bool):
        return None
    if isinstance(s, (int, float)):
        if isinstance(s, float) and not math.isfinite(s):
            return None
        if isinstance(s, int) and abs(s) >= _INT_BOUND:
            return None
        return _format_fraction(Fraction(Decimal(repr(s)) if isinstance(s, float) else s))
    if not isinstance(s, str):
        return None
    try:
        return _first_number(_clean(s))
    except _OutOfRange:
        return None


def _boxed_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of the contents of every closed ``\\boxed{...}``, by opening position.

    One pass with a brace stack, so the cost stays linear even with many unclosed boxes.
    """
    box_opens = {m.end() - 1 for m in _BOXED_RE.finditer(text)}  # index of each box's "{"
    if not box_opens:
        return []
    spans, stack = [], []
    for m in _BRACE_RE.finditer(text, min(box_opens)):
        pos = m.start()
        if text[pos] == "{":
            stack.append(pos)
        elif stack:
            start = stack.pop()
            if start in box_opens:
                spans.append((start + 1, pos))
    return sorted(spans)


def _after_marker(text: str, pattern: re.Pattern) -> str | None:
    """First number after the last occurrence of ``pattern`` that has one on its line.

    Markers are tried from the last; the number must sit between the marker and the end of its
    line. A stretch already scanned for a later marker on the same line is not scanned again, so
    the cost is linear in ``len(text)``.
    """
    scanned: tuple[int, int] | None = None  # (line end, start of the scanned stretch)
    for m in reversed(list(pattern.finditer(text))):
        line_end = text.find("\n", m.end())
        line_end = len(text) if line_end < 0 else line_end
        end = scanned[1] if scanned is not None and scanned[0] == line_end else line_end
        for n in _NUMBER_RE.finditer(text, m.end(), end):
            num = _match_number(n)
            if num is not None:
                return num
        scanned = (line_end, m.end())
    return None


def _hash_answer(text: str) -> str | None:
    return _after_marker(text, _HASH_RE)


#: Only the last boxes are examined (bounds the cost on degenerate, deeply nested output).
_MAX_BOXES = 64


def _boxed_answer(text: str) -> str | None:
    for start, end in reversed(_boxed_spans(text)[-_MAX_BOXES:]):
        content = _TEXT_CMD_RE.sub(" ", text[start:end])
        num = _first_number(content)
        if num is not None:
            return num
    return None


def extract_answer(text: str | None) -> str | None:
    """Extract the final numeric answer from model output or a GSM8K solution.

    Rules, first that yields a number wins:

    1. the last ``####`` followed by a number on its line (GSM8K's own format);
    2. the last ``\\boxed{...}`` holding a number (nested braces, ``\\frac{a}{b}``, ``\\text{}``
       units and ``{,}`` separators handled);
    3. the last "The (final) answer is N";
    4. the last "(Final) Answer: N";
    5. the last number anywhere in the text.

    Only the last :data:`MAX_GRADED_CHARS` characters are read.

    Args:
        text: model output (any length). Non-strings give ``None``.

    Returns:
        The answer normalized by :func:`normalize_number` (e.g. ``"1200"``), or ``None`` when
        the text contains no number or the number a rule picks is out of range (more than
        :data:`MAX_DIGITS` digits, ``|exponent| >`` :data:`MAX_EXPONENT`): an absurd final
        answer is no answer, not a cue to look at earlier numbers.
    """
    try:
        return _extract(text)
    except _OutOfRange:
        return None


def _extract(text: str | None) -> str | None:
    """:func:`extract_answer`, raising :class:`_OutOfRange` for an out-of-range answer."""
    if not isinstance(text, str) or not text:
        return None
    text = _clean(text[-MAX_GRADED_CHARS:])
    for rule in (
        _hash_answer,
        _boxed_answer,
        lambda t: _after_marker(t, _ANSWER_IS_RE),
        lambda t: _after_marker(t, _ANSWER_COLON_RE),
    ):
        ans = rule(text)
        if ans is not None:
            return ans
    return _last_number(text)


def has_final_answer_format(text: str | None) -> bool:
    """Whether ``text`` states its final answer in a recognised, well-formed way.

    True when a ``####`` marker, a ``\\boxed{}`` or "The (final) answer is" is followed by a
    parseable number (same parsing as :func:`extract_answer`). A bare trailing number or
    "Answer: N" does not count: the format credit rewards the format we ask for.

    Args:
        text: model output; non-strings give ``False``.
    """
    if not isinstance(text, str) or not text:
        return False
    text = _clean(text[-MAX_GRADED_CHARS:])
    try:
        return (
            _hash_answer(text) is not None
            or _boxed_answer(text) is not None
            or _after_marker(text, _ANSWER_IS_RE) is not None
        )
    except _OutOfRange:  # the stated answer is out of range: not a well-formed answer
        return False


def parse_gold(solution: str) -> str:
    """Gold final answer of a GSM8K reference solution (the number on its ``####`` line).

    Args:
        solution: the dataset's ``answer`` field, e.g. ``"...\\n#### 1,200"``.

    Returns:
        The normalized number, e.g. ``"1200"``.

    Raises:
        ValueError: ``solution`` is not a string, has no ``####`` line, or no number (within
            :data:`MAX_DIGITS` / :data:`MAX_EXPONENT`) after it.
    """
    if not isinstance(solution, str):
        raise ValueError(f"GSM8K solution must be a string, got {type(solution).__name__}")
    if "####" not in solution:
        raise ValueError(f"GSM8K solution has no '#### <number>' line: {solution[-80:]!r}")
    try:
        gold = _hash_answer(_clean(solution))
    except _OutOfRange as e:
        raise ValueError(f"GSM8K solution's answer is out of range ({e}): {solution[-80:]!r}") from None
    if gold is None:
        raise ValueError(f"GSM8K solution has no number after '####': {solution[-80:]!r}")
    return gold


def _value(s: str | int | float) -> Fraction | None:
    norm = normalize_number(s)
    return None if norm is None else Fraction(norm)


def is_correct(pred: str | int | float | None, gold: str | int | float) -> bool:
    """Numeric equality of a predicted and a gold answer.

    Both sides go through :func:`normalize_number`; they are equal when
    ``|pred - gold| <= 1e-6 * max(1, |gold|)`` (exact rational arithmetic, so ``"0.5"`` equals
    ``"1/2"``, ``"1,200"`` equals ``"1200.00"``).

    Args:
        pred: predicted answer; ``None`` or unparseable gives ``False``.
        gold: gold answer (a number string such as ``"72"``).

    Raises:
        ValueError: ``gold`` holds no number.
    """
    g = _value(gold)
    if g is None:
        raise ValueError(f"gold answer {gold!r} is not a number")
    if pred is None:
        return False
    p = _value(pred)
    if p is None:
        return False
    return abs(p - g) <= Fraction(REL_TOL) * max(Fraction(1), abs(g))


def gsm8k_reward(
    text: str | None, gold: str | int | float, format_reward: float = 0.0
) -> tuple[float, dict]:
    """Score one model response against a gold GSM8K answer.

    Args:
        text: the model's full response.
        gold: gold number (``"72"``), or a whole reference solution ending in ``#### N``.
        format_reward: reward for a wrong answer stated in a well-formed final-answer format;
            default ``0.0`` (correctness-only). TorchRL's ``GSM8KRewardParser`` uses 0.1; see the
            module docstring for why that credit is off here and how it can be reward-hacked.

    Returns:
        ``(reward, info)``: reward is ``1.0``, ``format_reward`` or ``0.0``; info holds
        ``extracted`` (str | None), ``correct`` (bool), ``formatted`` (bool), ``answer`` (the
        normalized gold), ``out_of_range`` (bool: the answer a rule picked had more than
        :data:`MAX_DIGITS` digits or ``|exponent| >`` :data:`MAX_EXPONENT`, so ``extracted`` is
        ``None`` and the reward 0). Never raises because of ``text``.

    Raises:
        ValueError: ``gold`` holds no number.
    """
    if isinstance(gold, str) and "####" in gold:
        gold_norm = parse_gold(gold)
    else:
        gold_norm = normalize_number(gold)
        if gold_norm is None:
            raise ValueError(f"gold answer {gold!r} is not a number")
    try:
        extracted, out_of_range = _extract(text), False
    except _OutOfRange:
        extracted, out_of_range = None, True
    correct = is_correct(extracted, gold_norm)
    formatted = has_final_answer_format(text)
    reward = 1.0 if correct else (float(format_reward) if formatted else 0.0)
    return reward, {
        "extracted": extracted,
        "correct": correct,
        "formatted": formatted,
        "answer": gold_norm,
        "out_of_range": out_of_range,
    }
