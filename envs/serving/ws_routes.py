"""The WebSocket route of :mod:`envs.serve`: ``/ws``, one socket = one session (or, with
``?session_id=ID``, attached to an open session: OpenEnv 0.10's ``MCPToolClient``)."""
from __future__ import annotations

import asyncio

try:  # the optional extra [serve]
    from fastapi import FastAPI
    from openenv.core.env_server.exceptions import SessionCapacityError
    from starlette.websockets import WebSocket, WebSocketDisconnect
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("envs.serve needs the [serve] extra: pip install -e '.[serve]' (openenv-core)") from e

from envs.serving.environment import ClientError, GymTextEnvironment, _dumps, _parse, _run
from envs.serving.workers import WorkerGoneError
from envs.serving.sessions import _Sessions


def _ws_error(message: str, code: str) -> str:
    return _dumps({"type": "error", "data": {"message": message, "code": code}})


#: close code -> reason sent with it (1000, a normal close, has none)
_CLOSE_REASONS = {1008: "session over: max_session_bytes", 1011: "session lost: its worker process ended"}


def _ws_call(env: GymTextEnvironment, text: str) -> tuple[str, str | None]:
    """A WebSocket message's work, on the session's thread: ``(reply text, then)``, ``then`` being ``None`` (serve on),
    ``"close"`` (the client asked; no reply) or ``"end"`` (send the reply, then close: the session is over). The
    reply's length is counted as unsent on ``env`` until the socket has taken it."""
    then = None
    try:
        env.check_unsent()
        msg = _parse(text)
        if not isinstance(msg, dict):
            raise ClientError(f'a message must be a JSON object {{"type": ..., "data": ...}}, got {type(msg).__name__}',
                              code="INVALID_JSON")
        kind = msg.get("type")
        if kind == "close":
            return "", "close"
        if kind not in ("reset", "step", "state"):
            raise ClientError(f"unknown message type {kind!r:.80}; accepted: reset, step, state, close", code="UNKNOWN_TYPE")
        payload = msg.get("data", {} if kind == "reset" else None)
        out_kind, data = _run(env, kind, payload)
        reply = _dumps({"type": out_kind, "data": data})
    except ClientError as e:
        reply, then = _ws_error(str(e), e.code), ("end" if getattr(e, "ends_session", False) else None)
    except Exception as e:  # noqa: BLE001 - an env failure: reported, the socket keeps serving
        reply = _ws_error(f"env raised {type(e).__name__}: {e}", "EXECUTION_ERROR")
    env.hold_unsent(len(reply))
    return reply, then


async def _ws_attach(websocket: WebSocket, sessions: _Sessions, sid: str) -> tuple[str, GymTextEnvironment] | None:
    """``/ws?session_id=ID``: the open session ``ID`` (from ``POST /sessions`` or OpenEnv's ``openenv/session/create``;
    OpenEnv 0.10's ``MCPToolClient`` attaches its socket so that ``reset`` over the socket and its ``/mcp`` tool calls
    share one episode); or ``None`` after a ``SESSION_ERROR`` message (unknown session, or one another socket holds)
    and closing the socket."""
    env = sessions.get(sid)
    if env is None:
        message = (f"unknown session {sid!r:.80} (never opened, closed or idle-expired): open one with POST /sessions or "
                   "openenv/session/create on POST /mcp, or connect to /ws without session_id for a session of its own")
    elif sid in sessions.sockets:
        message = f"session {sid!r:.80} already has a WebSocket attached"
    else:
        sessions.touch(sid)
        return sid, env
    await websocket.send_text(_ws_error(message, "SESSION_ERROR"))
    await websocket.close()
    return None


async def _ws_open(websocket: WebSocket, sessions: _Sessions, env_id: str) -> tuple[str, GymTextEnvironment] | None:
    """The accepted ``websocket``'s session ``(id, env)``; or ``None`` once it could not be opened, after an error
    message (``CAPACITY_REACHED`` at the cap, ``FACTORY_ERROR`` when the env could not be built) and closing the
    socket."""
    try:
        return await sessions.open()
    except SessionCapacityError as e:
        await websocket.send_text(_dumps({"type": "error", "data": {
            "message": str(e), "code": "CAPACITY_REACHED", "active_sessions": e.active_sessions,
            "max_sessions": e.max_sessions}}))
    except Exception as e:  # noqa: BLE001
        await websocket.send_text(_ws_error(f"could not create env {env_id}: {e.__cause__ or e}", "FACTORY_ERROR"))
    await websocket.close()
    return None


