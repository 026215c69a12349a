"""The env contract: what every environment registered by :mod:`envs` promises a trainer.

This docstring is the specification; :class:`TextAgentEnv` states it as a ``typing.Protocol``
(``isinstance(env.unwrapped, TextAgentEnv)`` checks that the members exist) and
``tests/test_env_contract.py`` checks the behaviour on every registered id (``GSM8K-v1``, ``IFEval-v0``,
``tau2/{airline,retail,telecom,mock}-v0`` and any id added later under ``envs.``).

Usage::

    import gymnasium as gym, envs
    gym.register_envs(envs)
    env = gym.make("tau2/airline-v0", split="test", user="scripted")
    obs, info = env.reset(seed=0, options={"task_id": "3"})      # or {"index": i}; none: sampled
    obs, reward, terminated, truncated, info = env.step(model_text)

The contract members (``num_tasks``, ``task_ids``, ``usable_task_indices``, ``do_nothing_action``)
live on the env itself: ``gym.make`` wraps it and Gymnasium 1.x wrappers do not forward attributes,
so read them from ``env.unwrapped``.

Observation
    A ``list`` of OpenAI-format chat messages (``{"role", "content", "tool_calls"?,
    "tool_call_id"?, "name"?}``; :class:`envs.spaces.ChatMessages`): the messages that are *new*
    to the agent since its last action, in order. On reset: the system message (if the env has
    one) and the opening of the conversation (the user's question or customer's first message; a
    task's prior history when it has one), so that on reset ``obs == info["messages"]``. After a
    step: tool answers (one ``tool`` message per call, in call order) and/or the other party's
    reply; ``[]`` when nothing new is said (e.g. GSM8K's only step).

Action
    What the model produced: its raw text (``str``), or an assistant message dict
    (``{"role": "assistant"?, "content": str | None, "tool_calls": list?}``, ``arguments`` of a
    call as a JSON string or a dict; :class:`envs.spaces.AssistantAction`). Raw text is parsed
    the way the model family writes tool calls -- Hermes / Qwen ``<tool_call>{"name": ...,
    "arguments": ...}</tool_call>`` blocks, bare JSON ``{"name": ..., "arguments": ...}``, tau2's
    functional ``name(arg=...)`` -- and anything else is a message to the user
    (:mod:`envs.tau2.actions`); several calls in one action run in order. An env without tools
    (GSM8K) reads the whole text as its answer.

    Two kinds of bad action, told apart by type:

    * A *model's* mistake -- text (or an assistant dict) that cannot be used: a malformed tool
      call, an unknown tool, arguments that fail the tool's schema, an empty message, an answer
      from which no final answer can be read. It never raises: the env answers it as the task
      would (a tool error message starting with ``"Error"`` in the next ``obs``, no database
      change, counted in tau2's ``info["num_errors"]``; GSM8K scores it 0) and sets
      ``info["action_error"]`` (a non-empty ``str``) on that step.
    * A *caller's* bug -- an action outside the action space (``12345``, ``None``, a list, bytes,
      a dict whose role is not ``assistant``, non-string ``content``, non-list ``tool_calls``):
      ``step`` raises :class:`TypeError` (:func:`check_action`) and the episode is left exactly as
      it was, as if ``step`` had not been called. No model produces such a value, so scoring it
      would hide a bug in the trainer.

Cost (issue 25: nothing a model emits can hang, crash or exhaust us)
    Every input a model can emit is hostile, so a step's cost is bounded whatever the action holds
    (a 1 MB string, JSON nested 5,000 deep, ``9**9**9``, ``1e-30000000``, lone surrogates): each env
    bounds the work *before* parsing, converting or evaluating (tau2: JSON depth
    :data:`envs.action_text.MAX_JSON_DEPTH`, no ``**`` in ``calculate``; GSM8K: numbers of at most
    100 digits and ``|exponent| <= 100``, the last 20,000 characters graded), and lone UTF-16
    surrogates become U+FFFD on entry (:func:`envs.action_text.clean_text`), so ``obs`` and ``info``
    always encode as UTF-8. Checked on every registered id by ``tests/test_env_hardening.py``:
    no exception but the ``TypeError`` below, every ``step`` under :data:`STEP_TIME_BOUND_S` seconds
    on a loaded 2-core machine (milliseconds in practice, plus the user simulator's own time for an
    LLM customer, which is not the model's input), no database change from a malformed call.

Graders (issue 42: every error inside a grader is an observation, never a raise)
    Code we do not own judges the model's text (reasoning-gym's ``score_answer``, if-verifiable's checkers, sympy,
    tau2's evaluator), and it may raise anything on hostile text: ``IndexError`` on a one-character answer,
    ``LookupError`` for missing NLTK data, ``RecursionError``, ``MemoryError``, ``SystemExit`` or a library's own
    ``BaseException`` subclass; and the grader worker (:mod:`envs.grader_process`) may stop it past a bound.
    Whatever happens, ``step`` returns an observation: the episode ends as the grading step would have ended it,
    reward ``0.0``, ``info["action_error"]`` = ``"<kind>: <what happened>"`` (for a raise: the exception's type
    and message) and the ``info`` flag of that kind ``True`` (:data:`GRADER_FAILURE_KINDS`: ``grader_timeout``,
    ``grader_memory``, ``grader_error``; :func:`grader_flags`), so a run can count them. Only
    ``KeyboardInterrupt`` is re-raised (the operator stopping the process). A grader's reward outside ``[0, 1]``
    is clamped when within :data:`REWARD_TOLERANCE` of it (a float sum's 1.0000000000000002) and is otherwise a
    ``grader_error`` observation too (:func:`checked_reward`). One implementation, :func:`call_grader`, used by
    :class:`envs.single_turn.SingleTurnTextEnv` and tau2's episode end; ``tests/test_grader_errors.py`` checks it
    on every registered id, in-process and through ``python -m envs.serve`` (a 200, never a 500).

Reward
    ``0.0`` on every step before the episode ends; on the final step a ``float`` in ``[0, 1]``
    (GSM8K: 1 correct / ``format_reward`` / 0; IFEval: the fraction of the prompt's instructions
    followed; tau2: tau2's own reward, or the partial-progress reward with ``reward="partial"``).

``terminated`` / ``truncated``
    ``terminated``: the episode reached an end of the task itself (the agent answered or stopped,
    the customer stopped or was transferred, an agent error, too many tool errors).
    ``truncated``: cut by a step limit (tau2's ``max_steps``) with no ending of its own; the
    reward is still the task's (0 for tau2, as tau2 scores ``max_steps``). Exactly one of the two is
    ``True`` on the final step, neither before.

Info (every ``reset`` and ``step``; :data:`INFO_KEYS`)
    ``messages`` the whole agent-visible conversation so far (list of chat messages); ``tools``
    the OpenAI tool schemas offered to the agent (``[]`` for an env without tools);
    ``task_id`` (``str``, the id ``reset(options={"task_id": ...})`` accepts); ``index`` (``int``,
    the task's position, ``task_ids[index] == task_id``); ``split``. On the final step also
    ``termination_reason`` (``str``; GSM8K ``"answered"``, tau2 its ``TerminationReason`` value).
    ``action_error`` (``str``) on a step whose action was unusable (above); absent otherwise.
    ``grader_timeout`` / ``grader_memory`` / ``grader_error`` (``bool``) on a step whose grader failed, the one of
    its kind ``True`` (see "Graders"); envs whose graders run in the worker set them on every graded step.
    Envs add their own keys (GSM8K ``answer``/``extracted``/``correct``; tau2 ``num_errors``,
    ``reward_info``, ...). Not an env key: the trainer's collector records ``info["error"]`` when an
    env *raised*, which is an infrastructure failure, not an ``action_error``.

Step order
    ``step`` before the first ``reset`` raises :class:`RuntimeError`. ``step`` after the episode
    ended raises ``RuntimeError("episode has ended; call reset()")`` (:data:`STEP_AFTER_END`), as
    Gymnasium's own envs do (they warn; ours raise, because a trainer that steps a finished
    episode has a bookkeeping bug). ``reset`` may be called at any time.

Tasks
    A task is one problem / scenario an episode is played on. ``num_tasks`` (``int``) and
    ``task_ids`` (``list[str]``, length ``num_tasks``, unique, index order) list them for the env's
    split; ``reset(options={"index": i})`` and ``reset(options={"task_id": task_ids[i]})`` start
    the same task (GSM8K's ids are ``str(index)``). Without options a task is drawn from the env's
    ``np_random`` (reproducible with ``seed``).

Training hooks (env-specific behaviour a trainer needs, kept behind the contract)
    ``usable_task_indices(limit=None) -> list[int]``: the first ``limit`` (all with ``None``) task
    indices, ascending, that this env *as configured* can play; ``reset`` on any other index raises
    ``ValueError``. tau2 drops tasks it cannot run in solo mode (customer turns in their history);
    GSM8K: all tasks.
    ``do_nothing_action``: an action that ends the episode at once without doing anything, whose
    reward is the floor a trained policy must beat (tau2: a call to its ``done`` tool; some tau2
    tasks need no change, so it scores ~0.38 on airline); ``None`` when the env has no meaningful
    do-nothing baseline (GSM8K: an empty answer always scores 0).
    ``demonstration(options) -> list[dict]`` (optional): the assistant messages of a successful episode on
    the task ``options`` picks, for supervised fine-tuning before RL (tau2: the task's gold actions as
    tool calls and the stop; GSM8K: the worked solution). An env without demonstrations lacks the method.

Where we diverge from Gymnasium, and why
    Observations and actions are Python objects (chat messages, text), not arrays: the spaces in
    :mod:`envs.spaces` are non-numpy (``shape is None``); ``envs.adapters.torchrl_env.TextEnv`` carries them as
    TorchRL non-tensor data. Invalid actions raise :class:`TypeError` where Gymnasium leaves them
    undefined (its checker asserts ``action in action_space`` only in debug wrappers).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Protocol, runtime_checkable

from gymnasium import Space

__all__ = ["ACTION_ERROR", "END_INFO_KEYS", "GRADER_ERROR", "GRADER_FAILURE_KINDS", "INFO_KEYS", "REWARD_TOLERANCE",
           "STEP_AFTER_END", "STEP_TIME_BOUND_S", "TextAgentEnv", "call_grader", "check_action", "check_task_options",
           "checked_reward", "grader_flags"]

#: ``info`` keys every env sets on every ``reset`` and ``step``.
INFO_KEYS = frozenset({"messages", "tools", "task_id", "index", "split"})
#: ``info`` keys every env adds on the step that ends an episode.
END_INFO_KEYS = frozenset({"termination_reason"})
#: The one ``info`` key naming why a step's action (the model's text) could not be used.
ACTION_ERROR = "action_error"
#: Message of the ``RuntimeError`` raised by ``step`` after the episode ended.
STEP_AFTER_END = "episode has ended; call reset()"
#: Upper bound (seconds) on one ``step`` whatever the model wrote (see "Cost"), with an offline user; generous for a
#: loaded machine: bounded steps take milliseconds.
STEP_TIME_BOUND_S = 2.0
#: The kinds of grader failure, each an ``info`` flag (see "Graders"): past its CPU / wall-clock bound, past its
#: memory bound (both from the grader worker, :mod:`envs.grader_process`), or it raised.
GRADER_FAILURE_KINDS = ("grader_timeout", "grader_memory", "grader_error")
#: The kind of a grader that raised (or returned a reward outside ``[0, 1]``).
GRADER_ERROR = "grader_error"
#: A reward this close outside ``[0, 1]`` is a rounding error and is clamped (:func:`checked_reward`); 1e-9 is far
#: above a float sum's error over a few thousand terms (~1e-13) and far below any partial credit a grader gives.
REWARD_TOLERANCE = 1e-9
#: Characters of an exception's message kept in ``action_error``.
_MAX_ERROR_CHARS = 500


@runtime_checkable
class TextAgentEnv(Protocol):
    """A Gymnasium text env for LLM agents, as specified in the module docstring.

    ``isinstance(env.unwrapped, TextAgentEnv)`` checks that the members exist (a runtime-checkable
    Protocol checks names, not signatures or behaviour; the contract test checks behaviour).
    """

    observation_space: Space
    action_space: Space

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[list[dict], dict]:
        """Start an episode on ``options["task_id"]`` / ``options["index"]`` or a seeded draw.

        Raises:
            ValueError / KeyError: unknown option, index out of range, task id not in the split, a
                task this env cannot play as configured (not in :meth:`usable_task_indices`).
        """
        ...

    def step(self, action: str | dict) -> tuple[list[dict], float, bool, bool, dict]:
        """``(obs, reward, terminated, truncated, info)`` after the agent's action.

        Raises:
            TypeError: ``action`` is outside the action space (:func:`check_action`).
            RuntimeError: before the first ``reset``, or after the episode ended
                (:data:`STEP_AFTER_END`).
        """
        ...

    def close(self) -> None: ...

    @property
    def num_tasks(self) -> int:
        """Number of tasks in the env's split (valid ``index`` range is ``[0, num_tasks)``)."""
        ...

    @property
    def task_ids(self) -> list[str]:
        """The ``task_id`` of every task, in index order (``len == num_tasks``)."""
        ...

    def usable_task_indices(self, limit: int | None = None) -> list[int]:
        """The first ``limit`` (``None``: all) indices, ascending, this env can play as configured."""
        ...

    @property
    def do_nothing_action(self) -> str | dict | None:
        """An action that ends the episode at once (a reward floor), or ``None`` if there is none."""
        ...


