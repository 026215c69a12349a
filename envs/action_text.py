"""Make what a model emitted safe to store, parse and send back, before an env looks at it.

Every env family calls these on entry to ``step`` (issue 25: nothing a model emits can hang, crash or exhaust us):

- :func:`clean_text` / :func:`clean_value`: a lone UTF-16 surrogate (``"\\ud800"``; a model's tokenizer or a JSON
  escape can produce one) cannot be encoded as UTF-8, so a conversation holding one can never be sent back (the
  server answered HTTP 500 until reset). Lone surrogates become U+FFFD (the Unicode replacement character); a
  surrogate *pair* written as two code points becomes the one character it encodes.
- :func:`json_shape` / :func:`json_depth`: the one JSON scanner of the project, the server's (model text) and the
  client's (a server's reply, :mod:`envs.adapters.remote_env`) alike.
- :func:`loads_bounded`: ``json.loads`` recurses once per nesting level, so ~1,000 levels (a 2 KB string) raise
  ``RecursionError``; and whatever walks the decoded value afterwards (``json.dumps``, pydantic) recurses again. The
  nesting depth is measured on the text *before* decoding (vectorised, linear time) and a value nested deeper than
  :data:`MAX_JSON_DEPTH` is refused with :class:`UnusableJSON` (a ``ValueError``). So is an integer literal of
  more than 4,300 digits, which ``json.loads`` refuses with a plain ``ValueError`` (Python's int-to-str limit, not a
  ``JSONDecodeError``) and ``json.dumps`` could not write back.

Cost: linear in the length of the text, with numpy doing the per-character work (a few ms per MB).
"""
from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

__all__ = ["MAX_INT_BITS", "MAX_JSON_DEPTH", "UnusableJSON", "clean_text", "clean_value", "json_depth", "json_shape",
           "loads_bounded"]

#: Deepest nesting of lists/objects accepted in a tool call (the call object itself counts as one level). tau2's
#: tool arguments nest at most 3 levels; ``json.loads`` fails near 1,000.
MAX_JSON_DEPTH = 64

_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


#: Largest integer (in bits, ~4,200 decimal digits) a value may hold: Python refuses to convert larger ones to text.
MAX_INT_BITS = 14_000


class UnusableJSON(ValueError):
    """JSON text or a decoded value that cannot be used safely: nested deeper than the allowed depth, or holding an
    integer too long to convert (the model's error, not the caller's)."""


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (``"\\ufffd"``); other text unchanged.

    Two surrogate code points that form a valid pair (high then low) become the character they encode, as a UTF-16
    decoder would read them. Cost: one regex search when there is no surrogate (the common case).

    Args:
        text: any ``str``.

    Returns:
        A ``str`` that ``.encode("utf-8")`` accepts.
    """
    if _SURROGATE_RE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def clean_value(value: Any, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A copy of a decoded JSON-like value (``dict``/``list``/``tuple``/``str``/scalars) with :func:`clean_text`
    applied to every string, keys included; other objects are returned as they are.

    Args:
        value: the value (e.g. tool-call arguments given as a dict).
        max_depth: deepest nesting of containers accepted (a scalar is depth 0, ``{"a": 1}`` depth 1).

    Raises:
        UnusableJSON: ``value`` nests containers deeper than ``max_depth`` (found without recursing past it), or
            holds an ``int`` of more than :data:`MAX_INT_BITS` bits.
    """
    return _clean(value, max_depth, 0)


def _clean(value: Any, max_depth: int, depth: int) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise UnusableJSON(f"the value holds an integer of more than {MAX_INT_BITS} bits")
    if isinstance(value, (dict, list, tuple)):
        if depth >= max_depth:
            raise UnusableJSON(f"the value is nested deeper than {max_depth} levels")
        if isinstance(value, dict):
            return {_clean(k, max_depth, depth + 1): _clean(v, max_depth, depth + 1) for k, v in value.items()}
        return type(value)(_clean(v, max_depth, depth + 1) for v in value)
    return value


def json_shape(text: str) -> tuple[int, int]:
    """``(depth, containers)`` of a JSON text, read without decoding it: ``depth`` the largest count of ``[``/``{``
    not yet closed and ``containers`` the number of ``[``/``{``, both outside string literals (exact for valid
    JSON: the nesting ``json.loads`` reaches and the arrays + objects it builds; an upper bound on what it reaches
    before it fails on invalid JSON). A string left open at the end of the text runs to the end, as ``json.loads``
    reads it. Linear time, no regular expression and no recursion (two ``bytes.replace`` and numpy); transient
    memory at most ~10 bytes per byte of UTF-8 (a text of brackets only).

    Args:
        text: any ``str`` (lone surrogates included).

    Returns:
        ``(depth, containers)``, two ``int`` >= 0.
    """
    if text.count("[") + text.count("{") == 0:
        return 0, 0
    # Escapes first, with bytes.replace (C, left to right): a run of backslashes pairs up from its start, as JSON
    # reads it inside a string (outside one a backslash is an error where json.loads stops), then a backslash left
    # before a quote escapes it. What is left has no escaped quote: each quote opens or closes a string.
    raw = text.encode("utf-8", "surrogatepass").replace(b"\\\\", b"").replace(b'\\"', b"")
    codes = np.frombuffer(raw, dtype=np.uint8)
    inside = np.bitwise_xor.accumulate(codes == ord('"'))  # True from an opening quote to its closing one
    steps = _OPEN[codes]
    marks = steps[(steps != 0) & ~inside]  # the brackets outside strings, in order
    depth = int(np.cumsum(marks, dtype=np.int64 if marks.size >= 1 << 31 else np.int32).max(initial=0))
    return depth, int(np.count_nonzero(marks > 0))


def json_depth(text: str) -> int:
    """Upper bound on the nesting depth ``json.loads(text)`` would reach (exact for valid JSON): ``json_shape(text)[0]``
    (:func:`json_shape`). Linear time; no recursion."""
    return json_shape(text)[0]


def loads_bounded(text: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)`` with the nesting depth checked first and the strings of the result cleaned.

    Args:
        text: JSON text (a model's tool call or its arguments).
        max_depth: deepest nesting accepted.

    Returns:
        The decoded value, every string passed through :func:`clean_text` (a ``"\\ud800"`` escape decodes to a
        lone surrogate).

    Raises:
        UnusableJSON: nested deeper than ``max_depth`` (checked before decoding), or an integer literal too long
            to convert.
        json.JSONDecodeError: not valid JSON.
    """
    if text.count("[") + text.count("{") > max_depth and json_depth(text) > max_depth:
        raise UnusableJSON(f"the JSON is nested deeper than {max_depth} levels")
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError as e:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise UnusableJSON(f"the JSON holds a number that cannot be converted ({e})") from None
    return clean_value(value, max_depth)
