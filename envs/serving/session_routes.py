"""The HTTP session routes of :mod:`envs.serve`: ``POST /sessions``, ``/sessions/{id}/reset|step``,
``GET /sessions/{id}/state``, ``DELETE /sessions/{id}``, ``GET /sessions``."""
from __future__ import annotations

import functools


try:  # the optional extra [serve]
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("envs.serve needs the [serve] extra: pip install -e '.[serve]' (openenv-core)") from e

from envs.serving.environment import _dumps, _http_call
from envs.serving.workers import WorkerGoneError
from envs.serving.sessions import _ChunkedReply, _Sessions, _json, _open_failed


def _unknown(session_id: str) -> str:
    """A 404's detail: the id is unknown, and how to get one (issue 45)."""
    return (f"unknown session {session_id!r:.80} (never opened, deleted or idle-expired): open one with POST /sessions "
            f"(201 {{\"session_id\": ...}}), then use /sessions/{{session_id}}/reset, /step, /state")


async def _session_call(sessions: _Sessions, session_id: str, op: str, raw: bytes = b"") -> Response:
    """A ``/sessions/{id}/...`` request: ``op`` (``reset`` / ``step`` / ``state``) of body ``raw`` run on the session's
    thread (:func:`_http_call`), answered in pieces (:class:`_ChunkedReply`); 404 for an unknown session; a session
    whose output went over its cap is closed before the answer."""
    env = sessions.get(session_id)
    if env is None:
        return _json(404, _dumps({"detail": _unknown(session_id)}))
    sessions.touch(session_id)
    try:
        status, body, end = await sessions.run(session_id, env, _http_call, op, raw)
    except WorkerGoneError as e:  # the session's worker process has ended: the session is gone (closed by run)
        return _json(e.status, _dumps({"detail": str(e), "code": e.code}))
    finally:
        sessions.touch(session_id)
    if end:  # the session is over (its output went over the cap): free its env before answering
        await sessions.destroy(session_id)
    return _ChunkedReply(body, status, functools.partial(env.release_unsent, len(body)))


def _add_session_routes(app: FastAPI, sessions: _Sessions, env_id: str, max_session_bytes: int | None) -> None:
    """The HTTP session routes: ``POST /sessions`` (201, 429 at the cap, 500 the env could not be built),
    ``POST /sessions/{id}/reset``, ``POST /sessions/{id}/step``, ``GET /sessions/{id}/state`` (:func:`_session_call`),
    ``DELETE /sessions/{id}`` (404 unknown) and ``GET /sessions`` (counts, bounds, ``unsent_bytes``)."""
    @app.post("/sessions", status_code=201, tags=["Sessions"])
    async def http_open_session() -> Response:
        try:
            session_id, _ = await sessions.open()
        except Exception as e:  # noqa: BLE001 - the cap (429) or the env's build (500)
            return _open_failed(env_id, e)
        return _json(201, _dumps({"session_id": session_id}))

    @app.post("/sessions/{session_id}/reset", tags=["Sessions"])
    async def reset_session(session_id: str, request: Request) -> Response:
        return await _session_call(sessions, session_id, "reset", await request.body())

    @app.post("/sessions/{session_id}/step", tags=["Sessions"])
    async def step_session(session_id: str, request: Request) -> Response:
        return await _session_call(sessions, session_id, "step", await request.body())

    @app.get("/sessions/{session_id}/state", tags=["Sessions"])
    async def session_state(session_id: str) -> Response:
        return await _session_call(sessions, session_id, "state")

    @app.delete("/sessions/{session_id}", tags=["Sessions"])
    async def close_session(session_id: str) -> Response:
        if session_id not in sessions.server._sessions:
            return _json(404, _dumps({"detail": _unknown(session_id)}))
        await sessions.destroy(session_id)
        return _json(200, _dumps({"closed": session_id}))

    @app.get("/sessions", tags=["Sessions"], name="sessions")
    async def list_sessions() -> dict:
        server = sessions.server
        return {"active": server.active_sessions, "max": server.max_concurrent_envs,
                "idle_timeout_s": sessions.idle_timeout_s, "max_session_bytes": max_session_bytes,
                "unsent_bytes": sum(e.unsent_bytes for e in list(server._sessions.values()) if e is not None),
                "workers": None if sessions.workers is None else sessions.workers.open_sessions()}
