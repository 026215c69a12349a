"""The contract plumbing of a one-turn text env (:class:`SingleTurnTextEnv`): the policy answers once, the answer is
graded, the episode ends.

A subclass keeps its data and its grading; this base does the rest of :mod:`envs.contract` the same way for every
one-turn env (GSM8K-v1, IFEval-v0, ReasoningGym-v1): ``reset`` (task picked by ``options["index"]`` /
``options["task_id"]`` or drawn from ``np_random``; observation ``[system?, user]``), ``step`` (the step-order
errors, the action-space ``TypeError`` before any state change, lone surrogates cleaned, ``[]`` observation,
``terminated=True``, ``termination_reason="answered"``, ``action_error`` when the grader names one; whatever
``_grade`` raises, ``KeyboardInterrupt`` aside, and a reward outside ``[0, 1]`` are observations: reward 0,
``action_error`` and the ``grader_error`` flag, as :mod:`envs.contract`'s "Graders" says), the task
listing, ``do_nothing_action`` (``None``), ``info`` and ``render``.

What a subclass provides (call :meth:`_init_single_turn` in ``__init__``):

==========================  ============================================================================
``num_tasks``               the split's number of tasks (property)
``_prompt(index)``          the user message's text of task ``index``
``_grade(text)``            ``(reward, info additions, action_error or None)`` of the current task (``self._index``)
``_task_info(index)``       ``info`` keys of its own, after the contract's (default none)
``_task_index(task_id)``    ``options["task_id"]`` -> index (default: ``"0"``.. ``str(num_tasks - 1)``)
``_task_id(index)``         index -> task id (default ``str(index)``); ``task_ids`` lists them
``_usable``                 the indices it can play, ascending (default ``None``: all); ``reset`` refuses others
                            through :meth:`_check_usable`
``task_noun``               the plural naming a task in errors (``"problems"``, ``"prompts"``)
==========================  ============================================================================

``demonstration`` stays with the subclass (an env without demonstrations lacks the method, as the contract says);
:meth:`_pick_task` gives it the task ``options`` picks. This module never imports ``torchrl_grpo`` and applies no
regex.
"""
from __future__ import annotations

import copy
import operator
from typing import Any

import gymnasium as gym

from envs.action_text import clean_text
from envs.contract import (ACTION_ERROR, GRADER_ERROR, STEP_AFTER_END, call_grader, check_action, check_task_options,
                           checked_reward, grader_flags)
from envs.spaces import AssistantAction, ChatMessages

__all__ = ["SingleTurnTextEnv"]