async def _ws_serve(websocket: WebSocket, sessions: _Sessions, sid: str, env: GymTextEnvironment,
                    owns: bool = True, first: asyncio.Future | None = None) -> None:
    """Serve ``websocket``'s messages on session ``sid`` (:func:`_ws_call` on the session's thread) until the client
    leaves or closes, the reaper closes the session, its output goes over the cap (close code 1008) or its worker process
    ended (an error message ``WORKER_ERROR``, then close code 1011; the session is lost); then close the
    socket and -- if the socket ``owns`` its session (else it was attached to it: the session goes on, until closed or
    idle-expired) -- the session. Each reply counts as unsent until the socket has taken it (a client that does not
    read is dropped after the send timeout). ``first``: the socket's first message, already being received."""
    sessions.sockets[sid] = websocket
    close_code = 1000
    try:
        while True:
            if first is not None:
                msg, first = await first, None
            else:
                msg = await websocket.receive()
            if msg["type"] == "websocket.disconnect":
                break
            if sid not in sessions.server._sessions:  # reaped meanwhile
                await websocket.send_text(_ws_error("session closed (idle timeout); open a new socket", "SESSION_ERROR"))
                break
            sessions.touch(sid)
            text = msg.get("text")
            if text is None:
                reply, then = _ws_error("binary frames are not served: send JSON text", "INVALID_JSON"), None
                env.hold_unsent(len(reply))
            else:
                try:
                    reply, then = await sessions.run(sid, env, _ws_call, text)
                except WorkerGoneError as e:  # the session is closed already (lost with its worker): say why, close 1011
                    reply, then, close_code = _ws_error(str(e), e.code), "end", 1011
                    env.hold_unsent(len(reply))
            sessions.touch(sid)
            try:
                if then == "close":
                    break
                if then == "end" and close_code != 1011:  # free the env before answering
                    await sessions.destroy(sid)
                    close_code = 1008
                await websocket.send_text(reply)  # waits while the client does not read (dropped after send_timeout_s)
            finally:
                env.release_unsent(len(reply))
            if then == "end":
                break
    except (WebSocketDisconnect, RuntimeError):  # client gone / socket closed by the reaper
        pass
    finally:
        sessions.sockets.pop(sid, None)
        if owns or close_code == 1008:
            await sessions.destroy(sid)
        try:
            await websocket.close(code=close_code, reason=_CLOSE_REASONS.get(close_code))
        except RuntimeError:
            pass


def _drop(pending: asyncio.Future) -> None:
    """Cancel ``pending`` (a receive no longer wanted); if it has completed, what it raised is taken, not logged."""
    pending.cancel()
    if pending.done() and not pending.cancelled():
        pending.exception()


def _add_websocket_route(app: FastAPI, sessions: _Sessions, env_id: str) -> None:
    """``/ws``: one WebSocket = one session (:func:`_ws_open`, then :func:`_ws_serve`); ``/ws?session_id=ID``: the
    socket attached to the open session ``ID`` (:func:`_ws_attach`), which outlives it.

    The first message of a new session's socket is received while its env is built (issue 49): uvicorn stops reading a
    socket while a message waits for the app, and reading is what answers the keepalive (the client's pings, the pongs
    to the server's); a ``reset`` sent at once then left the socket unread for the whole build -- tens of seconds with
    512 sessions opening together -- and either end's keepalive closed it (1011). Messages after the first still wait
    unread in uvicorn's queue, as before (one at a time)."""
    @app.websocket("/ws")
    async def ws_session(websocket: WebSocket) -> None:
        await websocket.accept()
        attach = websocket.query_params.get("session_id")
        if attach:
            first, opened = None, await _ws_attach(websocket, sessions, attach)
        else:
            first = asyncio.ensure_future(websocket.receive())
            try:
                opened = await _ws_open(websocket, sessions, env_id)
            except BaseException:
                _drop(first)
                raise
            if opened is None:
                _drop(first)
        if opened is not None:
            await _ws_serve(websocket, sessions, *opened, owns=not attach, first=first)
