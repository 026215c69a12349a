"""OpenEnv's MCP dialect at ``/mcp`` and FastAPI's ``/openapi.json``: what ``openenv==0.10.0``'s ``openenv validate
--url`` checks and its ``MCPToolClient`` drives.

``POST /mcp`` takes one JSON-RPC 2.0 request (OpenEnv's ``HTTPEnvServer`` dialect, learned from its 0.10 source):

* ``openenv/session/create`` -> ``{"session_id"}``: a session of the server's registry, the one ``POST /sessions``
  opens (counted against the session cap, reaped when idle); ``openenv/session/close`` ``{"session_id"}`` closes it.
* ``tools/list`` and ``tools/call`` (``{"name", "arguments"}``) with a ``session_id`` in the params act on that
  session's env -- its tools are its episode's (:mod:`envs.serving.agent_tools`: the env's tools + ``respond``), so
  reset it first (``MCPToolClient.reset`` over the WebSocket ``/ws?session_id=ID``, or ``POST /sessions/ID/reset``).
  Without a ``session_id`` each request gets a fresh env (reset with seed 0), counted against the cap until its reply
  is sent, then closed: OpenEnv's semantics, where nothing outlives the request.
* ``tools/call``'s result: MCP's ``{"content": [{"type": "text", "text"}], "structuredContent": {"messages",
  "done"}, "isError"}`` plus ``data`` (``{"text", "messages", "done"}``, what ``MCPToolClient.call_tool`` returns).
  Never the reward: the evaluator reads it from the session's state (``GET /sessions/ID/state`` or the WebSocket's
  ``state``).

Errors are JSON-RPC errors with HTTP 200, as OpenEnv answers (its validator posts ``{}`` and wants a JSON-RPC
reply): -32700 invalid JSON or over the server's JSON limits, -32600 not a request object, -32601 unknown method,
-32602 bad params / unknown ``session_id``, -32000 the session cap (``data``: ``active_sessions``, ``max_sessions``) or
an env that could not be built. Refused steps (before reset, after the end, over ``max_session_bytes``) are error
*results* (``isError``) the agent reads, as on ``/sessions/{id}/mcp``. Every bound of :mod:`envs.serve` applies: the
guard in front, the JSON limits, each session operation on its session's thread, unsent reply bytes counted.
"""
from __future__ import annotations

import json
from typing import Any

from starlette.routing import Route

from envs.serving.agent_tools import agent_tools, tool_call_action, visible_result
from envs.serving.environment import ClientError, _parse
from envs.serving.mcp_routes import counted_send, session_tools, step_tool_call
from envs.serving.offload import off_loop
from envs.serving.sessions import _Sessions

__all__ = ["add_openenv_mcp_routes", "add_openapi_route"]

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, SERVER_ERROR = -32700, -32600, -32601, -32602, -32000


class RpcError(Exception):
    """A JSON-RPC error: ``code``, message, optional ``data``."""

    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(message)
        self.code, self.data = code, data

    def body(self, request_id: Any) -> dict:
        error = {"code": self.code, "message": str(self)}
        if self.data is not None:
            error["data"] = self.data
        return {"jsonrpc": "2.0", "id": request_id, "error": error}


def _request(raw: bytes) -> dict:
    """A JSON-RPC request body as a dict with a ``method`` (``params`` an object when present).

    Raises:
        RpcError: -32700 not JSON or over the server's JSON limits, -32600 not a request object."""
    try:
        msg = _parse(raw)
    except ClientError as e:  # not JSON, or over a JSON limit
        raise RpcError(PARSE_ERROR, f"parse error: {e}") from e
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" or not isinstance(msg.get("method"), str) \
            or not isinstance(msg.get("params", {}), dict):
        raise RpcError(INVALID_REQUEST, 'invalid request: expected {"jsonrpc": "2.0", "method": str, "params"?: '
                       'object, "id"?}')
    return msg


def _call_result(ok: bool, out: Any) -> dict:
    if ok:
        text, structured, is_error = visible_result(out)
    else:
        text, structured, is_error = out, None, True
    result = {"content": [{"type": "text", "text": text}], "isError": is_error,
              "data": {"text": text, **(structured or {})}}
    if structured is not None:
        result["structuredContent"] = structured
    return result


