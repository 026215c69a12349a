"""GSM8K as a one-step Gymnasium text environment (:class:`GSM8KEnv`, id ``GSM8K-v1``).

The episode is one turn: the policy answers, the answer is graded with
:func:`envs.gsm8k.grading.gsm8k_reward` (1.0 correct / ``format_reward``, default 0, well-formed
but wrong / 0.0), and the episode terminates. The class docstring is the spec, in Gymnasium's
sections; the contract shared by all envs is :mod:`envs.contract`.
"""
from __future__ import annotations

import os
import re
from typing import Any

from .data import load_gsm8k
from .grading import MAX_DIGITS, MAX_EXPONENT, gsm8k_reward, normalize_number, parse_gold
from envs.single_turn import SingleTurnTextEnv

__all__ = ["GSM8KEnv", "DEFAULT_SYSTEM_PROMPT", "UNREADABLE_ANSWER", "OUT_OF_RANGE_ANSWER"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful math tutor. Solve the grade-school math word problem step by step, "
    "showing your reasoning. Finish with a final line of the form '#### <number>' containing "
    "only the numeric answer (no units)."
)

#: ``info["action_error"]`` of a response from which no final answer could be read.
UNREADABLE_ANSWER = "no final answer could be read from the response (expected a final line '#### <number>')"
#: ``info["action_error"]`` of a response whose final answer is a number out of range (see :mod:`envs.gsm8k.grading`).
OUT_OF_RANGE_ANSWER = (
    f"the final answer is a number out of range (more than {MAX_DIGITS} digits or an exponent beyond "
    f"+-{MAX_EXPONENT}); it scores 0"
)


def _problem_from_user(p: Any, i: int) -> dict:
    """Validate one user-supplied problem (``data=``) into ``{"question", "answer", "solution"}``."""
    if not isinstance(p, dict) or not isinstance(p.get("question"), str):
        raise ValueError(f"data[{i}] must be a dict with a string 'question', got {p!r:.80}")
    ans = p.get("answer")
    if isinstance(ans, str) and "####" in ans:
        gold = parse_gold(ans)
        solution = p.get("solution", ans)
    else:
        gold = normalize_number(ans)
        solution = p.get("solution", "")
    if gold is None:
        raise ValueError(f"data[{i}]['answer'] must hold a number, got {ans!r}")
    return {"question": p["question"], "answer": gold, "solution": solution}