def check_task_options(options: Any) -> None:
    """Raise :class:`ValueError` unless ``options`` names a task (``index`` or ``task_id``), as the training hooks
    that take a task (``demonstration``) need; ``reset`` alone may draw one at random."""
    if not options or (options.get("index") is None and options.get("task_id") is None):
        raise ValueError("demonstration() needs options with 'index' or 'task_id'")


def check_action(action: Any) -> None:
    """Raise :class:`TypeError` unless ``action`` is in the action space (see "Action" above).

    Accepted: any ``str``; a ``dict`` whose ``role`` is absent or ``"assistant"``, whose
    ``content`` is a ``str`` or ``None`` and whose ``tool_calls`` is absent, ``None`` or a ``list``
    (the entries of that list are the model's business: malformed ones are answered with tool
    errors). The same set as :meth:`envs.spaces.AssistantAction.contains`.

    Raises:
        TypeError: anything else (a caller's bug, not a model's mistake).
    """
    if isinstance(action, str):
        return
    if not isinstance(action, dict):
        raise TypeError(
            "action must be the model's text (str) or an assistant message dict, "
            f"got {type(action).__name__}"
        )
    role = action.get("role", "assistant")
    if role != "assistant":
        raise TypeError(f"action message must have role 'assistant', got {role!r}")
    content = action.get("content")
    if content is not None and not isinstance(content, str):
        raise TypeError(f"action 'content' must be a str or None, got {type(content).__name__}")
    tool_calls = action.get("tool_calls")
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise TypeError(f"action 'tool_calls' must be a list, got {type(tool_calls).__name__}")