class SingleTurnTextEnv(gym.Env):
    """A one-turn text env's contract plumbing (module docstring); subclasses hold data and grading."""

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    #: the plural naming a task in error messages
    task_noun = "problems"
    #: the indices the env can play, ascending; ``None``: all of them
    _usable: list[int] | None = None

    def _init_single_turn(self, split: str, system_prompt: str | None, render_mode: str | None) -> None:
        """Set the split, system prompt, render mode, spaces and the empty episode state.

        Raises:
            ValueError: ``render_mode`` not ``None``/``"ansi"``; ``system_prompt`` neither a string nor ``None``.
        """
        self._check_common_args(system_prompt, render_mode)
        self.split = split
        self.system_prompt = system_prompt or None
        self.render_mode = render_mode
        self.observation_space = ChatMessages()
        self.action_space = AssistantAction()
        self._index: int | None = None
        self._messages: list[dict] = []
        self._done = True
        self._started = False

    def _check_common_args(self, system_prompt: Any, render_mode: Any) -> None:
        """Raise ``ValueError`` for a ``render_mode`` other than ``None``/``"ansi"`` or a non-string system prompt
        (a subclass may call it before loading its data, so a bad argument fails before a slow load)."""
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a string or None, got {system_prompt!r:.80}")

    # ------------------------------------------------------------------ hooks
    @property
    def num_tasks(self) -> int:
        """Number of tasks in the split (valid ``index`` range is ``[0, num_tasks)``)."""
        raise NotImplementedError

    def _prompt(self, index: int) -> str:
        """The user message of task ``index``."""
        raise NotImplementedError

    def _grade(self, text: str) -> tuple[float, dict, str | None]:
        """Grade ``text`` (cleaned) on the current task: ``(reward in [0, 1], info additions, action_error)``."""
        raise NotImplementedError

    def _task_info(self, index: int) -> dict:
        """``info`` keys of the subclass for task ``index`` (after the contract's keys)."""
        return {}

    def _task_id(self, index: int) -> str:
        """The id of task ``index`` (``str(index)``)."""
        return str(index)

    def _task_index(self, task_id: Any) -> int:
        """The index ``options["task_id"]`` names: the id is ``str(index)`` exactly (ASCII digits, no sign, no
        white space, no leading zero), so ``"٣"``, ``"１"``, ``"0001"`` and ``" 1"`` name no task (issue 42: they
        were read as 3 and 1).

        Raises:
            ValueError: not one of ``"0"`` .. ``str(num_tasks - 1)``.
        """
        n = self.num_tasks
        canonical = (isinstance(task_id, str) and 0 < len(task_id) <= len(str(n)) and task_id.isascii()
                     and task_id.isdigit() and (task_id == "0" or task_id[0] != "0"))
        if not canonical or int(task_id) >= n:
            raise ValueError(f"task_id {task_id!r:.40} is not in split {self.split!r} (ids '0'..'{n - 1}', written "
                             f"as str(index))")
        return int(task_id)

    def _check_usable(self, index: int) -> None:
        """Raise ``ValueError`` when task ``index`` (in range) cannot be played (default: every task can)."""

    # ------------------------------------------------------------------ task listing (env contract)
    @property
    def task_ids(self) -> list[str]:
        """The tasks' ids in index order."""
        return [self._task_id(i) for i in range(self.num_tasks)]

    def usable_task_indices(self, limit: int | None = None) -> list[int]:
        """The first ``limit`` (``None``: all) indices of the tasks this env can play, ascending."""
        usable = range(self.num_tasks) if self._usable is None else self._usable
        return list(usable if limit is None else usable[: max(0, int(limit))])

    @property
    def do_nothing_action(self) -> None:
        """``None``: no meaningful do-nothing baseline (an empty answer scores 0)."""
        return None

    def _pick_task(self, options: dict | None) -> int:
        """The task index ``options`` names, for ``demonstration``.

        Raises:
            ValueError: options naming no task, or bad options (as for ``reset``).
        """
        check_task_options(options)
        return self._pick_index(options)

    def _pick_index(self, options: dict | None) -> int:
        options = {} if options is None else options
        if not isinstance(options, dict):
            raise ValueError(f"options must be a dict, got {type(options).__name__}")
        index = options.get("index")
        if index is None and options.get("task_id") is not None:
            index = self._task_index(options["task_id"])
        if index is None:
            if self._usable is None:
                return int(self.np_random.integers(self.num_tasks))
            return self._usable[int(self.np_random.integers(len(self._usable)))]
        try:
            if isinstance(index, bool):
                raise TypeError
            index = operator.index(index)  # int or numpy integer; not float / str
        except TypeError:
            raise ValueError(f"options['index'] must be an int, got {index!r}") from None
        if not 0 <= index < self.num_tasks:
            raise ValueError(f"options['index']={index} out of range for split {self.split!r} "
                             f"({self.num_tasks} {self.task_noun})")
        self._check_usable(index)
        return index

    def _info(self) -> dict:
        return {"messages": copy.deepcopy(self._messages), "tools": [], "index": self._index,
                "task_id": self._task_id(self._index), "split": self.split, **self._task_info(self._index)}

    # ------------------------------------------------------------------ Gymnasium API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[list[dict], dict]:
        super().reset(seed=seed)
        self._index = self._pick_index(options)
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": self._prompt(self._index)})
        self._messages = messages
        self._done = False
        self._started = True
        return copy.deepcopy(messages), self._info()

    def step(self, action: Any) -> tuple[list[dict], float, bool, bool, dict]:
        if not self._started:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset()")
        if self._done:
            raise RuntimeError(STEP_AFTER_END)
        check_action(action)  # TypeError before any state change: the episode is left as it was
        text = clean_text(action if isinstance(action, str) else (action.get("content") or ""))
        graded, failure = call_grader(self._grade, text)  # whatever the grader raises is an observation
        if failure is None:
            reward, grade, error = graded
            reward, bad_reward = checked_reward(reward)
            if bad_reward is not None:
                reward, grade, error = 0.0, {**grade, **grader_flags(GRADER_ERROR)}, bad_reward
        else:
            error = failure.pop(ACTION_ERROR)
            reward, grade = 0.0, failure
        self._done = True
        self._messages.append({"role": "assistant", "content": text})
        info = self._info()
        info.update(grade)
        info["termination_reason"] = "answered"
        if error is not None:
            info["action_error"] = error
        return [], reward, True, False, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n\n".join(f"[{m['role']}]\n{m.get('content') or ''}" for m in self._messages)
