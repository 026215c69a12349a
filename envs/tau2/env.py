"""tau2-bench domains as a single-threaded Gymnasium text environment (:class:`Tau2Env`).

Registered as ``tau2/{airline,retail,telecom,mock}-v0``. The class docstring is the spec, in
Gymnasium's sections (as ``CartPoleEnv``'s), including where we diverge from tau2 and why; the
contract shared by all envs of this package is :mod:`envs.contract`.
"""
from __future__ import annotations

import os
import time
import uuid
import warnings
from collections.abc import Sequence
from copy import deepcopy
from typing import Any, Callable

import gymnasium as gym

from envs.contract import ACTION_ERROR, STEP_AFTER_END, call_grader, check_action, check_task_options
from envs.spaces import AssistantAction, ChatMessages

from .actions import TOOL_CALL_FORMAT_HINT, ParsedAction, ToolCallRequest, parse_action
from .domain import STOP_TOKEN, STOP_TOOL, TRANSFER_TOOL, Tau2Domain, get_domain
from .logs import set_tau2_logging, tau2_logging_default
from .messages import openai_tool_call, openai_tool_message, tau2_to_openai
from .task_file import load_task_file
from .tasks import DEFAULT_SPLIT, load_tasks

__all__ = ["Tau2Env", "USER_KINDS", "REWARD_KINDS", "PARTIAL_ON_STOP_WEIGHT", "SOLO_TICKET_PLACES", "DO_NOTHING_ACTION", "MAX_TOOL_CALLS_PER_ACTION",
           "MAX_TOOL_RESULT_CHARS"]

#: Accepted values of ``user=`` (a callable is accepted too, like ``user_fn=``).
USER_KINDS = ("solo", "scripted", "llm", "callable")
#: Accepted values of ``solo_ticket=``: where a solo episode shows the ticket (tau2's system prompt, or a first user
#: message after a system prompt that is then the same for every task of the domain).
SOLO_TICKET_PLACES = ("system", "user")
#: ``reward="partial_on_stop"``: what an unsolved episode ended by a stop earns per unit of progress (a solved one: 1.0)
PARTIAL_ON_STOP_WEIGHT = 0.5
#: Accepted values of ``reward=``.
REWARD_KINDS = ("binary", "partial", "partial_on_stop")
_OPTION_KEYS = frozenset({"task_id", "index"})
#: Default ``max_tool_calls_per_action``: most tool calls one action may make (tau2 sets no bound; its gold
#: demonstrations make one call per message).
MAX_TOOL_CALLS_PER_ACTION = 16
#: Default ``max_tool_result_chars``: longest tool answer shown to the agent (characters). The longest answer in a
#: gold replay is 3,370 characters (retail base; airline base 1,317, telecom small 384, mock 114).
MAX_TOOL_RESULT_CHARS = 16_384
#: The do-nothing agent: end the conversation at once with the ``done`` tool (a reward floor:
#: some tasks need no change, ~0.38 on airline base). Read it as ``env.do_nothing_action``.
DO_NOTHING_ACTION = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "done", "arguments": {}}}]}


