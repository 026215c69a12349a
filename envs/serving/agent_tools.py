"""A session's env as a set of tools an agent calls, the mapping both MCP routes share.

* The tools: the env's own tools (``info["tools"]``, OpenAI function schemas: name, description, ``parameters`` as
  the input schema) plus :data:`RESPOND_TOOL`, which sends a plain message to the customer.
* A call: one tool call becomes one env step. ``respond(content)`` is the assistant message ``content`` (parsed by
  the env like any model text, :mod:`envs.contract`); any other name is an assistant message holding that one OpenAI
  tool call (an unknown name or bad arguments are answered by the env's own tool error, as for any agent).
* Its result: the step's new messages -- the tool's output, or the customer's reply -- and whether the episode is
  over. Never the reward, the reward breakdown or any other ``info``: the agent under evaluation does not see its
  score; the evaluator reads it from ``GET /sessions/{id}/state``.
"""
from __future__ import annotations

import json
import uuid
from typing import Any

__all__ = ["RESPOND_TOOL", "agent_tools", "as_tool_call", "tool_call_action", "visible_result"]

#: The tool that sends a plain message to the customer (an MCP tool schema: name, description, input schema).
RESPOND_TOOL = {
    "name": "respond",
    "description": ("Send a plain message to the customer (not a tool call). With a simulated customer, their reply "
                    "is the result. To end the conversation, say goodbye as the task's policy asks (tau2: a message "
                    "containing ###STOP###)."),
    "inputSchema": {"type": "object", "properties": {"content": {"type": "string", "description": "the message"}},
                    "required": ["content"], "additionalProperties": False},
}


def agent_tools(openai_tools: list[dict] | None) -> list[dict]:
    """The MCP tool list of an env: each OpenAI function schema of ``openai_tools`` (``info["tools"]``) as
    ``{"name", "description", "inputSchema"}`` (the ``parameters`` unchanged), then :data:`RESPOND_TOOL`.

    Raises:
        ValueError: an env tool is named ``respond`` (it would shadow the message tool).
    """
    out = []
    for t in openai_tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else {}
        if fn.get("name") == RESPOND_TOOL["name"]:
            raise ValueError("the env has a tool named 'respond', the name of the message tool")
        out.append({"name": fn.get("name", ""), "description": fn.get("description") or "",
                    "inputSchema": fn.get("parameters") or {"type": "object", "properties": {}}})
    return out + [RESPOND_TOOL]


def tool_call_action(name: str, arguments: dict | None) -> dict:
    """The env action (a :class:`envs.serve.TextAction` dict) of one tool call.

    Raises:
        ValueError: ``respond`` without a string ``content``, or with another argument; ``arguments`` not an object.
    """
    if arguments is not None and not isinstance(arguments, dict):
        raise ValueError(f"tool arguments must be an object, got {type(arguments).__name__}")
    arguments = arguments or {}
    if name == RESPOND_TOOL["name"]:
        if set(arguments) != {"content"} or not isinstance(arguments["content"], str):
            raise ValueError('respond takes one argument, {"content": "<the message>"}')
        return {"content": arguments["content"]}
    call = {"id": f"mcp_{uuid.uuid4().hex[:12]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
    return {"content": None, "tool_calls": [call]}


def as_tool_call(message: dict) -> tuple[str, dict]:
    """The inverse of :func:`tool_call_action`: an assistant message with one tool call (e.g. a gold action of
    :func:`envs.tau2.oracle.oracle_actions`) as ``(name, arguments)``, a message without one as ``("respond",
    {"content": ...})``.

    Raises:
        ValueError: the message holds more than one tool call (one MCP call is one tool call).
    """
    calls = message.get("tool_calls") or []
    if not calls:
        return RESPOND_TOOL["name"], {"content": message.get("content") or ""}
    if len(calls) > 1:
        raise ValueError(f"one MCP call is one tool call; this message holds {len(calls)}")
    fn = calls[0]["function"]
    args = fn.get("arguments") or {}
    return fn["name"], json.loads(args) if isinstance(args, str) else args


def visible_result(step_reply: dict) -> tuple[str, dict, bool]:
    """What the agent sees of one step: ``(text, structured, is_error)``.

    ``step_reply`` is a step's reply as the HTTP routes send it (OpenEnv's ``{"observation": {"messages", "info",
    ...}, "reward", "done"}``). ``text`` is the new messages' contents (one per line, each prefixed by its role when
    several roles answered), ``structured`` ``{"messages", "done"}``, ``is_error`` whether the env named an
    ``action_error`` (a malformed or unknown call: the text is the env's tool error). The reward and ``info`` are
    dropped.
    """
    obs = step_reply.get("observation") or {}
    messages = obs.get("messages") or []
    roles = {m.get("role") for m in messages}
    lines = [(f"{m.get('role')}: " if len(roles) > 1 else "") + _text(m.get("content")) for m in messages]
    done = bool(step_reply.get("done"))
    return "\n".join(lines), {"messages": messages, "done": done}, bool((obs.get("info") or {}).get("action_error"))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else json.dumps(content, ensure_ascii=False, default=str)
