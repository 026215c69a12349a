"""A session's tools over standard MCP: ``/sessions/{id}/mcp``, the ``mcp`` SDK's Streamable HTTP transport.

For any agent that speaks MCP (coding agents, the OpenAI Agents SDK, Claude-style tool users, evaluation
harnesses)::

    POST /sessions                       -> {"session_id": ID}
    POST /sessions/ID/reset  {"index": 0} -> the task's opening (system prompt with the policy, the customer's message)
    MCP  http://HOST:PORT/sessions/ID/mcp -> tools/list: the domain's tools + ``respond``; tools/call: one env step
    GET  /sessions/ID/state              -> the reward (``reward``, ``done``), for the evaluator, never the agent

``tools/list`` answers the env's tools with the schemas of ``info["tools"]`` plus ``respond`` (a plain message to the
customer; with a simulated customer their reply is its result); ``tools/call`` steps the session's env with that one
call (:mod:`envs.serving.agent_tools`): its result is the tool's output or the customer's reply and ``done``, never
the reward. A call after the episode ended, before ``reset``, over the session's byte cap, or that the env raised on
is an error *result* (``isError``, the reason as its text), so the agent sees it; the session is closed when an env
output went over the cap, as on the HTTP routes.

The SDK serves the transport statelessly (JSON replies, no MCP session id of its own): the session is the one in the
path, from the server's one session registry, so every bound of :mod:`envs.serve` applies unchanged -- the guard in
front of every route (``Origin`` / ``Host`` allow-lists, body size and time), the JSON limits (nesting, integer
digits: checked before the SDK parses the body), the session cap and idle timeout (each MCP request marks its session
used), ``max_session_bytes`` (each step is a session step; a reply being sent counts as unsent bytes), the env's
tool calls per action (one call per step here). Both MCP protocol eras the SDK serves work: the 2025 initialize
handshake and the 2026-07-28 per-request one. An unknown or expired session is answered 404 saying how to open one.
"""
from __future__ import annotations

import functools

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.responses import JSONResponse
from starlette.routing import Route

from envs.serving.agent_tools import agent_tools, tool_call_action, visible_result
from envs.serving.environment import ClientError, GymTextEnvironment, _parse, _run
from envs.serving.offload import LoopThread, off_loop
from envs.serving.sessions import _Sessions

__all__ = ["MCP_PATH", "add_session_mcp_routes", "counted_send", "session_tools", "step_tool_call", "unknown_session_detail"]

#: Where a session's MCP endpoint is.
MCP_PATH = "/sessions/{session_id}/mcp"


def unknown_session_detail(session_id: str) -> str:
    """The 404 message of an unknown / expired session on an MCP route: says how to get one."""
    return (f"unknown session {session_id!r:.80} (never opened, deleted or idle-expired): open one with POST /sessions "
            "(-> {\"session_id\": ID}), start its episode with POST /sessions/ID/reset, then connect to /sessions/ID/mcp")


def _step_result(reply: dict) -> types.CallToolResult:
    text, structured, is_error = visible_result(reply)
    content = [types.TextContent(type="text", text=text)]
    if structured["done"]:
        content.append(types.TextContent(type="text", text="[the episode has ended]"))
    return types.CallToolResult(content=content, structured_content=structured, is_error=is_error)


