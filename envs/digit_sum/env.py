"""Digit sum as a one-step Gymnasium text environment (:class:`DigitSumEnv`, id ``DigitSum-v0``).

A small procedurally generated family: each problem asks for the sum of the decimal digits of a number, the numbers
are drawn from a seeded generator, and the answer is graded by a hand scanner (no regex, no ``eval``) over a bounded
window of the response. It exists to show an env family added through the registry (:mod:`envs.families`) in its own
folder; the contract plumbing comes from :class:`envs.single_turn.SingleTurnTextEnv`, which follows
:mod:`envs.contract`.
"""
from __future__ import annotations

import numpy as np

from envs.single_turn import SingleTurnTextEnv
from envs.task_list_cache import cached_task_list

__all__ = ["DigitSumEnv", "DEFAULT_SYSTEM_PROMPT", "MAX_GRADED_CHARS", "MAX_ANSWER_DIGITS", "extract_answer",
           "generate_numbers", "split_of"]

DEFAULT_SYSTEM_PROMPT = ("Add up the decimal digits of the number you are given. Reason briefly, then give only the "
                         "sum as <answer>N</answer>.")
#: only the last this many characters of a response are graded (the answer comes at the end)
MAX_GRADED_CHARS = 2_000
#: an answer with more digits than this is out of range (a digit sum of a 40-digit number has at most 3)
MAX_ANSWER_DIGITS = 12
#: the largest ``max_digits`` a problem may have
MAX_NUMBER_DIGITS = 40
#: ``info["action_error"]`` values
UNREADABLE = "no answer could be read (expected <answer>N</answer> or a final integer)"
MALFORMED = "the <answer> tag does not hold an integer"
OUT_OF_RANGE = f"the answer has more than {MAX_ANSWER_DIGITS} digits"
_ASCII_DIGITS = frozenset("0123456789")
_OPEN, _CLOSE = "<answer>", "</answer>"


def split_of(n: int) -> str:
    """``"test"`` for a quarter of the integers, ``"train"`` for the rest: a multiplicative hash of ``n`` (Knuth's
    golden-ratio constant), so a number belongs to one split whatever the seeds (the splits never share a problem)."""
    return "test" if ((n * 0x9E3779B1) & 0xFFFFFFFF) >> 30 == 0 else "train"


def generate_numbers(split: str, seed: int, size: int, min_digits: int, max_digits: int) -> list[int]:
    """``size`` distinct integers of ``min_digits..max_digits`` digits in ``split``'s part, drawn by
    ``numpy.random.default_rng(seed)`` (reproducible: the same arguments give the same list; drawn once per
    arguments and kept in :mod:`envs.task_list_cache`, a new list each call).

    Raises:
        ValueError: a split other than ``train``/``test``, ``size < 1``, digits outside ``1..MAX_NUMBER_DIGITS`` or
            ``min_digits > max_digits``, or a digit range too small to hold ``size`` distinct numbers of the split.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not (1 <= int(min_digits) <= int(max_digits) <= MAX_NUMBER_DIGITS) or int(size) < 1:
        raise ValueError(f"need size >= 1 and 1 <= min_digits <= max_digits <= {MAX_NUMBER_DIGITS}, got "
                         f"size={size}, min_digits={min_digits}, max_digits={max_digits}")
    key = ("digit_sum", split, int(seed), int(size), int(min_digits), int(max_digits))  # envs.task_list_cache
    return list(cached_task_list(key, lambda: _draw_numbers(split, seed, size, min_digits, max_digits)))


def _draw_numbers(split: str, seed: int, size: int, min_digits: int, max_digits: int) -> list[int]:
    """:func:`generate_numbers`' draw (uncached, arguments checked)."""
    rng = np.random.default_rng(int(seed))
    seen: dict[int, None] = {}
    for _ in range(50 * int(size) + 1_000):
        k = int(rng.integers(int(min_digits), int(max_digits) + 1))
        first = str(int(rng.integers(1, 10))) if k > 1 else str(int(rng.integers(0, 10)))
        n = int(first + "".join(str(d) for d in rng.integers(0, 10, size=k - 1)))
        if split_of(n) == split:
            seen.setdefault(n, None)
            if len(seen) == size:
                return list(seen)
    raise ValueError(f"{min_digits}-{max_digits} digit numbers hold fewer than {size} distinct {split} problems; "
                     f"widen the digit range or lower the size")


def extract_answer(text: str) -> tuple[int | None, str | None]:
    """The integer a response answers, read from its last :data:`MAX_GRADED_CHARS` characters: the content of the
    last ``<answer>...</answer>`` (an optional sign and ASCII digits, surrounding whitespace allowed), else the last
    run of ASCII digits. Linear time: ``str.rfind`` and one reverse scan.

    Returns:
        ``(value, None)``, or ``(None, error)`` with error :data:`UNREADABLE`, :data:`MALFORMED` or
        :data:`OUT_OF_RANGE`.
    """
    window = text[-MAX_GRADED_CHARS:]
    start = window.rfind(_OPEN)
    if start >= 0:
        body = window[start + len(_OPEN):]
        end = body.find(_CLOSE)
        body = (body if end < 0 else body[:end]).strip()
        digits = body[1:] if body[:1] in ("-", "+") else body
        if not digits or not set(digits) <= _ASCII_DIGITS:
            return None, MALFORMED
        if len(digits) > MAX_ANSWER_DIGITS:
            return None, OUT_OF_RANGE
        return int(body), None
    end = len(window)
    while end > 0 and window[end - 1] not in _ASCII_DIGITS:
        end -= 1
    if end == 0:
        return None, UNREADABLE
    begin = end
    while begin > 0 and window[begin - 1] in _ASCII_DIGITS:
        begin -= 1
    if end - begin > MAX_ANSWER_DIGITS:
        return None, OUT_OF_RANGE
    return int(window[begin:end]), None


