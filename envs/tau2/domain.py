"""Per-domain runtime shared by all environments of a process.

:func:`get_domain` returns one :class:`Tau2Domain` per domain name (cached): it loads the
domain's database once through tau2's registry constructor, keeps copy-on-write snapshots of
the agent and user databases (:mod:`envs.tau2.cow`), the policies, tool schemas, tool types
and argument models, and builds per episode

- a fresh tau2 ``Environment`` (the registry constructor, given a copy-on-write database copy)
  in the task's initial state (``Environment.set_state`` as tau2's orchestrator does), and
- the gold reference of a task (the gold actions replayed on a fresh environment the way tau2's
  ``EnvironmentEvaluator`` does), cached per task object as a small database delta (not per task id: a task
  file may reuse a registry task's id for another task).

Tool calls go through :meth:`Tau2Domain.execute`: argument validation against the tool's own
pydantic parameter model (strict, unknown keys rejected) *before* tau2 runs anything, so a
malformed call can never touch the database, then tau2's ``Environment.get_response``.

Bounded tools (:data:`ARGUMENT_BOUNDS`, checked by :meth:`Tau2Domain.validate_arguments`): tau2's
``calculate`` (airline, retail) runs ``eval`` on any string of digits and ``+-*/(). ``, so ``**`` is
allowed and ``"9**9**8"`` (7 characters) computes a 43-million-digit integer, holding the GIL for
80 s (``9**9**9``: ~40 min); without ``**`` a long product still grows with its length (250
factors of 4,000 digits: 8.5 s, measured on a loaded 2-core machine). We refuse an expression with
``**`` or longer than :data:`MAX_CALCULATE_CHARS` characters with an ``Error:`` tool message before
tau2 evaluates it; within these bounds the result is at most ~1,000 digits and costs microseconds.
This diverges from tau2 only for such expressions. Gold actions do call ``calculate`` (base: 1 airline task, 12 retail
tasks; 30 calls counting every split), but none with ``**`` or over 1,000 characters, and none in a task whose
reward basis includes ACTION (all are DB + COMMUNICATE), so rewards of gold trajectories are unchanged (the
gold-replay parity tests, ``tests/test_tau2_gold.py``).
"""
from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from copy import deepcopy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .cow import CowMode, DBSnapshot, db_hash
from .logs import set_tau2_logging, tau2_logging_default
from .tasks import DOMAINS

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.message import ToolCall, ToolMessage
    from tau2.data_model.tasks import Task
    from tau2.environment.environment import Environment

__all__ = ["Tau2Domain", "get_domain", "GoldReference", "Episode", "STOP_TOOL", "STOP_TOKEN", "TRANSFER_TOOL",
           "ARGUMENT_BOUNDS", "MAX_CALCULATE_CHARS"]

#: Name of the tool that ends the episode (tau2's ``LLMSoloAgent`` / ``GymAgent`` convention).
STOP_TOOL = "done"
#: tau2's stop token: an agent message containing it ends the episode.
STOP_TOKEN = "###STOP###"
#: tau2's transfer tool (airline, retail, telecom, mock).
TRANSFER_TOOL = "transfer_to_human_agents"

#: Longest expression the ``calculate`` tool evaluates (characters). Realistic ones ("(299.99 + 45.5) * 0.9")
#: have tens; at this bound the result has at most ~1,000 digits.
MAX_CALCULATE_CHARS = 1000


def _bound_calculate(arguments: dict) -> str | None:
    expression = arguments.get("expression")
    if not isinstance(expression, str):
        return None  # the parameter model has already answered
    if "**" in expression:
        return "calculate does not support exponentiation ('**'): write the product out, e.g. '1.1 * 1.1'"
    if len(expression) > MAX_CALCULATE_CHARS:
        return f"the expression is too long for calculate ({len(expression)} characters; at most {MAX_CALCULATE_CHARS})"
    return None


#: Tool name -> a check of its (already schema-valid) arguments that bounds what tau2 would compute; returns the
#: error text or ``None``. Applies to the tool of that name in every domain.
ARGUMENT_BOUNDS: dict[str, Callable[[dict], str | None]] = {"calculate": _bound_calculate}

# Domains whose registry constructor accepts solo_mode=True (tau2 raises for airline/retail).
_SOLO_DOMAINS = ("telecom", "mock")


def _stop_tool_schema() -> dict:
    from tau2.environment.tool import as_tool

    def done() -> str:
        """Call this function when you are done with the task."""
        return STOP_TOKEN

    return as_tool(done).openai_schema


@dataclass
class GoldReference:
    """What the agent and user databases must equal at the end of a task (tau2's DB check).

    Either ``agent_delta``/``user_delta`` (copy-on-write deltas, see
    :meth:`envs.tau2.cow.DBSnapshot.delta`) or ``agent_hash``/``user_hash`` (tau2 hashes) are set.
    """

    agent_delta: dict | None
    user_delta: dict | None
    agent_hash: str | None
    user_hash: str | None