class _OpenEnvMcp:
    """The ``/mcp`` endpoint over the server's session registry ``sessions`` (see the module docstring)."""

    def __init__(self, sessions: _Sessions):
        self.sessions = sessions

    async def __call__(self, scope, receive, send) -> None:
        if scope["method"] != "POST":
            return await _send_json(send, 405, {"detail": "POST a JSON-RPC 2.0 request to /mcp"}, None)
        raw, more = b"", True
        while more:  # the guard has read the whole body (within max_body_bytes)
            msg = await receive()
            raw, more = raw + msg.get("body", b""), msg.get("more_body", False)
        msg, env, fresh = {}, None, []
        try:
            try:
                msg = await off_loop(_request, raw)  # off the event loop (issue 49)
                env, result = await self._dispatch(msg["method"], msg.get("params", {}), fresh)
                reply = {"jsonrpc": "2.0", "id": msg.get("id"), "result": result}
            except RpcError as e:
                reply = e.body(msg.get("id"))
            await _send_json(send, 200, reply, env)
        finally:  # a session-less request's env: counted against the cap until its reply has been handed over
            for sid in fresh:
                await self.sessions.destroy(sid)

    async def _dispatch(self, method: str, params: dict, fresh: list[str]) -> tuple[Any, dict]:
        """``(env whose unsent bytes the reply counts in, or None; the result)``; the id of a session opened for
        this request alone is appended to ``fresh`` (the caller closes it once the reply is sent). Raises
        :class:`RpcError`."""
        if method == "openenv/session/create":
            return None, {"session_id": (await self._open())[0]}
        if method == "openenv/session/close":
            sid = params.get("session_id")
            if not isinstance(sid, str) or self.sessions.get(sid) is None:
                raise RpcError(INVALID_PARAMS, f"Unknown session_id: {sid!r:.80}")
            await self.sessions.destroy(sid)
            return None, {"session_id": sid, "closed": True}
        if method not in ("tools/list", "tools/call"):
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method!r:.80}; served: openenv/session/create, "
                           "openenv/session/close, tools/list, tools/call")
        sid = params.get("session_id")
        if sid is None:  # OpenEnv: a fresh env for this request only
            sid, env = await self._open()
            fresh.append(sid)
            await self.sessions.run(sid, env, _reset_seed0)
            return env, await self._tools_op(sid, env, method, params)
        env = self.sessions.get(sid) if isinstance(sid, str) else None
        if env is None:
            raise RpcError(INVALID_PARAMS, f"Unknown session_id: {sid!r:.80} (open one with openenv/session/create "
                           "or POST /sessions)")
        self.sessions.touch(sid)
        try:
            return env, await self._tools_op(sid, env, method, params)
        finally:
            self.sessions.touch(sid)

    async def _open(self) -> tuple[str, Any]:
        try:
            return await self.sessions.open()
        except Exception as e:  # noqa: BLE001 - the cap or the env's build
            data = {k: getattr(e, k) for k in ("active_sessions", "max_sessions") if hasattr(e, k)}
            raise RpcError(SERVER_ERROR, f"could not open a session: {e.__cause__ or e}", data or None) from e

    async def _tools_op(self, sid: str, env: Any, method: str, params: dict) -> dict:
        if method == "tools/list":
            tools = await self.sessions.run(sid, env, session_tools)
            if tools is None:
                raise RpcError(INVALID_PARAMS, f"session {sid} has no episode yet: reset it first (the WebSocket "
                               f"/ws?session_id={sid}, or POST /sessions/{sid}/reset)")
            return {"tools": agent_tools(tools)}
        name, arguments = params.get("name"), params.get("arguments", {})
        if not isinstance(name, str) or not name:
            raise RpcError(INVALID_PARAMS, "Missing 'name' in params")
        try:
            action = tool_call_action(name, arguments)
        except ValueError as e:
            return _call_result(False, str(e))
        ok, out, end = await self.sessions.run(sid, env, step_tool_call, action)
        if end:
            await self.sessions.destroy(sid)
        return _call_result(ok, out)


def _reset_seed0(env) -> None:
    """A session-less request's fresh env reset with seed 0 (OpenEnv's), on the env's thread."""
    env.reset(0)


def _encode(body: dict) -> bytes:
    return json.dumps(body, ensure_ascii=False, default=str).encode("utf-8", "replace")


async def _send_json(send, status: int, body: dict, env: Any) -> None:
    """Send ``body`` as JSON (encoded off the event loop); its bytes count as ``env``'s unsent bytes while sent."""
    data = await off_loop(_encode, body)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    message = {"type": "http.response.body", "body": data}
    await (counted_send(env, send, message) if env is not None else send(message))


def add_openenv_mcp_routes(app, sessions: _Sessions) -> None:
    """Serve OpenEnv's ``POST /mcp`` on the FastAPI ``app`` over the server's session registry ``sessions``."""
    app.router.routes.append(Route("/mcp", endpoint=_OpenEnvMcp(sessions)))


def add_openapi_route(app) -> None:
    """``GET /openapi.json``: FastAPI's OpenAPI document of the app's routes (``info.version``, ``paths``: what
    ``openenv validate`` reads to find the mode; nothing in it is secret). Built once, on first request."""
    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> dict:
        return app.openapi()