class GSM8KEnv(SingleTurnTextEnv):
    """One GSM8K problem per episode, one step per episode (follows :mod:`envs.contract`).

    ## Description

    GSM8K (Cobbe et al., 2021, "Training Verifiers to Solve Math Word Problems",
    arXiv:2110.14168): 8.5k grade-school math word problems whose solutions end with a line
    ``#### <number>``. The policy reads a problem and answers once; the answer is graded against
    the gold number with :func:`envs.gsm8k.grading.gsm8k_reward` and the episode ends.

    ## Action Space

    :class:`~envs.spaces.AssistantAction`: the model's text, or ``{"role": "assistant",
    "content": text}`` (other keys such as ``tool_calls`` are ignored: the env has no tools). The
    whole text is the answer; its final number is extracted (``#### N``, ``\\boxed{N}``, "The answer
    is N", else the last number; see :func:`envs.gsm8k.grading.extract_answer`). A text from which no
    number can be read scores 0 and sets ``info["action_error"]`` (:data:`UNREADABLE_ANSWER`); so does
    a final answer out of range (more than :data:`~envs.gsm8k.grading.MAX_DIGITS` digits or an exponent
    beyond :data:`~envs.gsm8k.grading.MAX_EXPONENT`: :data:`OUT_OF_RANGE_ANSWER`; refused before any
    conversion, in microseconds). Lone UTF-16 surrogates in the text become U+FFFD
    (:func:`envs.action_text.clean_text`) before it is graded or stored, so the conversation can
    always be encoded. An
    action outside the space (``12345``, ``None``, a list, a dict with another role or non-string
    content) is a caller's bug: ``step`` raises ``TypeError`` and the episode goes on unchanged.

    ## Observation Space

    :class:`~envs.spaces.ChatMessages` (a list of OpenAI-format messages). On reset
    ``[system msg, user msg]`` (``[user msg]`` without a system prompt): the system prompt
    (:data:`DEFAULT_SYSTEM_PROMPT` asks for a final ``#### <number>`` line) and the question.
    The step returns ``[]``: nothing new is said after the answer.

    ## Rewards

    ``1.0`` if the extracted final answer equals the gold number (numeric equality: commas, ``$``,
    trailing ``.0``, ``####``, ``\\boxed{}``); ``format_reward`` (default ``0.0``) if it is wrong but
    ends in a well-formed final-answer line; ``0.0`` otherwise. With the default the reward *is* the
    graded accuracy, so it cannot be raised without being correct (why, and the failure mode of a
    format credit: :mod:`envs.gsm8k.grading`).

    ## Starting State

    ``reset(options={"index": i})`` (or ``{"task_id": "i"}``: a problem's id is ``str(i)``) picks
    problem ``i``; without options a problem is drawn from ``self.np_random`` (reproducible with
    ``seed``). ``num_tasks`` / ``task_ids`` list the split's problems; every problem is usable
    (:meth:`usable_task_indices`); there is no do-nothing baseline (``do_nothing_action is None``).

    ## Episode End

    Termination after the one step (``terminated=True``, ``truncated=False``,
    ``info["termination_reason"] == "answered"``). ``step`` again raises
    ``RuntimeError("episode has ended; call reset()")``; ``step`` before ``reset`` raises
    ``RuntimeError`` too.

    Info: on reset and step ``messages`` (the whole conversation, with the answer after the step),
    ``tools`` (``[]``), ``index``, ``task_id``, ``split``, ``answer`` (the gold number, for logging:
    do not show it to the policy); after the step also ``extracted``, ``correct``, ``formatted``,
    ``termination_reason`` and, for an unreadable answer, ``action_error``.

    ## Arguments

    Args:
        split: ``"train"`` or ``"test"``.
        data_dir: folder with ``{split}.jsonl[.gz]`` or an HF dataset id; default ``$GSM8K_DATA_DIR``,
            else the copy shipped in the package (see :func:`envs.gsm8k.data.load_gsm8k`). Ignored
            when ``data`` is given.
        system_prompt: system message prepended to each question; ``None`` or ``""`` to send
            the question alone.
        format_reward: reward for a wrong answer in a well-formed final-answer format; default
            ``0.0``: the reward is the graded accuracy (1 correct / 0 otherwise), so it cannot be
            raised without being correct. A credit > 0 helps only models that never produce the
            format (SmolLM2-135M) and can be hacked: a response cut off at the token limit while
            reasoning earns 0, a one-line wrong ``#### N`` earns the credit, so GRPO learns to stop
            reasoning (see :mod:`envs.gsm8k.grading`); watch the trainer's
            ``episode/truncated_fraction`` and ``episode/response_tokens`` when enabling it.
        data: optional list of problems (``{"question", "answer"}``; ``answer`` a number or a
            solution ending in ``#### N``), used instead of the files (tests, custom sets).
        render_mode: ``None`` or ``"ansi"`` (``render()`` returns the conversation as text).

    Raises:
        ValueError: bad ``split``/``data``/``options`` (bad index or task id) at construction or reset;
            a malformed data row (the message names ``file:line``).
        FileNotFoundError: ``data_dir`` / ``$GSM8K_DATA_DIR`` names no usable data (see
            :func:`~envs.gsm8k.data.load_gsm8k`).
        TypeError: ``step`` with an action outside the action space.
        RuntimeError: ``step`` before ``reset`` or after the episode ended.

    ## Example

    ```python
    >>> import gymnasium as gym, envs
    >>> gym.register_envs(envs)
    >>> env = gym.make("GSM8K-v1", split="test")          # the packaged data (or $GSM8K_DATA_DIR)
    >>> obs, info = env.reset(seed=0, options={"index": 3})
    >>> [m["role"] for m in obs]
    ['system', 'user']
    >>> obs, reward, terminated, truncated, info = env.step(f"... #### {info['answer']}")
    >>> reward, terminated, info["termination_reason"]
    (1.0, True, 'answered')

    ```

    ## Version History

    Policy (:mod:`envs`): the version is bumped whenever the reward semantics change; one bullet per version.

    - v0 (2026-11-22, 1ba233d): released: 1.0 if the extracted final answer equals the gold number, else
      ``format_reward`` (default 0.1) for a wrong answer in a well-formed final-answer format, else 0.0. No longer
      registered (``gym.make("GSM8K-v0")`` raises ``DeprecatedEnv`` naming GSM8K-v1).
    - v1 (2026-11-23, ad0c272): **default ``format_reward`` 0.0** (the 0.1 credit was reward-hacked, issue 14;
      ``format_reward=0.1`` gives v0's reward). Ran as "GSM8K-v0" until renamed 2026-11-26. Since: numbers over 100
      digits / ``|exponent|`` > 100 and anything before the last 20,000 characters are not graded (af2ed0e,
      de0c559: absurd answers score 0); an action outside the action space raises ``TypeError``.
    """

    def __init__(
        self,
        split: str = "train",
        data_dir: str | os.PathLike | None = None,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        format_reward: float = 0.0,
        data: list[dict] | None = None,
        render_mode: str | None = None,
    ):
        self._check_common_args(system_prompt, render_mode)
        if data is not None:
            if not isinstance(data, (list, tuple)) or not data:
                raise ValueError("data must be a non-empty list of problem dicts")
            self._problems = [_problem_from_user(p, i) for i, p in enumerate(data)]
        else:
            self._problems = load_gsm8k(split, data_dir)
        self.format_reward = float(format_reward)
        self._init_single_turn(split, system_prompt, render_mode)

    # ------------------------------------------------------------------ data and grading (SingleTurnTextEnv hooks)
    @property
    def num_tasks(self) -> int:
        """Number of problems in the loaded split (valid ``index`` range is ``[0, num_tasks)``)."""
        return len(self._problems)

    @property
    def num_problems(self) -> int:
        """Same as :attr:`num_tasks` (the GSM8K name)."""
        return len(self._problems)

    def demonstration(self, options: dict | None) -> list[dict]:
        """The gold answer for the problem ``options`` picks, as one assistant message: the dataset's worked
        solution with its calculator annotations (``<<48/2=24>>``) removed, ending in its ``#### N`` line (scores
        1.0). Supervised fine-tuning data for :mod:`torchrl_grpo.rollout.demonstrations`.

        Raises:
            ValueError: bad options (as for ``reset``), or options that pick no problem.
        """
        problem = self._problems[self._pick_task(options)]
        text = re.sub(r"<<[^<>]*>>", "", problem.get("solution") or f"#### {problem['answer']}")
        return [{"role": "assistant", "content": text}]

    def _prompt(self, index: int) -> str:
        return self._problems[index]["question"]

    def _task_info(self, index: int) -> dict:
        return {"answer": self._problems[index]["answer"]}

    def _grade(self, text: str) -> tuple[float, dict, str | None]:
        reward, grade = gsm8k_reward(text, self._problems[self._index]["answer"], format_reward=self.format_reward)
        error = None
        if grade["extracted"] is None:
            error = OUT_OF_RANGE_ANSWER if grade["out_of_range"] else UNREADABLE_ANSWER
        return float(reward), grade, error