@dataclass
class Episode:
    """A live tau2 environment and its copy-on-write mode (``None`` when the DB is not COW)."""

    env: "Environment"
    mode: CowMode | None


class Tau2Domain:
    """Everything about one tau2 domain that does not change between episodes.

    Args:
        name: ``"airline"``, ``"retail"``, ``"telecom"`` or ``"mock"``.

    Raises:
        ValueError: unknown domain.
    """

    def __init__(self, name: str):
        if name not in DOMAINS:
            raise ValueError(f"unknown tau2 domain {name!r}; expected one of {DOMAINS}")
        set_tau2_logging(tau2_logging_default())
        from tau2.environment.environment import Environment
        from tau2.environment.toolkit import ToolType
        from tau2.registry import registry

        self.name = name
        self.constructor = registry.get_env_constructor(name)
        base = self.constructor()  # reads the database files once
        self.supports_solo = name in _SOLO_DOMAINS
        self.agent_snapshot = DBSnapshot(base.tools.db)
        user_db = base.user_tools.db if base.user_tools is not None else None
        self.user_snapshot = DBSnapshot(user_db) if user_db is not None else None
        # READ tools may share records with the pristine DB only if nothing else mutates the DB
        # as a side effect of a call (tau2's sync_tools hook, overridden by telecom).
        self._share_reads_ok = type(base).sync_tools is Environment.sync_tools
        self._read_tools = {n for n in base.tools.tools if base.tools.tool_type(n) == ToolType.READ}
        #: names of the agent's tau2 tools of type READ (they never change the database)
        self.read_tool_names = frozenset(self._read_tools)
        kits = [base.tools] + ([base.user_tools] if base.user_tools is not None else [])
        #: names of tau2 tools of type WRITE (agent and user tool kits), for the partial reward
        self.write_tool_names = frozenset(n for kit in kits for n in kit.tools if kit.tool_type(n) == ToolType.WRITE)
        agent_tools = base.get_tools()
        user_tools = base.get_user_tools() if base.user_tools is not None else []
        self.agent_tool_names = tuple(t.name for t in agent_tools)
        self.user_tool_names = tuple(t.name for t in user_tools)
        self.params = {t.name: t.params for t in agent_tools + user_tools}
        self._agent_schemas = [t.openai_schema for t in agent_tools]
        self._user_schemas = [t.openai_schema for t in user_tools]
        self.user_tool_objects = user_tools  # tau2 Tool objects, for tau2's UserSimulator
        self._stop_schema = _stop_tool_schema()
        self._policies: dict[bool, str] = {False: base.get_policy()}
        self._gold: dict[int, GoldReference] = {}  # id(task) -> its reference (see gold())
        self._lock = threading.RLock()  # re-entrant: a finalizer of _remember may run while it holds it

    # -- prompt and tools --------------------------------------------------------------------
    def policy(self, solo: bool) -> str:
        """The domain policy text (tau2's solo variant for ``solo=True``)."""
        if solo not in self._policies:
            self._check_solo(solo)
            self._policies[solo] = self.constructor(solo_mode=True).get_policy()
        return self._policies[solo]

    def _check_solo(self, solo: bool) -> None:
        if solo and not self.supports_solo:
            raise ValueError(
                f"tau2 domain {self.name!r} has no solo mode (tau2 supports it for {_SOLO_DOMAINS}); "
                "use user='scripted', 'llm' or a user_fn"
            )

    def tool_schemas(self, solo: bool, stop_tool: bool = True) -> list[dict]:
        """OpenAI tool schemas offered to the agent (user tools too in solo mode, plus ``done``)."""
        schemas = list(self._agent_schemas)
        if solo:
            schemas += self._user_schemas
        if stop_tool:
            schemas.append(self._stop_schema)
        return schemas

    def agent_tool_set(self, solo: bool) -> frozenset[str]:
        """Names of the tools the agent may call (without ``done``)."""
        return frozenset(self.agent_tool_names + (self.user_tool_names if solo else ()))

    def system_prompt(self, task: "Task", solo: bool, with_ticket: bool = True) -> str:
        """tau2's agent system prompt: instructions + policy (+ the ticket in solo mode; ``with_ticket=False``: tau2's
        solo prompt up to its ``<ticket>`` block, which :meth:`ticket_message` then carries).

        Uses tau2's own templates (``tau2.agent.llm_agent``): ``SYSTEM_PROMPT`` with
        ``AGENT_INSTRUCTION`` for conversations, ``SYSTEM_PROMPT_SOLO`` with
        ``AGENT_SOLO_INSTRUCTION`` (stop tool ``done``) for solo tickets.

        Raises:
            ValueError: solo mode requested for a domain without it, or for a task without ticket.
        """
        from tau2.agent.llm_agent import (
            AGENT_INSTRUCTION,
            AGENT_SOLO_INSTRUCTION,
            SYSTEM_PROMPT,
            SYSTEM_PROMPT_SOLO,
        )

        if not solo:
            return SYSTEM_PROMPT.format(domain_policy=self.policy(False), agent_instruction=AGENT_INSTRUCTION)
        self._check_solo(True)
        if not task.ticket:
            raise ValueError(f"tau2 task {task.id!r} of {self.name!r} has no ticket; it cannot run in solo mode")
        instruction = AGENT_SOLO_INSTRUCTION.format(stop_function_name=STOP_TOOL, stop_token=STOP_TOKEN)
        template = SYSTEM_PROMPT_SOLO if with_ticket else SYSTEM_PROMPT_SOLO.split("<ticket>")[0].rstrip()
        return template.format(agent_instruction=instruction, domain_policy=self.policy(True), ticket=task.ticket)

    @staticmethod
    def ticket_message(task: "Task") -> dict:
        """The ticket as the first user message (``Tau2Env(solo_ticket="user")``), in tau2's own ``<ticket>`` tags."""
        return {"role": "user", "content": f"<ticket>\n{task.ticket}\n</ticket>"}

    # -- environments ------------------------------------------------------------------------
    def new_environment(self, solo: bool = False) -> Episode:
        """A fresh tau2 ``Environment`` over copy-on-write copies of the databases."""
        self._check_solo(solo)
        db, mode = self.agent_snapshot.fresh()
        kwargs: dict[str, Any] = {"db": db}
        if self.user_snapshot is not None:
            kwargs["user_db"], _ = self.user_snapshot.fresh()
        env = self.constructor(**kwargs)
        if solo:
            # What tau2's constructor does for solo_mode=True (solo policy + Environment.solo_mode),
            # without re-running validate_solo_mode, which rebuilds every Tool object (~0.15 s);
            # it was checked once when the solo policy was loaded.
            env.policy = self.policy(True)
            env.solo_mode = True
        return Episode(env, mode if self.agent_snapshot.cow_fields else None)

    def start(self, task: "Task", solo: bool = False) -> Episode:
        """A fresh environment in ``task``'s initial state (data, actions, message history),
        exactly as tau2's orchestrator initializes it."""
        ep = self.new_environment(solo)
        _set_initial_state(ep.env, task)
        return ep

    # -- tool execution ----------------------------------------------------------------------
    def validate_arguments(self, name: str, arguments: dict) -> str | None:
        """Check ``arguments`` against tool ``name``'s parameter model (pydantic, strict), then against the tool's
        cost bound in :data:`ARGUMENT_BOUNDS` (``calculate``: no ``**``, at most :data:`MAX_CALCULATE_CHARS`).

        Returns:
            ``None`` if valid (or the tool is unknown: tau2 answers that itself), else an error text.
        """
        model = self.params.get(name)
        if model is None:
            return None
        unknown = sorted(set(arguments) - set(model.model_fields))
        if unknown:
            return f"unexpected argument(s) {unknown} for tool '{name}'; expected {sorted(model.model_fields)}"
        try:
            model.model_validate(arguments, strict=True)
        except Exception as e:  # pydantic.ValidationError
            errors = getattr(e, "errors", None)
            if callable(errors):
                parts = [f"{'.'.join(str(x) for x in err.get('loc', ())) or '<root>'}: {err.get('msg')}" for err in errors()]
                return f"invalid arguments for tool '{name}': " + "; ".join(parts)
            return f"invalid arguments for tool '{name}': {e}"
        bound = ARGUMENT_BOUNDS.get(name)
        return bound(arguments) if bound is not None else None

    def execute(self, episode: Episode, tool_call: "ToolCall") -> "ToolMessage":
        """Run a (validated) tool call through tau2's ``Environment.get_response``.

        READ tools of domains without a ``sync_tools`` side effect run with shared (uncopied)
        records; everything else copies records before they can change.
        """
        with self._reading(episode, tool_call.name, tool_call.requestor):
            return episode.env.get_response(tool_call)

    def _reading(self, episode: Episode, name: str, requestor: str):
        """Context sharing pristine records while a READ tool of the agent's kit runs."""
        share = (
            episode.mode is not None
            and self._share_reads_ok
            and requestor == "assistant"
            and name in self._read_tools
        )
        return episode.mode.reading(share) if episode.mode is not None else contextlib.nullcontext()

    # -- gold reference ----------------------------------------------------------------------
    def _build_gold(self, task: "Task") -> "Environment":
        """tau2's gold environment: initial state + gold actions (errors ignored, as tau2 does)."""
        ep = self.new_environment(solo=False)
        _set_initial_state(ep.env, task)
        criteria = task.evaluation_criteria
        for action in (criteria.actions or []) if criteria is not None else []:
            try:
                with self._reading(ep, action.name, action.requestor):
                    ep.env.make_tool_call(tool_name=action.name, requestor=action.requestor, **action.arguments)
            except Exception:
                pass
        return ep.env

    def _reference(self, env: "Environment") -> GoldReference:
        agent_db = env.tools.db
        user_db = env.user_tools.db if env.user_tools is not None else None
        agent_delta = self.agent_snapshot.delta(agent_db)
        user_delta = self.user_snapshot.delta(user_db) if self.user_snapshot is not None else None
        return GoldReference(
            agent_delta=agent_delta,
            user_delta=user_delta,
            agent_hash=db_hash(agent_db) if agent_delta is None else None,
            user_hash=db_hash(user_db) if user_delta is None else None,
        )

    def _remember(self, task: "Task", ref: GoldReference) -> None:
        key = id(task)
        with self._lock:
            if key in self._gold:
                return
            try:  # the entry goes with the task object, so its id() is never reused while the entry exists
                weakref.finalize(task, self._forget, key)
            except TypeError:  # an object without weak references: not kept (built again when asked)
                return
            self._gold[key] = ref

    def _forget(self, key: int) -> None:
        with self._lock:
            self._gold.pop(key, None)

    def gold(self, task: "Task") -> GoldReference:
        """The gold database reference of ``task``, built once per task object per process.

        Kept per task *object* (while it lives), not per task id: two task sets may hold different tasks under one
        id (a task file's ``create_task_1`` and tau2 mock's), and each must be graded by its own gold actions.
        """
        ref = self._gold.get(id(task))
        if ref is None:
            ref = self._reference(self._build_gold(task))
            self._remember(task, ref)
        return ref

    def check_gold(self, task: "Task") -> list[tuple[str, str]]:
        """Build ``task``'s gold reference (kept, as :meth:`gold` keeps it) and run each of its env assertions on
        the gold end state, as the reward runs them on an episode's end state.

        Returns:
            ``(field, text)`` per problem: the initial state cannot be set (``"initial_state"``: tau2 would raise
            at every reset), an env assertion raises or returns no bool
            (``"evaluation_criteria.env_assertions[k]"``: the reward would read it as unmet). ``[]`` when none.
            Gold actions that fail are not problems: tau2 ignores their errors (23 of retail's tasks have one).
        """
        try:
            env = self._build_gold(task)
        except Exception as e:  # whatever tau2's set_state raises on this task's data
            return [("initial_state", f"cannot be set on a fresh environment ({_short(e)})")]
        self._remember(task, self._reference(env))
        out = []
        criteria = task.evaluation_criteria
        for k, assertion in enumerate((criteria.env_assertions or []) if criteria is not None else []):
            try:
                env.run_env_assertion(assertion, raise_assertion_error=False)
            except Exception as e:
                out.append((f"evaluation_criteria.env_assertions[{k}]",
                            f"{assertion.func_name!r} ({assertion.env_type} tools) cannot run on the gold end state "
                            f"({_short(e)})"))
        return out

    def db_matches_gold(self, env: "Environment", task: "Task") -> bool:
        """tau2's DB check: agent and user database hashes equal the gold environment's."""
        ref = self.gold(task)
        gold_env = None
        results = []
        for snap, live, delta, ghash, attr in (
            (self.agent_snapshot, env.tools.db, ref.agent_delta, ref.agent_hash, "tools"),
            (
                self.user_snapshot,
                env.user_tools.db if env.user_tools is not None else None,
                ref.user_delta,
                ref.user_hash,
                "user_tools",
            ),
        ):
            if snap is None:
                results.append(live is None)
                continue
            live_delta = snap.delta(live) if delta is not None else None
            if delta is not None and live_delta is not None:
                results.append(snap.same(live_delta, delta))
                continue
            if ghash is None:  # gold kept only a delta but live is not a copy: rebuild once
                gold_env = gold_env or self._build_gold(task)
                ghash = db_hash(getattr(gold_env, attr).db)
            results.append(db_hash(live) == ghash)
        return all(results)


def _short(e: BaseException, limit: int = 300) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= limit else text[:limit] + "..."


def _set_initial_state(env: "Environment", task: "Task") -> None:
    state = task.initial_state
    if state is None:
        env.sync_tools()
        return
    env.set_state(
        initialization_data=state.initialization_data,
        initialization_actions=state.initialization_actions,
        message_history=deepcopy(state.message_history) if state.message_history else [],
    )


@functools.lru_cache(maxsize=None)
def get_domain(name: str) -> Tau2Domain:
    """The process-wide :class:`Tau2Domain` of ``name`` (built on first use).

    Raises:
        ValueError: unknown domain.
    """
    return Tau2Domain(name)
