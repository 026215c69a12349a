"""Conversions between OpenAI-format chat dicts and tau2 message objects.

OpenAI format (what observations and ``info["messages"]`` hold)::

    {"role": "system" | "user" | "assistant", "content": str | None}
    {"role": "assistant", "content": str | None,
     "tool_calls": [{"id": str, "type": "function",
                     "function": {"name": str, "arguments": <JSON string>}}]}
    {"role": "tool", "tool_call_id": str, "name": str, "content": str}

tau2 messages (``tau2.data_model.message``) are pydantic objects with ``ToolCall.arguments`` as a
dict; they are what tau2's evaluator reads.
"""
from __future__ import annotations

import json
from typing import Any

__all__ = ["openai_tool_call", "openai_tool_message", "tau2_to_openai", "tau2_user_view"]


def openai_tool_call(call_id: str, name: str, arguments: dict) -> dict:
    """One OpenAI ``tool_calls`` entry; ``arguments`` is JSON-encoded (non-JSON values via ``str``)."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, default=str)},
    }


def openai_tool_message(call_id: str, name: str | None, content: str | None) -> dict:
    """An OpenAI ``tool`` message answering ``call_id``."""
    msg = {"role": "tool", "tool_call_id": call_id, "content": content if content is not None else ""}
    if name:
        msg["name"] = name
    return msg


def tau2_to_openai(message: Any, names: dict[str, str] | None = None) -> list[dict]:
    """A tau2 message as OpenAI dicts (a ``MultiToolMessage`` gives several).

    Args:
        message: a tau2 ``SystemMessage`` / ``UserMessage`` / ``AssistantMessage`` /
            ``ToolMessage`` / ``MultiToolMessage``.
        names: tool-call id -> tool name, used to fill ``name`` of tool messages.

    Raises:
        TypeError: not a tau2 message.
    """
    from tau2.data_model.message import (
        AssistantMessage,
        MultiToolMessage,
        SystemMessage,
        ToolMessage,
        UserMessage,
    )

    names = names or {}
    if isinstance(message, MultiToolMessage):
        return [m for tm in message.tool_messages for m in tau2_to_openai(tm, names)]
    if isinstance(message, ToolMessage):
        return [openai_tool_message(message.id, names.get(message.id), message.content)]
    if isinstance(message, SystemMessage):
        return [{"role": "system", "content": message.content}]
    if isinstance(message, (UserMessage, AssistantMessage)):
        out: dict = {"role": message.role, "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [openai_tool_call(tc.id, tc.name, tc.arguments) for tc in message.tool_calls]
            for tc in message.tool_calls:
                names[tc.id] = tc.name
        return [out]
    raise TypeError(f"not a tau2 message: {type(message).__name__}")


def tau2_user_view(messages: list) -> list[dict]:
    """tau2 user-simulator messages (already role-flipped) as clean OpenAI dicts."""
    names: dict[str, str] = {}
    out: list[dict] = []
    for m in messages:
        out.extend(tau2_to_openai(m, names))
    return out