class Tau2Env(gym.Env):
    """One tau2 domain; one task per episode (follows :mod:`envs.contract`).

    ## Description

    tau2-bench (Barres et al., 2025, "tau^2-Bench: Evaluating Conversational Agents in a
    Dual-Control Environment", arXiv:2506.07982): an agent serves a customer of an airline,
    retail or telecom company through the domain's tools and policy. One episode = one tau2 task
    of one domain, played over tau2's own domain code (tools, databases, policies, user
    simulator, evaluator) by a plain loop -- no threads, no polling, no re-reading of files
    (compare ``tau2.gym.AgentGymEnv``; ``benchmarks/env_bench.py`` measures both).

    ## Action Space

    :class:`~envs.spaces.AssistantAction` (:mod:`envs.tau2.actions`): an assistant message dict,
    or raw model text with Hermes / Qwen ``<tool_call>`` blocks, bare JSON, or tau2's
    ``name(arg=...)`` syntax; anything else is a message to the customer. Several calls in one
    action run in order, at most ``max_tool_calls_per_action`` of them (default
    :data:`MAX_TOOL_CALLS_PER_ACTION`, 16): an action making more runs none (a ``done`` among them
    included) and is answered with one tool error message (its id ``call_{step}_0`` stands for them all in
    the recorded assistant message; the content says how many were written and the bound), counted in
    ``num_errors`` and ``info["action_error"]``; the database is unchanged. A malformed call (bad JSON, no
    name, arguments not an object), a call with
    arguments that fail the tool's parameter model (strict pydantic validation, unknown keys
    rejected) and a call to an unknown tool are answered with a tool message starting with
    ``"Error:"``; the first two are never executed, the last is answered by tau2 (``"Error: Tool
    'x' not found."``); none changes a database. Each counts in ``info["num_errors"]`` and sets
    ``info["action_error"]``; so does an empty action (no message, no call; not counted in
    ``num_errors``, nothing is said). The ``done`` tool (always offered) and a message containing
    ``###STOP###`` end the episode (tau2's agent stop). An action outside the space (``12345``,
    ``None``, a list, a dict with another role, non-string ``content``, non-list ``tool_calls``) is
    a caller's bug: ``step`` raises ``TypeError`` and consumes nothing.

    ## Observation Space

    :class:`~envs.spaces.ChatMessages`: the list of chat messages (OpenAI format, see
    :mod:`envs.tau2.messages`) that are new to the agent since its last action. On reset: the
    system message (tau2's agent instructions and domain policy; in solo mode the solo
    instructions, solo policy and the task's ticket), the task's prior history if it has one,
    then -- with a user -- tau2's greeting ``"Hi! How can I help you today?"`` and the customer's
    opening message. After a tool-calling action: one ``tool`` message per call, in order, each cut to
    ``max_tool_result_chars`` characters (default :data:`MAX_TOOL_RESULT_CHARS`) plus a note
    ``"[... n more characters not shown]"`` (the trajectory tau2 grades keeps the whole answer). After a
    message to the customer: the customer's reply. So one step appends to ``info["messages"]`` at most
    the action itself, ``max_tool_calls_per_action`` tool messages of at most ``max_tool_result_chars``
    characters plus the note, and the customer's reply (a session byte cap is the server's,
    :mod:`envs.serve`).

    ## Rewards

    0 until the episode ends, then tau2's reward (:mod:`envs.tau2.rewards`, equal to
    ``evaluate_simulation(..., EvaluationType.ALL)``) or, with ``reward="partial"``, the documented
    progress reward; both are in ``info`` (``reward_binary``, ``reward_partial``).

    ## Starting State

    ``reset(options={"task_id": id})`` or ``{"index": i}`` picks a task of the split; without
    options one is drawn from ``self.np_random`` (reproducible with ``seed``). ``num_tasks`` and
    ``task_ids`` (tau2's ids, index order) list the split (or the ``tasks_path`` file, in file order);
    :meth:`usable_task_indices` drops the tasks this env cannot play as configured (solo mode: tasks
    without a ticket or whose history has customer turns; ``reset`` raises ``ValueError`` on them; a
    tasks file holding one is refused at construction instead). ``do_nothing_action`` (a ``done`` call,
    :data:`DO_NOTHING_ACTION`) ends an episode at once: the reward floor a policy must beat
    (~0.38 on airline base: some tasks need no change). If the customer ends the conversation
    (or fails) during reset, the episode ends on the first step, whatever the action.

    ## Episode End

    ``terminated``: the agent stopped (``done``/``###STOP###``), the customer stopped
    (``###STOP###``, ``###TRANSFER###``, ``###OUT-OF-SCOPE###``), the customer failed
    (``user_error``), a text message in solo mode (tau2's ``agent_error``), or ``max_errors`` tool
    errors (``too_many_errors``). ``truncated``: ``max_steps`` actions without an ending
    (``max_steps``; reward 0 as in tau2). ``step`` after the end raises
    ``RuntimeError("episode has ended; call reset()")``; before the first reset, ``RuntimeError``.

    Info (every step): ``messages`` (whole agent-visible conversation), ``tools`` (OpenAI tool
    schemas), ``task_id``, ``index``, ``split``, ``domain``, ``user``, ``step`` (actions so far),
    ``num_errors``; ``action_error`` when an action was unusable; at the end
    ``termination_reason`` (tau2's ``TerminationReason`` value), ``reward_info`` (tau2's
    ``RewardInfo`` as a dict), ``reward_binary``, ``reward_partial``, and ``user_error`` when the
    customer failed.

    ## Arguments

    Args:
        domain: ``"airline"``, ``"retail"``, ``"telecom"`` or ``"mock"`` (set by the registered
            ids ``tau2/<domain>-v0``).
        split: a split tau2 defines for the domain (:mod:`envs.tau2.tasks`), default ``"base"``; ignored when
            ``tasks_path`` is given.
        tasks_path: a file of tasks to serve instead of a split: a JSON list or JSON lines of tasks in tau2's own
            ``Task`` schema (:mod:`envs.tau2.task_file`: format, checks, caching). The env serves exactly the file's
            tasks in file order; ``split`` (and ``info["split"]``) is then ``"file:<file name>"``, ``tasks_path``
            the file's real path. ``None`` / ``""``: the split.
        user: ``"solo"`` (no customer; telecom and mock only; telecom's default),
            ``"scripted"`` (:class:`envs.tau2.users.ScriptedUser`; default elsewhere), ``"llm"``
            (tau2's ``UserSimulator`` via litellm), ``"callable"`` (with ``user_fn``), or a
            callable (same as ``user_fn=``).
        user_fn: ``fn(messages, tools) -> str | dict`` playing the customer
            (:data:`envs.tau2.users.UserFn`), e.g. a local model.
        user_llm: litellm model name of the LLM customer (required for ``user="llm"``).
        user_llm_base_url: ``api_base`` of an OpenAI-compatible endpoint for the LLM customer.
        user_llm_args: extra litellm arguments (``temperature`` defaults to 0.0).
        max_steps: actions per episode before truncation (>= 1).
        max_errors: tool errors per episode that end it (``too_many_errors``); ``None`` = no limit.
        reward: ``"binary"`` (tau2's reward is returned), ``"partial"`` (the progress reward
            is returned, whatever the termination) or ``"partial_on_stop"``: 1.0 when tau2's reward is 1.0, else
            :data:`PARTIAL_ON_STOP_WEIGHT` (0.5) x the progress reward when the agent (or customer) ended the episode,
            0.0 when it was truncated or failed -- an unfinished episode earns nothing (the progress reward cannot
            pay for never ending) and an unsolved one at most half a solved one; both values are always in
            ``info``.
        evaluator: ``"fast"`` (default; live environment + cached gold databases) or ``"tau2"``
            (tau2's ``evaluate_simulation`` itself; slower, same value).
        scripted_max_turns: replies after which the scripted customer hangs up.
        max_user_tool_rounds: consecutive customer tool-call rounds (telecom LLM customer)
            before the customer is declared failed.
        tau2_logging: let tau2's loguru output through (default: ``$TAU2_LOG``, else off).
        render_mode: ``None`` or ``"ansi"``.
        max_tool_calls_per_action: most tool calls one action may make (>= 1; default
            :data:`MAX_TOOL_CALLS_PER_ACTION` = 16; tau2 sets none, its gold demonstrations make one per message).
        max_tool_result_chars: longest tool answer shown to the agent, in characters (>= 1; default
            :data:`MAX_TOOL_RESULT_CHARS` = 16,384; the longest answer of a gold replay is 3,370, retail).
        solo_ticket: where a solo episode shows the ticket: ``"system"`` (tau2's ``SYSTEM_PROMPT_SOLO``, default) or
            ``"user"`` (the system message is tau2's solo prompt up to its ``<ticket>`` block, the same for every task;
            the ticket, in the same tags, is the first user message). Divergence 9 below.
        gold_reads_first: names of the agent's read-only tools without required arguments (tau2 ``ToolType.READ``;
            mock: ``["get_users"]``) that :meth:`demonstration` calls first, before the task's gold actions, unless
            the gold already opens with that call: supervised data in which every episode reads before it writes, so
            a policy's first call is no decision it must learn from the ticket (benchmarks/results/tau2_mock_recipe.md
            run 9: a warm start that looked up on some tasks and not others lost the lookup under GRPO). Reads do not
            change the database, so the replay scores what the gold scores. Episodes, rewards and ``reset`` are
            unchanged. Default: none.
        max_intents: keep only the tasks of at most this many sub-intents in :meth:`usable_task_indices` (the task
            list a trainer draws from): a curriculum of short tickets on the generated mock splits
            (:func:`envs.tau2.generated_tasks.intents`; benchmarks/results/tau2_mock_recipe.md run 10: GRPO trained
            on 1-intent tasks lifted held-out pass^1 on 1- and 2-intent tasks). ``reset`` still plays any index.
            ``None`` (default): all tasks.

    Raises:
        ValueError: unknown domain, split, user kind, reward kind or evaluator; solo mode for a
            domain without it; ``user="llm"`` without ``user_llm``; ``user="callable"`` without
            ``user_fn``; ``max_steps < 1``; ``max_tool_calls_per_action`` or ``max_tool_result_chars`` < 1; a tasks
            file that cannot be served (:class:`envs.tau2.task_file.TaskFileError`, naming the file, task and
            field; :class:`~envs.tau2.task_file.TaskFileNotFoundError` when it does not exist) or holding a task
            this configuration cannot play (solo mode: no ``ticket``, customer turns in its history); a
            ``gold_reads_first`` name that is not a read-only agent tool of the domain or that requires arguments;
            ``max_intents`` < 1 or set on tasks that are not generated (no sub-intents in their purpose).

    ## Where we diverge from tau2, and why

    1. A plain single-threaded loop instead of ``AgentGymEnv``'s thread per episode and 10 ms
       polling, with tasks and gold databases cached per process: much faster resets and steps
       (``benchmarks/env_bench.py``), and any split (``AgentGymEnv`` serves the base split only).
    2. Tool calls are parsed from raw model text in the model family's own format (Hermes/Qwen,
       bare JSON, tau2's functional syntax), so a policy can be trained on its text.
    3. Arguments are checked against the tool's parameter model before anything runs (strict
       pydantic validation, unknown keys rejected); a malformed or invalid call is answered with an
       ``Error:`` message (a malformed one with a format hint) and never executed, where tau2's
       orchestrator hands whatever arguments it got to the tool and reports what the tool raises.
       A policy can then learn the format from the answers without ever changing a database by a
       half-understood call.
    4. Airline and retail need a customer; besides tau2's LLM user we offer an offline scripted
       customer (opens with the task's reason for calling, answers from known info, stops when the
       agent ends) and any callable (a local model), so training needs no API.
    5. The reward is computed by a fast evaluator on the live environment with cached gold
       databases; it equals tau2's ``evaluate_simulation(..., EvaluationType.ALL)`` on the same
       trajectory (tested on every task of airline, retail, telecom base/small; ``evaluator="tau2"``
       runs tau2's own). A ``partial`` progress reward is offered for denser training signal.
    6. Errors are not swallowed (``AgentGymEnv`` swallows them): a caller's bug (an action outside
       the space, a step after the end) raises; the customer failing is reported as
       ``termination_reason == "user_error"`` with ``info["user_error"]`` so a trainer can drop it.
    7. Nothing a model writes can hang or crash a step (issue 25; ``tests/test_env_hardening.py``):
       tau2's ``calculate`` (airline, retail) evaluates ``**`` towers (``"9**9**8"`` held the GIL
       for 80 s); here an expression with ``**`` or over
       :data:`~envs.tau2.domain.MAX_CALCULATE_CHARS` characters is answered with an ``Error:`` tool
       message and not evaluated, and left out of the trajectory tau2 grades, like any malformed call.
       Rewards are unchanged for every gold trajectory: gold actions do call ``calculate`` (base: 1
       airline task, 12 retail tasks; 30 calls counting every split), never with ``**`` or over 1,000
       characters, and no task that has one grades actions (its reward basis is DB + COMMUNICATE). JSON
       nested deeper than :data:`~envs.action_text.MAX_JSON_DEPTH` levels is a malformed call
       (refused before ``json.loads``, which tau2 lets raise ``RecursionError``), and lone UTF-16
       surrogates in the action become U+FFFD on entry (a reply holding one cannot be encoded).
    8. What one step may append is bounded (issue 34): tau2 runs every call of a message and shows every
       answer whole, so a 1 MiB action of 7,300 airline calls took 3.9 s and grew the conversation to 24.1 MB
       (``<tool_call></tool_call>`` x 45,588: 18.8 MB). Here an action of more than
       ``max_tool_calls_per_action`` calls runs none (one error answer), and the agent reads each answer cut
       to ``max_tool_result_chars`` characters. Every pattern that reads the action is linear-time
       (``tests/test_regex_linear_time.py``).

    9. ``solo_ticket="user"`` (opt-in) moves the solo ticket out of the system message into a first user message:
       the grading, tools and every token of the ticket are unchanged, but the system prompt and tool schemas become
       one prefix shared by every task of the domain, which the trainer's prompt-prefix KV cache and shared-prefix
       update then compute once per batch instead of once per episode. On generated mock tasks with SmolLM2 the
       shared prefix goes from 210 tokens (the solo instructions and policy: the ticket came before the ~600 tokens
       of tool schemas) to the whole system turn (``configs/grpo_tau2_mock.yaml``; docs/tau2.md).

    ## Example

    ```python
    >>> import gymnasium as gym, envs
    >>> gym.register_envs(envs)
    >>> env = gym.make("tau2/airline-v0", split="test", user="scripted")
    >>> obs, info = env.reset(seed=0, options={"task_id": "2"})     # or {"index": 0}, or sampled
    >>> [m["role"] for m in obs]                                    # system, greeting, customer
    ['system', 'assistant', 'user']
    >>> obs, reward, terminated, truncated, info = env.step(
    ...     '<tool_call>{"name": "get_user_details", "arguments": {"user_id": "x"}}</tool_call>')
    >>> obs[0]["content"], reward, terminated
    ('Error: User x not found', 0.0, False)
    >>> obs, reward, terminated, truncated, info = env.step(env.unwrapped.do_nothing_action)
    >>> terminated, info["termination_reason"]
    (True, 'agent_stop')

    ```

    ## Version History

    Policy (:mod:`envs`): the version is bumped whenever the reward semantics change; one bullet per version, for
    all four ids ``tau2/{airline,retail,telecom,mock}-v0``.

    - v0 (2026-11-22, 1de297e): released: tau2's ``evaluate_simulation(..., EvaluationType.ALL)`` reward at the
      episode end (``reward="partial"``: the progress reward); scripted / LLM / solo customers; malformed calls
      answered with ``Error:``. Since, grading unchanged: ``calculate`` refuses ``**``, more than 16 tool calls in
      one action run none, tool answers shown cut to 16,384 characters (d8b81ae, 5507ac0: dynamics change only for
      such actions; gold and recorded episodes score as before).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        domain: str,
        split: str = DEFAULT_SPLIT,
        user: str | Callable | None = None,
        user_fn: Callable | None = None,
        user_llm: str | None = None,
        user_llm_base_url: str | None = None,
        user_llm_args: dict | None = None,
        max_steps: int = 100,
        max_errors: int | None = None,
        reward: str = "binary",
        evaluator: str = "fast",
        scripted_max_turns: int = 20,
        max_user_tool_rounds: int = 20,
        tau2_logging: bool | None = None,
        render_mode: str | None = None,
        max_tool_calls_per_action: int = MAX_TOOL_CALLS_PER_ACTION,
        max_tool_result_chars: int = MAX_TOOL_RESULT_CHARS,
        tasks_path: str | os.PathLike | None = None,
        solo_ticket: str = "system",
        gold_reads_first: Sequence[str] = (),
        max_intents: int | None = None,
    ):
        set_tau2_logging(tau2_logging_default() if tau2_logging is None else bool(tau2_logging))
        if callable(user):
            user_fn, user = user, "callable"
        if user is None:
            user = "callable" if user_fn is not None else ("solo" if domain == "telecom" else "scripted")
        if user not in USER_KINDS:
            raise ValueError(f"user must be one of {USER_KINDS} or a callable, got {user!r}")
        if user == "callable" and user_fn is None:
            raise ValueError("user='callable' needs user_fn=<callable(messages, tools) -> str | dict>")
        if user_fn is not None and not callable(user_fn):
            raise ValueError(f"user_fn must be callable, got {type(user_fn).__name__}")
        if user == "llm" and not user_llm:
            raise ValueError("user='llm' needs user_llm=<litellm model name> (and usually user_llm_base_url)")
        if reward not in REWARD_KINDS:
            raise ValueError(f"reward must be one of {REWARD_KINDS}, got {reward!r}")
        if evaluator not in ("fast", "tau2"):
            raise ValueError(f"evaluator must be 'fast' or 'tau2', got {evaluator!r}")
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if isinstance(max_tool_calls_per_action, bool) or int(max_tool_calls_per_action) < 1:
            raise ValueError(f"max_tool_calls_per_action must be an int >= 1, got {max_tool_calls_per_action!r}")
        if isinstance(max_tool_result_chars, bool) or int(max_tool_result_chars) < 1:
            raise ValueError(f"max_tool_result_chars must be an int >= 1, got {max_tool_result_chars!r}")
        if solo_ticket not in SOLO_TICKET_PLACES:
            raise ValueError(f"solo_ticket must be one of {SOLO_TICKET_PLACES}, got {solo_ticket!r}")

        self.domain_name = domain
        # validates domain and split, or the file (envs.tau2.task_file: a bad file fails here, naming task and field)
        self.tasks = load_task_file(domain, tasks_path) if tasks_path else load_tasks(domain, split)
        self.split = self.tasks.split
        self.tasks_path = getattr(self.tasks, "path", None)
        self.domain: Tau2Domain = get_domain(domain)
        self.solo = user == "solo"
        if self.solo:
            self.domain._check_solo(True)
        self.user_kind = user
        self.user_fn = user_fn
        self.user_llm = user_llm
        self.user_llm_base_url = user_llm_base_url
        self.user_llm_args = dict(user_llm_args or {})
        self.max_steps = int(max_steps)
        self.max_errors = None if max_errors is None else int(max_errors)
        self.reward_kind = reward
        self.evaluator = evaluator
        self.scripted_max_turns = int(scripted_max_turns)
        self.max_user_tool_rounds = int(max_user_tool_rounds)
        self.render_mode = render_mode
        self.max_tool_calls_per_action = int(max_tool_calls_per_action)
        self.max_tool_result_chars = int(max_tool_result_chars)
        self.solo_ticket = solo_ticket
        self.gold_reads_first = self._check_reads_first(gold_reads_first)
        if self.tasks_path is not None:
            self._check_file_tasks_playable()
        self.max_intents = self._check_max_intents(max_intents)

        self.tools = self.domain.tool_schemas(self.solo)
        self._tool_names = self.domain.agent_tool_set(self.solo)
        self._parse_names = self._tool_names | {STOP_TOOL}
        self.observation_space = ChatMessages()
        self.action_space = AssistantAction(tools=self.tools)  # sample(): a schema-valid tool call, or a message
        self._task = None
        self._done = True
        self._reset_called = False

    # ------------------------------------------------------------------------------------------
    # task listing and training hooks (env contract, envs.contract)
    # ------------------------------------------------------------------------------------------
    @property
    def num_tasks(self) -> int:
        """Number of tasks in the split (valid ``index`` range is ``[0, num_tasks)``)."""
        return len(self.tasks)

    @property
    def task_ids(self) -> list[str]:
        """tau2's task ids of the split, in index order."""
        return self.tasks.ids

    def _unplayable(self, task) -> str | None:
        """Why this env, as configured, cannot play ``task`` (``None`` if it can).

        Solo mode only: there is no customer, so a task without a ticket has nothing to work from, and a task whose
        prior history has customer turns cannot be continued (``reset`` raises ``ValueError`` with this text).
        """
        if not self.solo:
            return None
        if not task.ticket:
            return f"tau2 task {task.id!r} of {self.domain_name!r} has no ticket; it cannot run in solo mode"
        if task.initial_state is None or not task.initial_state.message_history:
            return None
        from tau2.data_model.message import UserMessage

        if any(isinstance(m, UserMessage) for m in task.initial_state.message_history):
            return f"tau2 task {task.id!r} has customer messages in its history; it cannot run in solo mode"
        return None

    def _check_file_tasks_playable(self) -> None:
        """A task file's tasks must all be playable as configured (none is dropped silently, unlike a registry
        split's in :meth:`usable_task_indices`).

        Raises:
            ValueError: naming the file, each task (id and index, up to 10) and why (no ``ticket`` / customer turns in
                ``initial_state.message_history`` in solo mode).
        """
        bad = [(i, why) for i, t in enumerate(self.tasks.tasks) if (why := self._unplayable(t)) is not None]
        if bad:
            shown = "\n  ".join(f"task #{i}: {why}" for i, why in bad[:10])
            more = f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else ""
            raise ValueError(f"tau2 task file {self.tasks_path} (domain {self.domain_name!r}, user={self.user_kind!r}):"
                             f" {len(bad)} of {len(self.tasks)} tasks cannot be played:\n  {shown}{more}\n"
                             "(solo mode needs each task's 'ticket' and no customer turns in "
                             "'initial_state.message_history'; or use user='scripted' / 'llm' / a user_fn)")

    def usable_task_indices(self, limit: int | None = None) -> list[int]:
        """The first ``limit`` (``None``: all) task indices this env can play as configured, ascending.

        Drops the tasks ``reset`` would refuse (:meth:`_unplayable`: customer turns in the history of a
        solo-mode task), read from the task data without resetting, and with ``max_intents`` the tasks of more
        sub-intents.
        """
        out: list[int] = []
        for i, task in enumerate(self.tasks.tasks):
            if limit is not None and len(out) >= limit:
                break
            if self._unplayable(task) is None and (self._intents is None or len(self._intents[i]) <= self.max_intents):
                out.append(i)
        return out

    def _check_max_intents(self, max_intents) -> int | None:
        """``max_intents`` as an int (None: no filter), with each task's sub-intents in ``self._intents``.

        Raises:
            ValueError: ``max_intents`` not an int >= 1, or a task that is not a generated one (naming it).
        """
        self._intents = None
        if max_intents is None:
            return None
        if isinstance(max_intents, bool) or not isinstance(max_intents, int) or max_intents < 1:
            raise ValueError(f"max_intents must be an int >= 1 or None, got {max_intents!r}")
        from envs.tau2.generated_tasks import intents

        try:
            self._intents = [intents(t) for t in self.tasks.tasks]
        except ValueError as e:
            raise ValueError(f"max_intents={max_intents} filters generated mock tasks by their sub-intents "
                             f"(split {self.split!r} of {self.domain_name!r}): {e}") from None
        return max_intents

    @property
    def do_nothing_action(self) -> dict:
        """A fresh copy of :data:`DO_NOTHING_ACTION`: a ``done`` call that ends the episode at once."""
        return deepcopy(DO_NOTHING_ACTION)

    def demonstration(self, options: dict | None) -> list[dict]:
        """The gold assistant messages for the task ``options`` picks (``index`` / ``task_id``, as for ``reset``):
        the task's gold actions as tool calls, then its ``communicate_info`` and the stop
        (:func:`envs.tau2.oracle.oracle_actions`; in solo mode the customer's gold actions too). Replayed through
        ``step`` in this env's configuration they score what tau2's own evaluator scores them
        (``tests/test_tau2_gold.py``): 1.0 on every task of airline, retail and telecom, and of mock but two, whose
        gold tau2 itself scores 0 -- ``update_task_with_history_and_env_assertions`` (no gold actions listed; its
        reward is an env assertion that task_2 is completed) and, in solo mode only,
        ``update_task_with_initialization_data`` (its reward needs information communicated to a customer that solo
        mode does not have: the gold's message is an ``agent_error``). The supervised fine-tuning data of
        :mod:`torchrl_grpo.rollout.demonstrations`.

        Raises:
            ValueError: bad options, or a task this env cannot play (:meth:`usable_task_indices`).
        """
        check_task_options(options)
        from .oracle import oracle_actions

        task = self.tasks.tasks[self._pick_task(options)]
        why = self._unplayable(task)
        if why is not None:
            raise ValueError(why)
        return oracle_actions(task, self.solo, reads_first=self.gold_reads_first)

    def _check_reads_first(self, names) -> tuple[str, ...]:
        if isinstance(names, str):
            raise ValueError(f"gold_reads_first must be a list of tool names, got the string {names!r}")
        out = tuple(names or ())
        for name in out:
            if name not in self.domain.read_tool_names:
                raise ValueError(f"gold_reads_first: {name!r} is not a read-only agent tool of tau2 "
                                 f"{self.domain_name}; its read-only tools: {sorted(self.domain.read_tool_names)}")
            required = self.domain.params[name].model_json_schema().get("required") or []
            if required:
                raise ValueError(f"gold_reads_first: {name!r} requires arguments {required}; only a read without "
                                 "required arguments can open every demonstration")
        return out

    # ------------------------------------------------------------------------------------------
    # reset
    # ------------------------------------------------------------------------------------------
    def _pick_task(self, options: dict | None) -> int:
        options = options or {}
        unknown = set(options) - _OPTION_KEYS
        if unknown:
            raise ValueError(f"unknown reset option(s) {sorted(unknown)}; expected 'task_id' or 'index'")
        if options.get("task_id") is not None:
            return self.tasks.index_of(str(options["task_id"]))
        if options.get("index") is not None:
            i = options["index"]
            if isinstance(i, bool) or not isinstance(i, int) and not hasattr(i, "__index__"):
                raise ValueError(f"options['index'] must be an int, got {type(i).__name__}")
            i = int(i)
            if not 0 <= i < len(self.tasks):
                raise ValueError(f"options['index']={i} out of range for {self.domain_name}/{self.split} ({len(self.tasks)} tasks)")
            return i
        return int(self.np_random.integers(len(self.tasks)))

    def _make_user(self, task):
        from .users import CallableUser, ScriptedUser, make_llm_user

        user_tools = self.domain.user_tool_objects or None
        if self.user_kind == "scripted":
            return ScriptedUser(task.user_scenario.instructions, max_turns=self.scripted_max_turns)
        if self.user_kind == "llm":
            return make_llm_user(
                task.user_scenario, user_tools, self.user_llm, self.user_llm_base_url, self.user_llm_args
            )
        if self.user_kind == "callable":
            return CallableUser(self.user_fn, task.user_scenario, user_tools)
        return None

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[list, dict]:
        """Start an episode on a task chosen by ``options`` (``task_id`` / ``index``) or by seed.

        Raises:
            ValueError / KeyError: bad options (unknown key, task id not in the split, index out
                of range); a task whose history has customer messages in solo mode.
        """
        super().reset(seed=seed)
        from tau2.agent.base import is_valid_agent_history_message
        from tau2.data_model.message import AssistantMessage
        from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE

        index = self._pick_task(options)
        task = self.tasks[index]
        history = deepcopy(task.initial_state.message_history) if task.initial_state and task.initial_state.message_history else []
        for m in history:
            m.turn_idx = None
        reason = self._unplayable(task)
        if reason is not None:
            raise ValueError(reason)
        ticket_apart = self.solo and self.solo_ticket == "user"
        system = self.domain.system_prompt(task, self.solo, with_ticket=not ticket_apart)

        self._task, self._index = task, index
        self._episode = self.domain.start(task, self.solo)
        self._trajectory: list = history
        self._messages: list[dict] = [{"role": "system", "content": system}]
        if ticket_apart:
            self._messages.append(self.domain.ticket_message(task))
        self._names: dict[str, str] = {}
        for m in history:  # what tau2 shows its agent of the prior history
            if is_valid_agent_history_message(m):
                self._messages.extend(tau2_to_openai(m, self._names))
        self._steps = 0
        self._errors = 0
        self._done = False
        self._reset_called = True
        self._start = time.perf_counter()
        self._start_time = _now()
        self._pending: tuple[str, str] | None = None
        self._end_info: dict = {}
        self._last_action_error: str | None = None
        self.reward_info = None
        self.termination_reason: str | None = None

        self._user = self._make_user(task)
        self._user_state = None
        if self._user is not None:
            self._user_state = self._user.get_init_state(
                message_history=[m for m in history if _valid_user_history(m)]
            )
            incoming = None
            if not history:
                greeting = deepcopy(DEFAULT_FIRST_AGENT_MESSAGE)
                greeting.timestamp = _now()
                self._trajectory.append(greeting)
                self._messages.append({"role": "assistant", "content": greeting.content})
                incoming = greeting
            elif isinstance(history[-1], AssistantMessage) and not history[-1].is_tool_call():
                incoming = history[-1]
            if incoming is not None:
                _, ending = self._user_turn(incoming)
                if ending is not None:
                    # the episode cannot end inside reset(): it ends on the first step
                    self._pending = ending
                    if ending[0] == "user_error":
                        warnings.warn(f"tau2 customer failed at reset: {ending[1]}", RuntimeWarning, stacklevel=2)
        obs = list(self._messages)
        return obs, self._info()

    # ------------------------------------------------------------------------------------------
    # step
    # ------------------------------------------------------------------------------------------
    def step(self, action: Any) -> tuple[list, float, bool, bool, dict]:
        """Apply one agent action; a model's unusable action is answered, never raised (see the class docstring).

        Raises:
            TypeError: ``action`` is outside the action space (:func:`envs.contract.check_action`);
                nothing is consumed.
            RuntimeError: before the first ``reset``, or after the episode ended.
        """
        if not self._reset_called:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError(STEP_AFTER_END)
        check_action(action)
        self._last_action_error = None
        self._steps += 1
        if self._pending is not None:
            reason, msg = self._pending
            self._pending = None
            return self._finish([], reason, error=msg)

        parsed = parse_action(action, id_prefix=f"call_{self._steps}", tool_names=self._parse_names,
                              max_tool_calls=self.max_tool_calls_per_action)
        if parsed.error is not None:
            self._last_action_error = parsed.error
            return self._after([], None)
        if parsed.too_many_tool_calls:  # none is run: one malformed call stands for them all
            n, bound = parsed.too_many_tool_calls, self.max_tool_calls_per_action
            parsed.tool_calls = [ToolCallRequest(
                f"call_{self._steps}_0", None, None,
                f"the message makes {n} tool calls and at most {bound} are run per message, so none was run"
                f"; make at most {bound} calls per message")]
        stop_at = next((i for i, c in enumerate(parsed.tool_calls) if c.name == STOP_TOOL), None)
        calls = parsed.tool_calls if stop_at is None else parsed.tool_calls[:stop_at]
        stop = stop_at is not None or (parsed.content is not None and STOP_TOKEN in parsed.content)
        done_call = parsed.tool_calls[stop_at] if stop_at is not None else None
        self._messages.append(self._visible_assistant(parsed, calls, done_call))

        if calls:
            obs = self._run_agent_calls(parsed.content, calls)
            if stop:
                self._append_stop_message(stop_at is not None)
                return self._finish(obs, "agent_stop")
            return self._after(obs, None)
        if stop:
            self._append_stop_message(stop_at is not None, parsed.content)
            return self._finish([], "agent_stop")
        if parsed.content is None:
            self._messages.pop()
            self._last_action_error = "empty action: no message and no tool call"
            return self._after([], None)

        from tau2.data_model.message import AssistantMessage

        amsg = AssistantMessage(role="assistant", content=parsed.content)
        self._trajectory.append(amsg)
        if self.solo:
            return self._finish([], "agent_error", error="solo mode: the agent may only call tools (or 'done')")
        obs, ending = self._user_turn(amsg)
        return self._after(obs, ending)

    def _visible_assistant(
        self, parsed: ParsedAction, calls: list[ToolCallRequest], done_call: ToolCallRequest | None
    ) -> dict:
        msg: dict = {"role": "assistant", "content": parsed.content}
        entries = [self._visible_call(c) for c in calls]
        if done_call is not None:  # recorded as written; it ends the episode, so no tool answer
            entries.append(self._visible_call(done_call))
        if entries:
            msg["tool_calls"] = entries
        return msg

    @staticmethod
    def _visible_call(c: ToolCallRequest) -> dict:
        if c.ok:
            return openai_tool_call(c.id, c.name, c.arguments)
        return {"id": c.id, "type": "function", "function": {"name": c.name or "", "arguments": c.raw}}

    def _append_stop_message(self, done_called: bool, content: str | None = None) -> None:
        from tau2.data_model.message import AssistantMessage

        # tau2 turns a ``done`` call into the stop message ``###STOP###`` (GymAgent/LLMSoloAgent)
        text = STOP_TOKEN if done_called or content is None else content
        self._trajectory.append(AssistantMessage(role="assistant", content=text))

    def _check_call(self, c: ToolCallRequest, allowed: frozenset | set) -> str | None:
        """Error text for a call that must not run, ``None`` if tau2 may run it."""
        if not c.ok:
            return f"Error: {c.error}. {TOOL_CALL_FORMAT_HINT}"
        if c.name in allowed:
            err = self.domain.validate_arguments(c.name, c.arguments)
            if err is not None:
                return f"Error: {err}"
        return None

    def _run_agent_calls(self, content: str | None, calls: list[ToolCallRequest]) -> list[dict]:
        from tau2.data_model.message import AssistantMessage, ToolCall

        amsg = AssistantMessage(role="assistant", content=content, tool_calls=None)
        accepted, tool_msgs, obs, unusable = [], [], [], []
        for c in calls:
            err = self._check_call(c, self._tool_names)
            if err is not None:
                self._errors += 1
                unusable.append(err)
                out = openai_tool_message(c.id, c.name, err)
            else:
                if c.name not in self._tool_names:  # tau2 answers it ("Error: Tool 'x' not found.")
                    unusable.append(f"Error: unknown tool {c.name!r}")
                tc = ToolCall(id=c.id, name=c.name, arguments=c.arguments, requestor="assistant")
                tm = self.domain.execute(self._episode, tc)
                accepted.append(tc)
                tool_msgs.append(tm)
                self._errors += bool(tm.error)
                if c.name == TRANSFER_TOOL and not tm.error and hasattr(self._user, "transferred"):
                    self._user.transferred = True
                out = openai_tool_message(c.id, c.name, tm.content)
            out["content"] = self._shown(out["content"])
            obs.append(out)
        if unusable:
            self._last_action_error = "; ".join(self._shown(u) for u in unusable)
        amsg.tool_calls = accepted or None
        if accepted or content is not None:
            self._trajectory.append(amsg)
            self._trajectory.extend(tool_msgs)
        self._messages.extend(obs)
        return obs

    def _shown(self, text: str) -> str:
        """``text`` cut to ``max_tool_result_chars`` characters, saying how many more there were."""
        if len(text) <= self.max_tool_result_chars:
            return text
        return text[: self.max_tool_result_chars] + f"\n[... {len(text) - self.max_tool_result_chars} more characters not shown]"

    def _user_turn(self, incoming: Any) -> tuple[list[dict], tuple[str, str] | None]:
        """Let the customer answer ``incoming`` (running its tool calls); returns the new
        agent-visible messages and ``(termination_reason, error text)`` if the episode ends."""
        from tau2.data_model.message import MultiToolMessage, ToolCall, ToolMessage, UserMessage
        from tau2.user.user_simulator import UserSimulator

        user_tools = frozenset(self.domain.user_tool_names)
        for _ in range(self.max_user_tool_rounds + 1):
            try:
                umsg, self._user_state = self._user.generate_next_message(incoming, self._user_state)
                umsg.validate()
            except Exception as e:
                return [], ("user_error", f"{type(e).__name__}: {e}")
            if not umsg.is_tool_call():
                self._trajectory.append(umsg)
                visible = {"role": "user", "content": umsg.content}
                self._messages.append(visible)
                if UserSimulator.is_stop(umsg):
                    return [visible], ("user_stop", "")
                return [visible], None
            accepted, results = [], []
            for tc in umsg.tool_calls:
                req = ToolCallRequest(tc.id, tc.name, tc.arguments if isinstance(tc.arguments, dict) else None)
                if req.arguments is None:
                    req.error = "the arguments must be a JSON object"
                err = self._check_call(req, user_tools)
                if err is not None:
                    results.append(ToolMessage(id=tc.id, role="tool", content=err, requestor="user", error=True))
                    continue
                call = ToolCall(id=tc.id, name=tc.name, arguments=tc.arguments, requestor="user")
                tm = self.domain.execute(self._episode, call)
                accepted.append(call)
                results.append(tm)
            if accepted or umsg.has_text_content():
                self._trajectory.append(
                    UserMessage(role="user", content=umsg.content, tool_calls=accepted or None, timestamp=umsg.timestamp)
                )
                self._trajectory.extend(r for r in results if r.id in {c.id for c in accepted})
            incoming = results[0] if len(results) == 1 else MultiToolMessage(role="tool", tool_messages=results)
        return [], ("user_error", f"the customer made more than {self.max_user_tool_rounds} tool-call rounds in a row")

    # ------------------------------------------------------------------------------------------
    # endings
    # ------------------------------------------------------------------------------------------
    def _after(self, obs: list[dict], ending: tuple[str, str] | None) -> tuple[list, float, bool, bool, dict]:
        if ending is not None:
            return self._finish(obs, ending[0], error=ending[1] or None)
        if self.max_errors is not None and self._errors >= self.max_errors:
            return self._finish(obs, "too_many_errors")
        if self._steps >= self.max_steps:
            return self._finish(obs, "max_steps")
        return obs, 0.0, False, False, self._info()

    def _evaluate(self, reason: str) -> tuple[Any, float, float]:
        """``(tau2 RewardInfo, tau2's reward, the progress reward)`` of the episode that ended with ``reason``."""
        from .rewards import partial_reward, tau2_reward, tau2_reward_reference

        if self.evaluator == "tau2":
            info = tau2_reward_reference(self.simulation_run(), self._task, self.domain_name, self.solo)
        else:
            info = tau2_reward(self.domain, self._task, self._episode.env, self._trajectory, reason)
        binary = float(info.reward)
        partial = float(partial_reward(self.domain, self._task, self._trajectory, info, binary, self._episode.env))
        return info, binary, partial

    def _finish(self, obs: list[dict], reason: str, error: str | None = None) -> tuple[list, float, bool, bool, dict]:
        self._done = True
        self.termination_reason = reason
        # tau2's evaluator reads the model's trajectory: whatever it raises is an observation (envs.contract, Graders)
        evaluated, failure = call_grader(self._evaluate, reason)
        if failure is None:
            info, binary, partial = evaluated
        else:
            from tau2.data_model.simulation import RewardInfo

            info, binary, partial = RewardInfo(reward=0.0, info={"note": failure[ACTION_ERROR]}), 0.0, 0.0
        self.reward_info = info
        self._end_info = {
            "termination_reason": reason,
            "reward_info": info.model_dump(mode="json"),
            "reward_binary": binary,
            "reward_partial": partial,
        }
        if reason == "user_error":
            self._end_info["user_error"] = error or "unknown customer failure"
        elif error:
            self._last_action_error = error
        if failure is not None:
            self._end_info.update({k: v for k, v in failure.items() if k != ACTION_ERROR})
            self._last_action_error = "; ".join(e for e in (self._last_action_error, failure[ACTION_ERROR]) if e)
        if self.reward_kind == "partial":
            reward = partial
        elif self.reward_kind == "partial_on_stop":
            from .rewards import PASSING_TERMINATIONS

            reward = binary if binary >= 1.0 else (PARTIAL_ON_STOP_WEIGHT * partial if reason in PASSING_TERMINATIONS
                                                    else 0.0)
        else:
            reward = binary
        return obs, reward, reason != "max_steps", reason == "max_steps", self._info()

    # ------------------------------------------------------------------------------------------
    # info, tau2 views, rendering
    # ------------------------------------------------------------------------------------------
    def _info(self) -> dict:
        info = {
            "messages": list(self._messages),
            "tools": self.tools,
            "task_id": self._task.id,
            "index": self._index,
            "split": self.split,
            "domain": self.domain_name,
            "user": self.user_kind,
            "step": self._steps,
            "num_errors": self._errors,
        }
        if self._last_action_error is not None:
            info["action_error"] = self._last_action_error
        if self._done:
            info.update(self._end_info)
        return info

    @property
    def task(self):
        """The current tau2 ``Task`` (``None`` before the first reset)."""
        return self._task

    @property
    def trajectory(self) -> list:
        """tau2 messages of the episode so far (what tau2's evaluator sees)."""
        return list(self._trajectory)

    @property
    def tau2_environment(self):
        """The live tau2 ``Environment`` of the episode."""
        return self._episode.env

    def simulation_run(self):
        """The episode as a tau2 ``SimulationRun`` (termination reason ``max_steps`` while running)."""
        from tau2.data_model.simulation import SimulationRun, TerminationReason

        return SimulationRun(
            id=str(uuid.uuid4()),
            task_id=self._task.id,
            start_time=self._start_time,
            end_time=_now(),
            duration=time.perf_counter() - self._start,
            termination_reason=TerminationReason(self.termination_reason or "max_steps"),
            messages=deepcopy(self._trajectory),
        )

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self._task is None:
            return None
        lines = []
        for m in self._messages:
            text = m.get("content") or ""
            for tc in m.get("tool_calls") or []:
                text += f"\n  -> {tc['function']['name']}({tc['function']['arguments']})"
            lines.append(f"[{m['role']}] {text}")
        return "\n".join(lines)


def _now() -> str:
    from tau2.utils.utils import get_now

    return get_now()


def _valid_user_history(m: Any) -> bool:
    from tau2.user.base import is_valid_user_history_message

    return is_valid_user_history_message(m)
