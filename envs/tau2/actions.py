"""Parse an agent's turn -- raw model text or an assistant message dict -- into tool calls.

Accepted forms (DESIGN.md, env contract):

1. An assistant message dict in OpenAI format: ``{"role": "assistant", "content": str | None,
   "tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}]}``; the flat
   ``{"name", "arguments"}`` form is accepted inside ``tool_calls`` too. ``arguments`` may be a
   JSON string or a dict. Without ``tool_calls``, ``content`` is parsed as raw text (below).
2. Raw text, parsed the way the model family writes tool calls:

   - Hermes / Qwen2.5 / Qwen3: one or more ``<tool_call>{"name": ..., "arguments": {...}}
     </tool_call>`` blocks (a final block left unclosed at end of generation is accepted); the
     text outside the blocks is the message content.
   - Bare JSON: the whole text (optionally in a ``json`` code fence) is ``{"name": ...,
     "arguments": {...}}`` or a list of such objects.
   - tau2's functional syntax ``name(arg=value, ...)`` (one call per line, parsed with tau2's
     own :func:`tau2.utils.tools.parse_functional_tool_call`), recognised only when ``name`` is
     a known tool, so prose such as ``Sure (one moment)`` stays prose.
   - Anything else is a message to the user.

``<think>...</think>`` reasoning blocks are removed from the content first. ``"parameters"`` is
accepted as a synonym of ``"arguments"`` and a JSON-encoded string of an object is decoded.

Nothing here raises on bad input: a call that cannot be understood becomes a
:class:`ToolCallRequest` with ``error`` set, which the environment answers with a tool error
message (and never executes). Hostile input is bounded before it is decoded
(:mod:`envs.action_text`): lone UTF-16 surrogates in the text, the names, ids and arguments
become U+FFFD (a reply holding one cannot be encoded), and JSON nested deeper than
:data:`~envs.action_text.MAX_JSON_DEPTH` levels (the call object included) is a malformed call,
refused before ``json.loads`` (which raises ``RecursionError`` near 1,000 levels); so is an
integer of more than ~4,200 digits (``json.loads`` raises ``ValueError`` on it). tau2's own
parsing (``json.loads`` in its agents) has none of these bounds.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from envs.action_text import UnusableJSON, clean_text, clean_value, loads_bounded

__all__ = ["ToolCallRequest", "ParsedAction", "parse_action", "TOOL_CALL_FORMAT_HINT"]

#: Appended to parse errors so that a policy can learn the expected format.
TOOL_CALL_FORMAT_HINT = (
    'Write a tool call as <tool_call>{"name": "<tool name>", "arguments": {<JSON object>}}</tool_call>.'
)

_THINK_RE = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL)
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_NAME_RE = re.compile(r'"name"\s*:\s*"([^"]*)"')
_FUNCTIONAL_RE = re.compile(r"^(\w+)\s*\(.*\)$", re.DOTALL)


def _unfence(body: str) -> str:
    r"""The inside of a code fence, ``body`` itself when it is not fenced; ``body`` is stripped.

    A fence is ``body`` starting and ending with three backticks (at least six characters); an opening ``json`` /
    ``JSON`` tag is dropped and the inside is stripped: what ``re.match(r"^```(?:json|JSON)?\s*
?(.*?)
?```$",
    body, re.DOTALL).group(1).strip()`` gave, in linear time. That pattern let ``\s*`` and ``(.*?)`` share every
    whitespace character, so three backticks, 24k newlines and ``x`` took 5.6 s (quadratic: hours at 1 MiB). Issue 34.
    """
    if len(body) < 6 or not body.startswith("```") or not body.endswith("```"):
        return body
    inner = body[3:-3]
    if inner.startswith(("json", "JSON")):
        inner = inner[4:]
    return inner.strip()


@dataclass
class ToolCallRequest:
    """One tool call as the agent wrote it.

    Attributes:
        id: tool-call id (the agent's, or ``"{id_prefix}_{i}"``).
        name: tool name, or ``None`` if none could be read.
        arguments: the arguments as a dict, or ``None`` when they could not be parsed.
        error: why the call is malformed (``None`` for a well-formed call). Whether the tool
            exists and the arguments are valid is decided by the environment, not here.
        raw: the arguments as written (JSON text), or the raw call text when unparsable; used to
            record malformed calls faithfully in the conversation.
    """

    id: str
    name: str | None
    arguments: dict | None
    error: str | None = None
    raw: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class ParsedAction:
    """An agent turn split into the text for the user and the tool calls, in order.

    Attributes:
        content: text addressed to the user (``None`` if empty after stripping).
        tool_calls: tool calls in the order written (possibly malformed ones).
        error: set when the action as a whole was unusable (e.g. neither ``str`` nor ``dict``);
            ``content`` and ``tool_calls`` are then empty.
        too_many_tool_calls: the number of tool calls written when it exceeds ``parse_action``'s
            ``max_tool_calls`` (``tool_calls`` is then empty: none was decoded); ``0`` otherwise.
    """

    content: str | None
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    error: str | None = None
    too_many_tool_calls: int = 0

    @property
    def is_empty(self) -> bool:
        return self.content is None and not self.tool_calls


def _clean_text(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return text or None


def _decode_arguments(args: Any) -> tuple[dict | None, str | None]:
    """``arguments`` as written (dict, JSON string, None) -> (dict, None) or (None, error)."""
    if args is None:
        return {}, None
    if isinstance(args, str):
        if not args.strip():
            return {}, None
        try:
            args = loads_bounded(args)
        except UnusableJSON as e:
            return None, f"the arguments are not usable: {e}"
        except json.JSONDecodeError as e:
            return None, f"the arguments are not valid JSON ({e.msg} at position {e.pos})"
        if isinstance(args, str):  # double-encoded
            try:
                args = loads_bounded(args)
            except UnusableJSON as e:
                return None, f"the arguments are not usable: {e}"
            except json.JSONDecodeError:
                pass
    if not isinstance(args, dict):
        return None, f"the arguments must be a JSON object, got {type(args).__name__}"
    return args, None


def _from_object(obj: Any, call_id: str) -> ToolCallRequest:
    """A decoded JSON object ``{"name", "arguments"}`` (or OpenAI ``{"function": {...}}``).

    ``obj`` may come straight from a message dict: its strings are cleaned and its depth bounded here."""
    try:
        obj = clean_value(obj)
    except UnusableJSON as e:
        return ToolCallRequest(call_id, _name_of(obj), None, f"the tool call is not usable: {e}", "")
    if not isinstance(obj, dict):
        return ToolCallRequest(
            call_id, None, None, f"a tool call must be a JSON object, got {type(obj).__name__}", json.dumps(obj, default=str)
        )
    call_id = str(obj.get("id") or call_id)
    fn = obj.get("function")
    if isinstance(fn, dict):
        obj = fn
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallRequest(call_id, None, None, 'the tool call has no "name" string', json.dumps(obj, default=str))
    args_key = "arguments" if "arguments" in obj else "parameters"
    raw_args = obj.get(args_key)
    args, err = _decode_arguments(raw_args)
    raw = raw_args if isinstance(raw_args, str) else json.dumps(raw_args, default=str)
    return ToolCallRequest(call_id, name.strip(), args, err, raw)


def _from_json_text(text: str, call_id: str) -> ToolCallRequest:
    """The inside of a ``<tool_call>`` block."""
    body = _unfence(text.strip())
    try:
        obj = loads_bounded(body)
    except UnusableJSON as e:
        return _unusable(body, call_id, e)
    except json.JSONDecodeError as e:
        m = _NAME_RE.search(body)
        return ToolCallRequest(
            call_id,
            m.group(1) if m else None,
            None,
            f"the tool call is not valid JSON ({e.msg} at position {e.pos})",
            body,
        )
    req = _from_object(obj, call_id)
    if not req.ok and not req.raw:
        req.raw = body
    return req


def _unusable(body: str, call_id: str, e: UnusableJSON) -> ToolCallRequest:
    m = _NAME_RE.search(body)
    return ToolCallRequest(call_id, m.group(1) if m else None, None, f"the tool call is not usable: {e}", body)


def _name_of(obj: Any) -> str | None:
    """The call's name if it can be read without walking ``obj`` (which may be nested too deep)."""
    if isinstance(obj, dict):
        fn = obj.get("function")
        name = fn.get("name") if isinstance(fn, dict) else obj.get("name")
        if isinstance(name, str) and name.strip():
            return clean_text(name.strip())
    return None


def _functional(text: str, call_id: str, tool_names: set[str] | None) -> ToolCallRequest | None:
    """tau2's ``name(arg=value)`` syntax; ``None`` when ``text`` is not such a call of a known tool."""
    m = _FUNCTIONAL_RE.match(text)
    if m is None or (tool_names is not None and m.group(1) not in tool_names):
        return None
    from tau2.utils.tools import parse_functional_tool_call

    try:
        tc = parse_functional_tool_call(text)
    except Exception as e:  # tau2 raises ValueError / SyntaxError
        return ToolCallRequest(call_id, m.group(1), None, f"could not parse the call arguments ({e})", text)
    try:
        args = clean_value(dict(tc.arguments))  # a '\\ud800' escape in a Python literal decodes to a surrogate
    except UnusableJSON as e:
        return ToolCallRequest(call_id, tc.name, None, f"the call arguments are not usable: {e}", text)
    return ToolCallRequest(call_id, tc.name, args, None, json.dumps(args, default=str))


def _over(n: int, max_calls: int | None) -> bool:
    return max_calls is not None and n > max_calls


def _parse_text(text: str, id_prefix: str, tool_names: set[str] | None, max_calls: int | None = None) -> ParsedAction:
    text = _THINK_RE.sub("", text)
    # 1. Hermes / Qwen <tool_call> blocks
    blocks = _TOOL_CALL_RE.findall(text)
    if blocks:
        content = _clean_text(_TOOL_CALL_RE.sub("", text))
        if _over(len(blocks), max_calls):
            return ParsedAction(content, too_many_tool_calls=len(blocks))
        calls = [_from_json_text(b, f"{id_prefix}_{i}") for i, b in enumerate(blocks)]
        return ParsedAction(content, calls)
    stripped = text.strip()
    if not stripped:
        return ParsedAction(None)
    # 2. bare JSON (object or list of objects) with a "name"
    body = _unfence(stripped)
    if body[:1] in "{[":
        try:
            obj = loads_bounded(body)
        except UnusableJSON as e:
            if _NAME_RE.search(body) is None:  # not a tool call: a (strange) message to the user
                return ParsedAction(stripped)
            return ParsedAction(None, [_unusable(body, f"{id_prefix}_0", e)])
        except json.JSONDecodeError:
            obj = None
        items = obj if isinstance(obj, list) else [obj]
        if items and all(isinstance(o, dict) and ("name" in o or "function" in o) for o in items):
            if _over(len(items), max_calls):
                return ParsedAction(None, too_many_tool_calls=len(items))
            return ParsedAction(None, [_from_object(o, f"{id_prefix}_{i}") for i, o in enumerate(items)])
    # 3. tau2 functional syntax, one call per line
    lines = [ln.strip() for ln in stripped.splitlines() if ln.strip()]
    if _over(len(lines), max_calls):  # too many if every line is a call of a known tool (checked without parsing)
        heads = [_FUNCTIONAL_RE.match(ln) for ln in lines]
        if all(m is not None and (tool_names is None or m.group(1) in tool_names) for m in heads):
            return ParsedAction(None, too_many_tool_calls=len(lines))
        return ParsedAction(stripped)
    calls = [_functional(ln, f"{id_prefix}_{i}", tool_names) for i, ln in enumerate(lines)]
    if calls and all(c is not None for c in calls):
        return ParsedAction(None, calls)  # type: ignore[arg-type]
    # 4. a message to the user
    return ParsedAction(stripped)


def parse_action(
    action: Any, id_prefix: str = "call", tool_names: Iterable[str] | None = None, max_tool_calls: int | None = None
) -> ParsedAction:
    """Split an agent turn into content and tool calls (never raises).

    Args:
        action: raw model text (``str``) or an assistant message ``dict``.
        id_prefix: ids of calls without one are ``f"{id_prefix}_{i}"`` (``i`` = position).
        tool_names: known tool names; tau2's functional syntax is only recognised for these
            (``None``: any identifier).
        max_tool_calls: most tool calls one action may hold (``None``: no bound). Beyond it no call is
            decoded: the result has ``tool_calls == []`` and ``too_many_tool_calls`` = the number written
            (counted as ``<tool_call>`` blocks, list items, functional lines or ``tool_calls`` entries).

    Returns:
        :class:`ParsedAction`; malformed calls carry ``error``; an unusable action has
        ``ParsedAction.error`` set.

    Cost: linear in the length of the action (every pattern here is; ``tests/test_regex_linear_time.py``).
    """
    names = set(tool_names) if tool_names is not None else None
    if isinstance(action, str):
        return _parse_text(clean_text(action), id_prefix, names, max_tool_calls)
    if isinstance(action, dict):
        role = action.get("role", "assistant")
        if role != "assistant":
            return ParsedAction(None, error=f"the action must be an assistant message, got role {role!r}")
        content = action.get("content")
        if content is not None and not isinstance(content, str):
            if isinstance(content, list):  # OpenAI content parts
                content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
            else:
                return ParsedAction(None, error=f"'content' must be a string, got {type(content).__name__}")
        content = clean_text(content) if content is not None else None
        tool_calls = action.get("tool_calls")
        if tool_calls:
            if not isinstance(tool_calls, (list, tuple)):
                return ParsedAction(None, error=f"'tool_calls' must be a list, got {type(tool_calls).__name__}")
            text = _clean_text(_THINK_RE.sub("", content) if content else None)
            if _over(len(tool_calls), max_tool_calls):
                return ParsedAction(text, too_many_tool_calls=len(tool_calls))
            calls = [_from_object(tc, f"{id_prefix}_{i}") for i, tc in enumerate(tool_calls)]
            return ParsedAction(text, calls)
        return _parse_text(content or "", id_prefix, names, max_tool_calls)
    return ParsedAction(None, error=f"the action must be a str or an assistant message dict, got {type(action).__name__}")
