"""Digit sum as a one-step Gymnasium text environment (:class:`DigitSumEnv`, id ``DigitSum-v0``).

A small procedurally generated family: each problem asks for the sum of the decimal digits of a number, the numbers
are drawn from a seeded generator, and the answer is graded by a hand scanner (no regex, no ``eval``) over a bounded
window of the response. It exists to show an env family added through the registry (:mod:`envs.families`) in its own
folder; the contract it follows is :mod:`envs.contract`.
"""
from __future__ import annotations

import copy
import operator
from typing import Any

import gymnasium as gym
import numpy as np

from envs.action_text import clean_text
from envs.contract import STEP_AFTER_END, check_action, check_task_options
from envs.spaces import AssistantAction, ChatMessages

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
    ``numpy.random.default_rng(seed)`` (reproducible: the same arguments give the same list).

    Raises:
        ValueError: a split other than ``train``/``test``, ``size < 1``, digits outside ``1..MAX_NUMBER_DIGITS`` or
            ``min_digits > max_digits``, or a digit range too small to hold ``size`` distinct numbers of the split.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not (1 <= int(min_digits) <= int(max_digits) <= MAX_NUMBER_DIGITS) or int(size) < 1:
        raise ValueError(f"need size >= 1 and 1 <= min_digits <= max_digits <= {MAX_NUMBER_DIGITS}, got "
                         f"size={size}, min_digits={min_digits}, max_digits={max_digits}")
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


class DigitSumEnv(gym.Env):
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

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(self, split: str = "train", min_digits: int = 2, max_digits: int = 4, train_seed: int = 11,
                 test_seed: int = 22, train_size: int = 1000, test_size: int = 200,
                 system_prompt: str | None = DEFAULT_SYSTEM_PROMPT, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a string or None, got {system_prompt!r:.80}")
        seed, size = (train_seed, train_size) if split == "train" else (test_seed, test_size)
        self._numbers = generate_numbers(split, seed, size, min_digits, max_digits)
        self.split = split
        self.system_prompt = system_prompt or None
        self.render_mode = render_mode
        self.observation_space = ChatMessages()
        self.action_space = AssistantAction()
        self._index: int | None = None
        self._messages: list[dict] = []
        self._done = True
        self._started = False

    @property
    def num_tasks(self) -> int:
        """Number of problems in the split."""
        return len(self._numbers)

    @property
    def task_ids(self) -> list[str]:
        """``[str(i) for i in range(num_tasks)]``."""
        return [str(i) for i in range(len(self._numbers))]

    def usable_task_indices(self, limit: int | None = None) -> list[int]:
        """The first ``limit`` problem indices (``None``: all): every problem can be played."""
        n = len(self._numbers)
        return list(range(n if limit is None else min(int(limit), n)))

    @property
    def do_nothing_action(self) -> None:
        """``None``: no meaningful do-nothing baseline (an empty answer scores 0)."""
        return None

    def demonstration(self, options: dict | None) -> list[dict]:
        """The worked gold answer to the problem ``options`` picks (``"4 + 8 + 2 = 14\\n<answer>14</answer>"``),
        one assistant message; it scores 1.0.

        Raises:
            ValueError: options that pick no problem (as for ``reset``).
        """
        check_task_options(options)
        n = self._numbers[self._pick_index(options)]
        digits = str(n)
        return [{"role": "assistant", "content": f"{' + '.join(digits)} = {sum(map(int, digits))}\n"
                                                 f"<answer>{sum(map(int, digits))}</answer>"}]

    def _pick_index(self, options: dict | None) -> int:
        options = {} if options is None else options
        if not isinstance(options, dict):
            raise ValueError(f"options must be a dict, got {type(options).__name__}")
        index = options.get("index")
        if index is None and options.get("task_id") is not None:
            tid = options["task_id"]
            if not isinstance(tid, str) or not tid.isascii() or not tid.isdigit() or len(tid) > 12:
                raise ValueError(f"task_id must be an integer string, got {tid!r:.80}")
            index = int(tid)
        if index is None:
            return int(self.np_random.integers(len(self._numbers)))
        try:
            if isinstance(index, bool):
                raise TypeError
            index = operator.index(index)
        except TypeError:
            raise ValueError(f"options['index'] must be an int, got {index!r:.80}") from None
        if not 0 <= index < len(self._numbers):
            raise ValueError(f"options['index']={index} out of range for split {self.split!r} "
                             f"({len(self._numbers)} problems)")
        return index

    def _info(self) -> dict:
        return {"messages": copy.deepcopy(self._messages), "tools": [], "index": self._index,
                "task_id": str(self._index), "split": self.split,
                "answer": sum(map(int, str(self._numbers[self._index])))}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[list[dict], dict]:
        super().reset(seed=seed)
        self._index = self._pick_index(options)
        question = f"What is the sum of the digits of {self._numbers[self._index]}?"
        self._messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + [
            {"role": "user", "content": question}]
        self._done, self._started = False, True
        return copy.deepcopy(self._messages), self._info()

    def step(self, action: Any) -> tuple[list[dict], float, bool, bool, dict]:
        if not self._started:
            raise RuntimeError("DigitSumEnv.step() called before reset()")
        if self._done:
            raise RuntimeError(STEP_AFTER_END)
        check_action(action)  # TypeError before any state change
        text = clean_text(action if isinstance(action, str) else (action.get("content") or ""))
        self._done = True
        extracted, error = extract_answer(text)
        self._messages.append({"role": "assistant", "content": text})
        info = self._info()
        correct = extracted is not None and extracted == info["answer"]
        info.update(extracted=extracted, correct=correct, termination_reason="answered")
        if error is not None:
            info["action_error"] = error
        return [], 1.0 if correct else 0.0, True, False, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n\n".join(f"[{m['role']}]\n{m.get('content') or ''}" for m in self._messages)
