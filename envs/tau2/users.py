"""The customer side of a tau2 conversation.

All users implement tau2's ``tau2.user.base.BaseUser`` interface (``get_init_state``,
``generate_next_message(message, state) -> (UserMessage, state)``, ``is_stop``), so the
environment drives them exactly like tau2's orchestrator does:

- :class:`ScriptedUser` (``user="scripted"``): offline and deterministic. It opens with the
  task's reason for calling and known information (rewritten in the first person), says "yes"
  to confirmation requests, repeats its known information when asked a question, ends the call
  (``###STOP###``) when the agent closes the conversation ("anything else", "goodbye", ...) or
  after ``max_turns`` replies (it reads the last :data:`READ_CHARS` characters of a message), and answers ``###TRANSFER###`` once the agent has transferred it
  to a human. It cannot operate a phone (telecom user tools): telecom tasks need ``user="solo"``,
  ``"llm"`` or a ``user_fn``.
- tau2's :class:`tau2.user.user_simulator.UserSimulator` (``user="llm"``): an LLM through
  litellm, here pointed at any OpenAI-compatible endpoint by :func:`make_llm_user`.
- :class:`CallableUser` (``user_fn=...``): tau2's ``UserSimulator`` prompt and state, with the
  generation replaced by a Python callable (e.g. a local model in the trainer).

Stop signals are tau2's: ``###STOP###``, ``###TRANSFER###``, ``###OUT-OF-SCOPE###``.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Optional

from tau2.data_model.message import MultiToolMessage, ToolCall, UserMessage
from tau2.user.base import STOP, TRANSFER, BaseUser, UserState
from tau2.user.user_simulator import UserSimulator

from .actions import parse_action
from .messages import tau2_user_view

__all__ = ["ScriptedUser", "CallableUser", "make_llm_user", "first_person", "UserFn"]

#: ``user_fn(messages, tools) -> str | dict``: ``messages`` are OpenAI dicts from the user's
#: side (system prompt = tau2's user-simulator guidelines + the task scenario; the agent speaks
#: as ``"user"``, the simulated customer as ``"assistant"``); ``tools`` are the customer's
#: OpenAI tool schemas (telecom) or ``None``. Return the customer's reply text (tool calls in any
#: format :func:`envs.tau2.actions.parse_action` reads) or a message dict with
#: ``content``/``tool_calls``.
UserFn = Callable[[list, Optional[list]], Any]

_PRONOUNS = [
    (r"\bYou are\b", "I am"),
    (r"\byou are\b", "I am"),
    (r"\bYou were\b", "I was"),
    (r"\byou were\b", "I was"),
    (r"\bYou're\b", "I'm"),
    (r"\byou're\b", "I'm"),
    (r"\bYou've\b", "I've"),
    (r"\byou've\b", "I've"),
    (r"\bYou'd\b", "I'd"),
    (r"\byou'd\b", "I'd"),
    (r"\bYou'll\b", "I'll"),
    (r"\byou'll\b", "I'll"),
    (r"\bYourself\b", "Myself"),
    (r"\byourself\b", "myself"),
    (r"\bYours\b", "Mine"),
    (r"\byours\b", "mine"),
    (r"\bYour\b", "My"),
    (r"\byour\b", "my"),
    (r"\bYou\b", "I"),
    (r"\byou\b", "I"),
]
_PRONOUN_RES = [(re.compile(p), r) for p, r in _PRONOUNS]

#: How much of an agent message (its last characters) the scripted customer reads.
READ_CHARS = 4000

_CLOSING_RE = re.compile(
    r"anything else|is there something else|have a (?:great|nice|good|wonderful) day|goodbye|good bye|"
    r"thank you for (?:contacting|calling|reaching)",
    re.IGNORECASE,
)
_CONFIRM_RE = re.compile(
    r"\bconfirm|\bproceed\b|\bshall i\b|\bshould i\b|\bwould you like\b|\bdo you want\b|\(yes/no\)|\byes or no\b|"
    r"\bcan you confirm\b|\bok to\b|\bokay to\b|\bgo ahead\b",
    re.IGNORECASE,
)


def first_person(text: str) -> str:
    """Rough rewrite of tau2's second-person instructions into the customer's first person.

    ``"You are Raj Sanchez. Your user id is raj_1."`` -> ``"I am Raj Sanchez. My user id is raj_1."``
    (word-level pronoun swaps; object pronouns become "I" too, so the result is approximate).
    """
    for pattern, repl in _PRONOUN_RES:
        text = pattern.sub(repl, text)
    return text


class ScriptedUser(BaseUser):
    """Deterministic offline customer (see the module docstring for its rules).

    Args:
        instructions: the task's ``user_scenario.instructions`` (tau2
            ``StructuredUserInstructions`` or a plain string).
        max_turns: replies after which the customer ends the call with ``###STOP###``.

    Attributes:
        transferred: set by the environment when the agent's ``transfer_to_human_agents`` call
            succeeded; the next reply is ``###TRANSFER###``.
    """

    def __init__(self, instructions: Any, max_turns: int = 20):
        super().__init__(instructions=instructions, llm=None, llm_args=None)
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = int(max_turns)
        self.transferred = False
        if isinstance(instructions, str):
            self.opening = first_person(instructions.strip())
            self.known = ""
        else:
            reason = first_person(instructions.reason_for_call.strip())
            known = first_person(instructions.known_info.strip()) if instructions.known_info else ""
            self.opening = f"Hi! {reason}" + (f"\n{known}" if known else "")
            self.known = known

    def get_init_state(self, message_history: Optional[list] = None) -> UserState:
        return UserState(system_messages=[], messages=list(message_history or []))

    @classmethod
    def is_stop(cls, message: UserMessage) -> bool:
        return UserSimulator.is_stop(message)

    def set_seed(self, seed: int) -> None:  # deterministic: nothing to seed
        pass

    def reply(self, agent_text: str, n_replies: int) -> str:
        """The customer's reply to ``agent_text`` given ``n_replies`` earlier replies.

        Only the last :data:`READ_CHARS` characters of ``agent_text`` are read (closing and confirmation phrases end
        a message), so a message of any length costs the same: the phrase regexes took 1.2 s on a 1 MB message."""
        if n_replies == 0:
            return self.opening
        if self.transferred:
            return TRANSFER
        agent_text = agent_text[-READ_CHARS:]
        if n_replies >= self.max_turns or _CLOSING_RE.search(agent_text):
            return f"No, that's all. Thank you! {STOP}"
        if _CONFIRM_RE.search(agent_text):
            return "Yes, please go ahead."
        if "?" in agent_text:
            return self.known or "I don't know, sorry."
        return "Okay."

    def generate_next_message(self, message: Any, state: UserState) -> tuple[UserMessage, UserState]:
        if isinstance(message, MultiToolMessage):
            state.messages.extend(message.tool_messages)
        elif message is not None:
            state.messages.append(message)
        n = sum(1 for m in state.messages if isinstance(m, UserMessage))
        text = getattr(message, "content", None) or ""
        out = UserMessage(role="user", content=self.reply(text, n))
        state.messages.append(out)
        return out, state


class CallableUser(UserSimulator):
    """tau2's ``UserSimulator`` whose LLM call is replaced by ``fn`` (see :data:`UserFn`).

    The prompt (tau2's simulation guidelines + scenario) and the conversation state are tau2's;
    only the generation differs. Raw-text replies are parsed for tool calls with
    :func:`envs.tau2.actions.parse_action` when the customer has tools; malformed ones are
    dropped from the reply (the customer is not trained).

    Raises (from ``generate_next_message``):
        RuntimeError: ``fn`` raised, or returned something that is neither text nor a message.
    """

    def __init__(self, fn: UserFn, instructions: Any, tools: Optional[list] = None):
        super().__init__(tools=tools, instructions=instructions, llm=None, llm_args=None)
        if not callable(fn):
            raise TypeError(f"user_fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        self._tool_schemas = [t.openai_schema for t in tools] if tools else None
        self._tool_names = [t.name for t in tools] if tools else []

    def set_seed(self, seed: int) -> None:
        pass

    def _generate_next_message(self, message: Any, state: UserState) -> tuple[UserMessage, UserState]:
        if isinstance(message, MultiToolMessage):
            state.messages.extend(message.tool_messages)
        else:
            state.messages.append(message)
        view = tau2_user_view(state.system_messages + state.flip_roles())
        try:
            reply = self.fn(view, self._tool_schemas)
        except Exception as e:
            raise RuntimeError(f"user_fn raised {type(e).__name__}: {e}") from e
        n = sum(1 for m in state.messages if isinstance(m, UserMessage))
        parsed = parse_action(reply, id_prefix=f"user_call_{n}", tool_names=self._tool_names or None)
        if parsed.error is not None:
            raise RuntimeError(f"user_fn returned an unusable reply: {parsed.error}")
        calls = [
            ToolCall(id=c.id, name=c.name, arguments=c.arguments, requestor="user")
            for c in parsed.tool_calls
            if c.ok and self._tool_names and c.name in self._tool_names
        ]
        content = parsed.content
        if not calls and content is None:
            raise RuntimeError(f"user_fn returned an empty reply: {reply!r:.200}")
        out = UserMessage(role="user", content=content, tool_calls=calls or None)
        state.messages.append(out)
        return out, state


def make_llm_user(
    instructions: Any,
    tools: Optional[list],
    model: str,
    base_url: str | None = None,
    llm_args: dict | None = None,
) -> UserSimulator:
    """tau2's LLM user simulator against an OpenAI-compatible endpoint (via litellm).

    Args:
        instructions: the task's ``user_scenario`` (tau2 passes the whole scenario).
        tools: the customer's tau2 ``Tool`` objects (telecom) or ``None``.
        model: litellm model name. With ``base_url`` the endpoint is treated as OpenAI-compatible:
            an ``"openai/"`` prefix is added when missing.
        base_url: ``api_base`` of the endpoint (e.g. ``"http://127.0.0.1:8000/v1"``).
        llm_args: extra litellm ``completion`` arguments (``temperature``, ``max_tokens``,
            ``timeout``, ``num_retries``, ``api_key``, ...). Default ``{"temperature": 0.0}``
            (tau2's default). Without ``api_key`` and without ``$OPENAI_API_KEY``, the placeholder
            ``"EMPTY"`` is sent (local servers ignore it).
    """
    args = {"temperature": 0.0}
    args.update(llm_args or {})
    if base_url:
        args["api_base"] = base_url
        if not model.startswith("openai/"):
            model = f"openai/{model}"
        if "api_key" not in args and "OPENAI_API_KEY" not in os.environ:
            args["api_key"] = "EMPTY"
    return UserSimulator(tools=tools or None, instructions=instructions, llm=model, llm_args=args)