class DigitSumEnv(SingleTurnTextEnv):
    """One digit-sum problem per episode, one step per episode (follows :mod:`envs.contract`).

    ## Description

    "What is the sum of the digits of 48213?" -- gold 18. The numbers have ``min_digits..max_digits`` digits and are
    drawn by a seeded generator (:func:`generate_numbers`); a multiplicative hash of the number puts it in train
    (3/4) or test (1/4) (:func:`split_of`), so the splits never share a problem whatever the seeds.

    ## Action Space

    :class:`~envs.spaces.AssistantAction`: the model's text, or ``{"role": "assistant", "content": text}``. The
    answer is the content of the last ``<answer>...</answer>`` in the last :data:`MAX_GRADED_CHARS` characters,
    else the last integer there (:func:`extract_answer`; no regex, no ``eval``). A response with no integer, a tag
    that holds no integer, or an answer of over :data:`MAX_ANSWER_DIGITS` digits scores 0 and sets
    ``info["action_error"]``. Lone surrogates become U+FFFD. An action outside the space raises ``TypeError`` and the
    episode goes on unchanged.

    ## Observation Space

    :class:`~envs.spaces.ChatMessages`. On reset ``[system msg, user msg]`` (``[user msg]`` without a system
    prompt); the step returns ``[]``.

    ## Rewards

    ``1.0`` if the answer equals the digit sum, else ``0.0``.

    ## Starting State

    ``reset(options={"index": i})`` or ``{"task_id": str(i)}`` picks problem ``i``; without options one is drawn
    from ``self.np_random``. Every problem is usable; ``do_nothing_action`` is ``None`` (an empty answer scores 0).
    ``demonstration(options)`` gives the worked gold answer (scores 1.0).

    ## Episode End

    Terminated after the one step (``info["termination_reason"] == "answered"``); ``step`` again, or before
    ``reset``, raises ``RuntimeError``. Info: ``messages``, ``tools`` (``[]``), ``index``, ``task_id``, ``split``,
    ``answer`` (the gold sum: do not show it to the policy); after the step ``extracted``, ``correct``,
    ``termination_reason`` and, for an unusable answer, ``action_error``.

    ## Arguments

    Args:
        split: ``"train"`` or ``"test"``.
        min_digits, max_digits: digits of the numbers (``1 <= min_digits <= max_digits <= 40``).
        train_seed, test_seed: the generator seed of each split.
        train_size, test_size: problems in each split.
        system_prompt: the system message; ``None`` or ``""`` for none.
        render_mode: ``None`` or ``"ansi"``.

    Raises:
        ValueError: bad arguments (:func:`generate_numbers`) or ``options``.
        TypeError: ``step`` with an action outside the action space.
        RuntimeError: ``step`` before ``reset`` or after the episode ended.

    ## Example

    ```python
    >>> import gymnasium as gym, envs
    >>> gym.register_envs(envs)
    >>> env = gym.make("DigitSum-v0", split="test", test_size=5)
    >>> obs, info = env.reset(seed=0, options={"index": 2})
    >>> [m["role"] for m in obs]
    ['system', 'user']
    >>> obs, reward, terminated, truncated, info = env.step(f"<answer>{info['answer']}</answer>")
    >>> reward, terminated, info["termination_reason"]
    (1.0, True, 'answered')

    ```

    ## Version History

    - v0 (2026-11-26): released: reward 1/0 on the digit sum read from ``<answer>`` or the last integer of the
      last 2,000 characters; hash-partitioned train/test numbers from seeded generators.
    """

    def __init__(self, split: str = "train", min_digits: int = 2, max_digits: int = 4, train_seed: int = 11,
                 test_seed: int = 22, train_size: int = 1000, test_size: int = 200,
                 system_prompt: str | None = DEFAULT_SYSTEM_PROMPT, render_mode: str | None = None):
        self._check_common_args(system_prompt, render_mode)
        seed, size = (train_seed, train_size) if split == "train" else (test_seed, test_size)
        self._numbers = generate_numbers(split, seed, size, min_digits, max_digits)
        self._init_single_turn(split, system_prompt, render_mode)

    @property
    def num_tasks(self) -> int:
        """Number of problems in the split."""
        return len(self._numbers)

    def demonstration(self, options: dict | None) -> list[dict]:
        """The worked gold answer to the problem ``options`` picks (``"4 + 8 + 2 = 14\\n<answer>14</answer>"``),
        one assistant message; it scores 1.0.

        Raises:
            ValueError: options that pick no problem (as for ``reset``).
        """
        digits = str(self._numbers[self._pick_task(options)])
        total = sum(map(int, digits))
        return [{"role": "assistant", "content": f"{' + '.join(digits)} = {total}\n<answer>{total}</answer>"}]

    def _prompt(self, index: int) -> str:
        return f"What is the sum of the digits of {self._numbers[index]}?"

    def _task_info(self, index: int) -> dict:
        return {"answer": sum(map(int, str(self._numbers[index])))}

    def _grade(self, text: str) -> tuple[float, dict, str | None]:
        extracted, error = extract_answer(text)
        correct = extracted is not None and extracted == self._task_info(self._index)["answer"]
        return 1.0 if correct else 0.0, {"extracted": extracted, "correct": correct}, error