def _error_result(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


class _SessionTools:
    """The MCP handlers over the server's session registry ``sessions``, run on the SDK's loop: each env operation on
    the session's own thread."""

    def __init__(self, sessions: _Sessions):
        self.sessions = sessions
        self.destroy = sessions.destroy  # at startup: the same, callable from the SDK's loop

    def _env(self, ctx) -> tuple[str, GymTextEnvironment]:
        sid = ctx.request.path_params["session_id"]
        env = self.sessions.get(sid)
        if env is None:
            raise MCPError(types.INVALID_REQUEST, unknown_session_detail(sid))
        return sid, env

    async def list_tools(self, ctx, params) -> types.ListToolsResult:
        sid, env = self._env(ctx)
        tools = await self.sessions.run(sid, env, session_tools)
        if tools is None:
            raise MCPError(types.INVALID_REQUEST, f"session {sid} has no episode yet: POST /sessions/{sid}/reset "
                           "first (its tools are its task's)")
        return types.ListToolsResult(tools=[types.Tool.model_validate(t) for t in agent_tools(tools)])

    async def call_tool(self, ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        sid, env = self._env(ctx)
        try:
            action = tool_call_action(params.name, params.arguments)
        except ValueError as e:
            return _error_result(str(e))
        self.sessions.touch(sid)
        ok, out, end = await self.sessions.run(sid, env, step_tool_call, action)
        self.sessions.touch(sid)
        if end:  # the env's output went over max_session_bytes: the session is over, as on the HTTP routes
            await self.destroy(sid)
        return _step_result(out) if ok else _error_result(out)


def session_tools(env: GymTextEnvironment) -> list[dict] | None:
    """The env's OpenAI tool schemas of its current episode (``None`` before the first reset), on its thread."""
    return env.tools


def step_tool_call(env: GymTextEnvironment, action: dict) -> tuple[bool, dict | str, bool]:
    """One tool call on the session's thread, through the session routes' own step (:func:`_run`: the same checks as
    ``POST /sessions/{id}/step``): ``(True, step reply, False)`` or ``(False, error message, end the session)``. A
    refused request (409 order, 413 bytes, 422 action, 429 unsent replies) or an env exception is an error the agent
    reads."""
    try:
        env.check_unsent()
        return True, _run(env, "step", action)[1], False
    except ClientError as e:
        return False, f"refused ({e.status}): {e}", bool(getattr(e, "ends_session", False))
    except Exception as e:  # noqa: BLE001 - an env failure: this call only, the session goes on
        return False, f"env raised {type(e).__name__}: {e}", False


class _Endpoint:
    """The ASGI endpoint of :data:`MCP_PATH`: 404 for an unknown session, the server's JSON limits on a POST body
    (:func:`_parse`, off the event loop; 422 as a JSON-RPC parse error), then the SDK's transport on the ``sdk`` loop
    (it parses and validates the body again, in its coroutines: not on the server's loop); the session is marked used
    before and after, and the bytes of a reply being sent count as the session's unsent bytes until the connection has
    taken them."""

    def __init__(self, sessions: _Sessions, manager: StreamableHTTPSessionManager, sdk: LoopThread):
        self.sessions, self.manager, self.sdk = sessions, manager, sdk

    async def __call__(self, scope, receive, send) -> None:
        sid = scope["path_params"]["session_id"]
        env = self.sessions.get(sid)
        if env is None:
            return await _rpc_error(404, types.INVALID_REQUEST, unknown_session_detail(sid))(scope, receive, send)
        if scope["method"] != "POST":  # stateless: no GET stream (it would be held open with nothing to carry), no DELETE
            return await _rpc_error(405, types.INVALID_REQUEST, f"{scope['method']} is not served here: POST one JSON-RPC "
                                    "request per HTTP request (JSON replies)")(scope, receive, send)
        first = await receive()  # the guard has read the whole body: one message
        try:
            await off_loop(_parse, first.get("body", b""))
        except ClientError as e:  # invalid JSON or over a JSON limit
            return await _rpc_error(422, types.PARSE_ERROR, str(e))(scope, receive, send)
        receive = _replay(first, receive)
        self.sessions.touch(sid)
        try:  # the SDK (which parses the body again) on its own loop; receive and send stay on this one
            await self.sdk.run(self.manager.handle_request(
                scope, LoopThread.on(receive), LoopThread.on(functools.partial(counted_send, env, send))))
        finally:
            self.sessions.touch(sid)


def _rpc_error(status: int, code: int, message: str) -> JSONResponse:
    """An HTTP ``status`` reply holding a JSON-RPC error (no request id) and, as every error of the server, ``detail``."""
    headers = {"allow": "POST"} if status == 405 else None
    return JSONResponse({"jsonrpc": "2.0", "id": None, "detail": message, "error": {"code": code, "message": message}},
                        status, headers=headers)


def _replay(first: dict, receive):
    sent = False

    async def again():
        nonlocal sent
        if not sent:
            sent = True
            return first
        return await receive()

    return again


async def counted_send(env, send, message: dict) -> None:
    """``await send(message)``, the bytes of an HTTP body message counted as ``env``'s unsent bytes until sent."""
    n = len(message.get("body", b"")) if message.get("type") == "http.response.body" else 0
    env.hold_unsent(n)
    try:
        await send(message)
    finally:
        env.release_unsent(n)


def add_session_mcp_routes(app, sessions: _Sessions, *, max_body_bytes: int) -> None:
    """Serve :data:`MCP_PATH` on the FastAPI ``app``: one SDK ``Server`` and one stateless
    ``StreamableHTTPSessionManager`` (started and stopped with the app) over the server's session registry
    ``sessions``; ``max_body_bytes`` is the body cap (the guard's; the SDK's own set to it). The SDK runs on an event
    loop of its own (:class:`~envs.serving.offload.LoopThread`, started and stopped with the app), so that its parsing
    of a body never holds the server's loop. The SDK's DNS-rebinding check is off: the server's guard checks ``Host``
    and ``Origin`` for every route, with the server's allow-lists."""
    handlers = _SessionTools(sessions)
    server = Server("envs.serve", on_list_tools=handlers.list_tools, on_call_tool=handlers.call_tool)
    manager = StreamableHTTPSessionManager(
        server, json_response=True, stateless=True, max_request_body_size=max_body_bytes,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    sdk = LoopThread("envs-serve-mcp")

    async def _serve(until) -> None:
        async with manager.run():
            await until

    async def _start() -> None:
        handlers.destroy = LoopThread.on(sessions.destroy)  # the registry's lock belongs to the server's loop
        await sdk.start(_serve)

    async def _stop() -> None:
        await sdk.stop()

    app.router.on_startup.append(_start)
    app.router.on_shutdown.insert(0, _stop)
    app.router.routes.append(Route(MCP_PATH, endpoint=_Endpoint(sessions, manager, sdk)))