def _describe(exc: BaseException) -> str:
    """``"<Type>: <message>"`` of ``exc``, cut to :data:`_MAX_ERROR_CHARS`; never raises (a ``__str__`` may)."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 -- an exception's own __str__ can fail; the type still names it
        message = "<its message could not be read>"
    if len(message) > _MAX_ERROR_CHARS:
        message = message[:_MAX_ERROR_CHARS] + " [...]"
    message = message.encode("utf-8", "replace").decode("utf-8")  # lone surrogates: info must encode as UTF-8
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def grader_flags(kind: str | None = None) -> dict[str, bool]:
    """The ``info`` flags of a graded step: ``{k: k == kind for k in GRADER_FAILURE_KINDS}`` (all ``False`` for
    ``None``: the grader did not fail).

    Raises:
        ValueError: ``kind`` not ``None`` nor one of :data:`GRADER_FAILURE_KINDS`.
    """
    if kind is not None and kind not in GRADER_FAILURE_KINDS:
        raise ValueError(f"grader failure kind must be one of {GRADER_FAILURE_KINDS}, got {kind!r}")
    return {k: k == kind for k in GRADER_FAILURE_KINDS}


def call_grader(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, dict | None]:
    """``(fn(*args, **kwargs), None)``, or ``(None, failure)`` when ``fn`` raised (see "Graders").

    ``failure`` is the ``info`` of the failed grading: ``{ACTION_ERROR: "grader_error: the grader raised <Type>:
    <message>"}`` and :func:`grader_flags` of :data:`GRADER_ERROR`. Every ``BaseException`` is caught
    (``SystemExit``, ``GeneratorExit``, ``MemoryError``, ``RecursionError``, a library's own subclass, ...).

    Raises:
        KeyboardInterrupt: re-raised (the operator stopping the process), as is nothing else.
    """
    try:
        return fn(*args, **kwargs), None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 -- the contract: any grader failure is an observation
        return None, {ACTION_ERROR: f"{GRADER_ERROR}: the grader raised {_describe(exc)}", **grader_flags(GRADER_ERROR)}


def checked_reward(reward: Any) -> tuple[float, str | None]:
    """``(reward, None)`` for a grader's reward in ``[0, 1]`` (one within :data:`REWARD_TOLERANCE` outside it
    clamped); ``(0.0, why)`` for anything else (NaN, infinite, further outside, not a number): a grader's bug
    becomes an observation, not a raise.
    """
    try:
        value = float(reward)
    except (TypeError, ValueError, OverflowError):
        return 0.0, f"{GRADER_ERROR}: the grader's reward {reward!r:.80} is not a number; scored 0"
    if not math.isfinite(value) or not -REWARD_TOLERANCE <= value <= 1.0 + REWARD_TOLERANCE:
        return 0.0, f"{GRADER_ERROR}: the grader's reward {value!r} is outside [0, 1]; scored 0"
    return min(1.0, max(0.0, value)), None
