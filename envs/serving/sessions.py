"""The server's one session registry (:class:`_Sessions`: OpenEnv's ``HTTPEnvServer`` cap and threads -- as
:class:`_SessionServer`, each session's thread started off the event loop --, last use, the idle reaper) and what every
route shares to answer: :class:`_ChunkedReply`, :func:`_json`, :func:`_open_failed`."""
from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any


try:  # the optional extra [serve]
    from fastapi import FastAPI
    from fastapi.responses import Response
    from openenv.core.env_server.exceptions import SessionCapacityError
    from openenv.core.env_server.http_server import HTTPEnvServer
    from starlette.websockets import WebSocket
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("envs.serve needs the [serve] extra: pip install -e '.[serve]' (openenv-core)") from e

from envs.serving.limits import REPLY_CHUNK_BYTES
from envs.serving.environment import GymTextEnvironment, _dumps
from envs.serving.session_threads import SessionThread, SessionThreads
from envs.serving.workers import WorkerEnvironment, WorkerGoneError, WorkerPool
from envs.grader_queue import carrying_client


class _ChunkedReply(Response):
    """A JSON reply handed to the connection :data:`REPLY_CHUNK_BYTES` at a time; ``on_done()`` runs once the last piece
    is handed over (or the client is gone), then ``await after()`` if given (a stateless request's env is closed
    there). uvicorn waits before each piece while the connection's buffer is full, so an unread reply waits here,
    counted against its session, and the transport buffers at most about one piece."""

    media_type = "application/json"

    def __init__(self, body: bytes, status_code: int, on_done: Callable[[], None],
                 after: Callable[[], Any] | None = None):
        super().__init__(content=body, status_code=status_code)
        self._on_done, self._after = on_done, after

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            body, n = memoryview(self.body), len(self.body)
            for i in range(0, max(n, 1), REPLY_CHUNK_BYTES):
                await send({"type": "http.response.body", "body": bytes(body[i:i + REPLY_CHUNK_BYTES]),
                            "more_body": i + REPLY_CHUNK_BYTES < n})
        finally:
            self.body = b""
            self._on_done()
            if self._after is not None:
                await self._after()


#: ``(server, thread)``: the thread a :class:`_SessionServer` lends to the session its ``_create_session`` is opening in
#: this task (a context variable: each task, so each concurrent open, sees only its own).
_LENT: contextvars.ContextVar[tuple[HTTPEnvServer, SessionThread] | None] = contextvars.ContextVar("_LENT", default=None)


class _SessionServer(HTTPEnvServer):
    """OpenEnv's ``HTTPEnvServer`` (the cap, one thread per session, each env built and closed on its thread) whose
    sessions' threads are started off the event loop: each is a :class:`~envs.serving.session_threads.SessionThread`
    made on ``threads``' starter (why: :mod:`envs.serving.session_threads`). ``threads`` is started and closed with
    the app (:func:`_add_lifecycle`).

    The seam (openenv-core 0.3.0; ``_create_session`` is wrapped, not copied): OpenEnv picks a new session's executor
    in ``_create_session`` -- ``self._shared_session_executor`` if that is not ``None``, else a new
    ``ThreadPoolExecutor(max_workers=1)`` -- and shuts a session's executor down only when it ``is not
    self._shared_session_executor``. Every read of that attribute in its source: (1) ``__init__`` sets it (``None``,
    or one executor for all sessions when the factory's class sets ``REQUIRES_SINGLE_THREAD_EXECUTOR``,
    ``_requires_single_thread_executor``); (2) ``_create_session`` reads it twice to pick the executor; (3) its failure
    path (the factory raised) and (4) ``_cleanup_session_resources`` (a session's close, and ``_create_session``'s MCP
    failure path) compare with it before ``shutdown``; (5) ``register_routes``' shutdown hook shuts it down (we do not
    register OpenEnv's routes). Here it is a property: inside the task running this class's ``_create_session`` it
    is the thread lent to that open (:data:`_LENT`), everywhere else what OpenEnv set. So (2) hands the new session its
    own started thread; (3) and (4) in that task leave it running, and the wrapper shuts it down when the open fails;
    (4) in any other task (every close) sees OpenEnv's ``None`` and shuts the session's thread down as before. When
    OpenEnv's shared executor exists nothing is lent: every session shares its one thread, as the env asks."""

    def __init__(self, *args: Any, threads: SessionThreads, **kwargs: Any):
        self.threads = threads
        super().__init__(*args, **kwargs)

    @property
    def _shared_session_executor(self) -> Any:
        lent = _LENT.get()
        return lent[1] if lent is not None and lent[0] is self else self._openenv_shared_executor

    @_shared_session_executor.setter
    def _shared_session_executor(self, executor: Any) -> None:
        self._openenv_shared_executor = executor

    async def _create_session(self) -> tuple[str, Any]:
        if self._openenv_shared_executor is not None or len(self._sessions) >= self._max_concurrent_envs:
            return await super()._create_session()  # one thread for all, or refused at the cap: none to lend
        thread = await self.threads.new()
        token = _LENT.set((self, thread))
        try:
            return await super()._create_session()
        except BaseException:
            thread.shutdown(wait=False)  # OpenEnv took it for the shared executor and left it running
            raise
        finally:
            _LENT.reset(token)


class _Sessions:
    """The app's open sessions: OpenEnv's session registry ``server`` (an ``HTTPEnvServer``: the cap, one thread per
    session, each env built and closed on its thread; its own reaper off) plus when each session was last used
    (seconds of ``clock``), the WebSocket that owns a session, and the idle reaper that closes a session unused for more
    than ``idle_timeout_s`` (``None``: never), looking every ``reap_interval_s`` real seconds (``None``: ``idle_timeout_s
    / 4`` within [0.05, 5])."""

    def __init__(self, server: _SessionServer, clock: Callable[[], float], idle_timeout_s: float | None,
                 reap_interval_s: float | None, workers: WorkerPool | None = None):
        self.server, self.clock, self.workers = server, clock, workers
        # a session's graded calls are its request's client's (envs.grader_queue): carried to the session's thread
        server._run_in_session_executor = carrying_client(server._run_in_session_executor)
        self.idle_timeout_s, self.reap_interval_s = idle_timeout_s, reap_interval_s
        self.last_seen: dict[str, float] = {}
        self.sockets: dict[str, WebSocket] = {}

    def get(self, sid: str) -> GymTextEnvironment | None:
        """The open session ``sid``'s env, or ``None`` (never opened, closed or reaped)."""
        return self.server._sessions.get(sid)

    def touch(self, sid: str) -> None:
        """Mark ``sid`` as used now (a closed session is not brought back)."""
        if sid in self.server._sessions:
            self.last_seen[sid] = self.clock()

    async def run(self, sid: str, env: Any, fn: Callable, *args: Any) -> Any:
        """``fn(env, *args)`` on session ``sid``'s thread -- or, when ``env`` is a
        :class:`~envs.serving.workers.WorkerEnvironment`, sent from this loop to the session's thread in its worker
        process (``fn`` then a module-level function, sent by name): every route's env work goes through here. Raises: what ``fn`` raises; ``WorkerGoneError`` when the session's worker
        process has ended (the session is closed first: it is lost with its worker)."""
        try:
            if isinstance(env, WorkerEnvironment):  # over the loop's link: no thread of this process runs for it
                return await env.acall(fn, *args)
            return await self.server._run_in_session_executor(sid, env.call, fn, *args)
        except WorkerGoneError:
            await self.destroy(sid)
            raise

    async def destroy(self, sid: str) -> None:
        """Close ``sid`` (its env closed on its thread) and forget it."""
        self.last_seen.pop(sid, None)
        await self.server._destroy_session(sid)

    async def open(self) -> tuple[str, GymTextEnvironment]:
        """A new session: ``(id, env)``. Raises: ``SessionCapacityError`` at the cap; the env's build error, chained."""
        sid, env = await self.server._create_session()
        self.touch(sid)
        return sid, env

    async def reap_forever(self) -> None:
        """The idle reaper (runs until cancelled): close every session idle for more than ``idle_timeout_s`` and its
        WebSocket, if any (code 1001)."""
        interval = self.reap_interval_s or min(max(self.idle_timeout_s / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(interval)
            for sid, seen in list(self.last_seen.items()):
                if self.clock() - seen > self.idle_timeout_s and self.last_seen.get(sid) == seen:
                    await self.destroy(sid)
                    ws = self.sockets.pop(sid, None)
                    if ws is not None:
                        try:
                            await ws.close(code=1001, reason="idle timeout")
                        except Exception:  # noqa: BLE001, S110 - the client may be gone already
                            pass


def _add_lifecycle(app: FastAPI, sessions: _Sessions) -> None:
    """On startup, start the sessions' thread starter (:class:`~envs.serving.session_threads.SessionThreads`), the
    worker processes (if any: in a thread, they take seconds) and the idle reaper (``app.state.reaper``; none without
    an idle timeout); on shutdown, stop the reaper, close every session, stop the starter and the workers."""
    async def _start() -> None:
        sessions.server.threads.start()
        if sessions.workers is not None:
            sessions.workers.loop = asyncio.get_running_loop()
            await asyncio.get_running_loop().run_in_executor(None, sessions.workers.start)
        if sessions.idle_timeout_s is not None:
            app.state.reaper = asyncio.create_task(sessions.reap_forever())

    async def _stop() -> None:
        task = getattr(app.state, "reaper", None)
        if task is not None:
            task.cancel()
        for sid in list(sessions.server._sessions):
            await sessions.destroy(sid)
        sessions.server.threads.close()
        if sessions.workers is not None:
            sessions.workers.close_links()
            sessions.workers.loop = None
            await asyncio.get_running_loop().run_in_executor(None, sessions.workers.shutdown)

    app.router.on_startup.append(_start)
    app.router.on_shutdown.append(_stop)


def _json(status: int, text: str) -> Response:
    """A JSON reply of ``text`` (UTF-8) with ``status``."""
    return Response(content=text.encode("utf-8"), status_code=status, media_type="application/json")


def _open_failed(env_id: str, e: Exception, cap_note: str = "") -> Response:
    """The reply to a session that could not be opened: 429 at the session cap (``cap_note`` appended to its detail),
    500 when the env could not be built (the build error named)."""
    if isinstance(e, SessionCapacityError):
        return _json(429, _dumps({"detail": f"session cap reached: {e.active_sessions}/{e.max_sessions} open{cap_note}"}))
    return _json(500, _dumps({"detail": f"could not create env {env_id}: {e.__cause__ or e}"}))
