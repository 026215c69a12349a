"""Serve any registered env id over OpenEnv (HTTP + WebSocket), one env instance per session.

Usage (extra ``[serve]``: ``pip install -e '.[serve]'``, which installs ``openenv-core``)::

    python -m envs.serve tau2/telecom-v0 --port 8000            # binds 127.0.0.1
    python -m envs.serve GSM8K-v0 --env-kwargs '{"split": "test"}' --max-sessions 64 --idle-timeout 600

Client side, OpenEnv's own WebSocket client (what TRL's and TorchRL's OpenEnv integrations drive)::

    from openenv.core.generic_client import GenericEnvClient
    with GenericEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        r = env.reset(task_id="3")                 # or index=i, seed=s
        r = env.step({"content": "<tool_call>{...}</tool_call>"})   # or {"tool_calls": [...]}
        r.observation["messages"], r.reward, r.done, env.state()

Protocol (OpenEnv 0.3, ``openenv.core.env_server.http_server``):

* ``/ws`` -- OpenEnv's session protocol: one WebSocket = one session = one env instance (created
  by ``gym.make(env_id, **env_kwargs)`` when the socket opens, closed when it closes). Messages
  ``{"type": "reset", "data": {seed?, task_id?, index?}}``, ``{"type": "step", "data": action}``,
  ``{"type": "state"}``, ``{"type": "close"}``; answers ``{"type": "observation"|"state"|"error",
  "data": ...}``. A bad message (invalid JSON, unknown type, wrong types, an env exception) is
  answered by an ``error`` message and the socket keeps serving; a message over
  ``max_body_bytes`` closes that socket only (WebSocket code 1009).
* ``/sessions`` -- the same sessions over plain HTTP for clients without WebSockets:
  ``POST /sessions`` -> ``201 {"session_id"}``; ``POST /sessions/{id}/reset`` (body: the reset
  data), ``POST /sessions/{id}/step`` (body ``{"action": ...}``), ``GET /sessions/{id}/state``,
  ``DELETE /sessions/{id}``. Errors: 400 bad reset options (unknown task id, index out of range),
  404 unknown / expired session, 409 step before reset or after the episode ended, 413 body over
  ``max_body_bytes``, 422 invalid JSON or wrong types, 429 session cap reached, 500 the env raised
  (that session only; it stays usable, e.g. by ``reset``). Every error body is ``{"detail": msg}``.
* ``/health``, ``/schema``, ``/metadata`` -- OpenEnv's. OpenEnv's stateless ``POST /reset`` and
  ``/step`` (a fresh env per request) are not served: a text episode needs a session.

Action (:class:`TextAction`): ``{"content": str | None, "tool_calls": list | None}``. With
``tool_calls`` it is passed to the env as an assistant message dict, otherwise ``content`` as the
model's raw text (parsed as in :mod:`envs.contract`, "Action"). Observation
(:class:`TextObservation`): the env's ``obs`` messages, ``reward``, ``done`` (``terminated or
truncated``), both flags and the step's ``info`` (JSON-safe copy). State (:class:`TextState`):
the session's env id, task, whole conversation, step count, reward so far and -- for tau2 -- the
episode database hash (``db_hash``), so two sessions can be checked for isolation.

Sessions are isolated because each owns its env instance (tau2: its own copy-on-write database,
:mod:`envs.tau2.cow`) and runs it on its own single thread; session ids are random UUIDs. The
session cap (``max_sessions``, WebSocket and HTTP sessions together) and the idle timeout
(``idle_timeout_s``: a session with no request for that long is closed and its id forgotten) are
set by :func:`build_app` / the CLI flags.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import time
from typing import Any

import gymnasium as gym

import envs as _envs
from envs.contract import check_action

__all__ = ["GymTextEnvironment", "TextAction", "TextObservation", "TextState", "build_app", "main"]

try:  # the optional extra [serve]
    from fastapi import Body, FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse
    from openenv.core.env_server.exceptions import SessionCapacityError
    from openenv.core.env_server.http_server import HTTPEnvServer
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.serialization import serialize_observation
    from openenv.core.env_server.types import (
        Action,
        ConcurrencyConfig,
        EnvironmentMetadata,
        Observation,
        State,
    )
    from pydantic import Field
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("envs.serve needs the [serve] extra: pip install -e '.[serve]' (openenv-core)") from e

gym.register_envs(_envs)

#: Default limit on a request body / WebSocket message (bytes).
DEFAULT_MAX_BODY_BYTES = 1 << 20


class BadRequestError(ValueError):
    """The caller's request cannot be served (bad reset options, action outside the action space)."""


class StepOrderError(RuntimeError):
    """``step`` before ``reset`` or after the episode ended."""


class SessionClosedError(RuntimeError):
    """The session's env was closed (idle timeout or shutdown)."""


class TextAction(Action):
    """An agent action: raw text (``content``) or an assistant message (``content`` + ``tool_calls``)."""

    content: str | None = Field(default=None, description="The model's text (parsed for tool calls when tool_calls is absent)")
    tool_calls: list[dict[str, Any]] | None = Field(default=None, description="OpenAI-format tool calls")

    def to_env_action(self) -> str | dict:
        if self.tool_calls is None:
            return self.content if self.content is not None else ""
        return {"role": "assistant", "content": self.content, "tool_calls": self.tool_calls}


class TextObservation(Observation):
    """What one ``reset``/``step`` returns (``done``/``reward`` from OpenEnv's base class)."""

    messages: list[dict[str, Any]] = Field(default_factory=list, description="Chat messages new to the agent")
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict, description="The step's info (JSON-safe)")


class TextState(State):
    """A session's episode: env id, task, whole conversation, reward so far, tau2 db hash."""

    env_id: str = ""
    task_id: str | None = None
    index: int | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)
    done: bool = False
    reward: float | None = None
    db_hash: str | None = None


def _jsonable(x: Any) -> Any:
    """A JSON-safe deep copy of ``x`` (pydantic models dumped, unknown objects as ``str``, NaN -> None)."""
    def default(o: Any) -> Any:
        if hasattr(o, "model_dump"):
            return o.model_dump(mode="json")
        if hasattr(o, "tolist"):
            return o.tolist()
        return str(o)

    def fix(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: fix(w) for k, w in v.items()}
        if isinstance(v, list):
            return [fix(w) for w in v]
        return v

    return fix(json.loads(json.dumps(x, default=default)))


class GymTextEnvironment(Environment):
    """One session's env: ``gym.make(env_id, **env_kwargs)`` behind OpenEnv's ``Environment`` API.

    Raises (from ``reset``/``step``): :class:`BadRequestError` (unknown reset option, task id or
    index the env rejects, action outside the action space), :class:`StepOrderError`,
    :class:`SessionClosedError`; anything else the env raises propagates (an env failure).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, env_kwargs: dict | None = None):
        super().__init__()
        self.env_id = env_id
        # No passive env checker: the contract test checks every id, and after a rejected first
        # reset (unknown task id) the checker itself raises TypeError on the next step.
        self._env = gym.make(env_id, **{"disable_env_checker": True, **(env_kwargs or {})})
        self._closed = False
        self._done = True
        self._started = False
        self._reward: float | None = None
        self._info: dict = {}
        self._episode_id: str | None = None
        self._steps = 0

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError("session closed (idle timeout or server shutdown); open a new session")

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              index: int | None = None, **kwargs: Any) -> TextObservation:
        self._check_open()
        if kwargs:
            raise BadRequestError(f"unknown reset option(s) {sorted(kwargs)}; accepted: seed, episode_id, task_id, index")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise BadRequestError(f"seed must be a non-negative int, got {seed!r}")
        if index is not None and (isinstance(index, bool) or not isinstance(index, int)):
            raise BadRequestError(f"index must be an int, got {index!r}")
        if task_id is not None and not isinstance(task_id, str):
            raise BadRequestError(f"task_id must be a str, got {task_id!r}")
        options = {k: v for k, v in (("task_id", task_id), ("index", index)) if v is not None}
        try:
            obs, info = self._env.reset(seed=seed, options=options or None)
        except (ValueError, KeyError) as e:
            raise BadRequestError(f"reset rejected: {e}") from e
        self._started, self._done, self._reward, self._steps = True, False, None, 0
        self._info, self._episode_id = info, episode_id
        return TextObservation(messages=_jsonable(obs), info=_jsonable(info), done=False, reward=None)

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        self._check_open()
        if not self._started:
            raise StepOrderError("step before reset: call reset first")
        if self._done:
            raise StepOrderError("episode has ended; call reset()")
        env_action = action.to_env_action()
        try:
            check_action(env_action)
        except TypeError as e:
            raise BadRequestError(f"action outside the action space: {e}") from e
        obs, reward, terminated, truncated, info = self._env.step(env_action)
        self._steps += 1
        self._done = bool(terminated or truncated)
        self._reward, self._info = float(reward), info
        return TextObservation(messages=_jsonable(obs), info=_jsonable(info), done=self._done, reward=float(reward),
                               terminated=bool(terminated), truncated=bool(truncated))

    @property
    def state(self) -> TextState:
        self._check_open()
        db_hash = None
        tau2_env = getattr(self._env.unwrapped, "tau2_environment", None) if self._started else None
        if tau2_env is not None:
            try:
                db_hash = tau2_env.get_db_hash()
            except Exception:  # noqa: BLE001 - a hash is informative only
                db_hash = None
        return TextState(
            episode_id=self._episode_id, step_count=self._steps, env_id=self.env_id,
            task_id=self._info.get("task_id"), index=self._info.get("index"),
            messages=_jsonable(self._info.get("messages", [])), done=self._done, reward=self._reward, db_hash=db_hash,
        )

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name=self.env_id, description=f"{self.env_id} (torchrl-grpo envs, served by envs.serve)",
                                   version="0")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()


class _BodyLimit:
    """ASGI middleware: HTTP bodies over ``limit`` bytes -> 413 (by Content-Length or while streaming)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            from starlette.websockets import WebSocketDisconnect

            try:  # OpenEnv closes a socket the client already closed: not an error
                return await self.app(scope, receive, send)
            except WebSocketDisconnect:
                return None
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", []):
            if k == b"content-length" and v.isdigit() and int(v) > self.limit:
                return await self._reject(send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge()
            return msg

        try:
            await self.app(scope, limited_receive, send)
        except _TooLarge:
            await self._reject(send)

    async def _reject(self, send):
        body = json.dumps({"detail": f"request body over the limit of {self.limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


def build_app(env_id: str, env_kwargs: dict | None = None, *, max_sessions: int = 64, idle_timeout_s: float | None = 600.0,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The FastAPI app serving ``env_id`` (see the module docstring for routes and errors).

    Args:
        env_id: a registered Gymnasium id (``envs.ENV_IDS`` or any other registered id).
        env_kwargs: keyword arguments of ``gym.make`` for every session's env.
        max_sessions: most sessions open at once (WebSocket + HTTP); more -> 429 / ``CAPACITY_REACHED``.
        idle_timeout_s: seconds without a request after which a session is closed (``None``: never).
        max_body_bytes: largest HTTP body / WebSocket message accepted (the WebSocket limit is applied
            by the server: :func:`main` passes it to uvicorn as ``ws_max_size``).

    Raises:
        gymnasium.error.Error: ``env_id`` is not registered (checked at once, not at the first session).
    """
    gym.spec(env_id)  # fail fast on an unknown id
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
    if idle_timeout_s is not None and idle_timeout_s <= 0:
        raise ValueError(f"idle_timeout_s must be > 0 or None, got {idle_timeout_s}")
    factory = functools.partial(GymTextEnvironment, env_id, dict(env_kwargs or {}))
    # OpenEnv's own reaper checks at most every 5 s; ours (below) scales with the timeout.
    server = HTTPEnvServer(factory, TextAction, TextObservation,
                           concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=None))
    app = FastAPI(title=f"envs.serve: {env_id}", version="0")
    server.register_routes(app, mode="production")  # /ws, /health, /schema, /metadata
    app.state.openenv_server = server
    app.state.env_id = env_id

    async def _reaper() -> None:
        interval = min(max(idle_timeout_s / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(interval)
            now = time.time()
            stale = [sid for sid, info in list(server._session_info.items()) if now - info.last_activity_at > idle_timeout_s]
            for sid in stale:
                info = server._session_info.get(sid)
                if info is not None and time.time() - info.last_activity_at > idle_timeout_s:
                    await server._destroy_session(sid)

    async def _start() -> None:
        if idle_timeout_s is not None:
            app.state.reaper = asyncio.create_task(_reaper())

    async def _stop() -> None:
        task = getattr(app.state, "reaper", None)
        if task is not None:
            task.cancel()
        for sid in list(server._sessions):
            await server._destroy_session(sid)

    app.router.on_startup.append(_start)  # as OpenEnv registers its own hooks
    app.router.on_shutdown.append(_stop)

    def _env_of(session_id: str) -> GymTextEnvironment:
        env = server._sessions.get(session_id)
        if env is None:
            raise HTTPException(404, f"unknown session {session_id!r} (never opened, deleted or idle-expired)")
        return env

    async def _call(session_id: str, fn, *args, step: bool = False, **kwargs):
        try:
            out = await server._run_in_session_executor(session_id, fn, *args, **kwargs)
        except BadRequestError as e:
            raise HTTPException(400 if not step else 422, str(e)) from e
        except StepOrderError as e:
            raise HTTPException(409, str(e)) from e
        except SessionClosedError as e:
            raise HTTPException(404, str(e)) from e
        except Exception as e:
            raise HTTPException(500, f"env raised {type(e).__name__}: {e}") from e
        finally:
            server._update_session_activity(session_id, increment_step=step)
        return out

    @app.post("/sessions", status_code=201, tags=["Sessions"])
    async def open_session() -> dict:
        try:
            session_id, _ = await server._create_session()
        except SessionCapacityError as e:
            raise HTTPException(429, f"session cap reached: {e.active_sessions}/{e.max_sessions} open") from e
        except Exception as e:
            raise HTTPException(500, f"could not create env {env_id}: {e}") from e
        return {"session_id": session_id}

    @app.post("/sessions/{session_id}/reset", tags=["Sessions"])
    async def reset_session(session_id: str, data: dict[str, Any] = Body(default_factory=dict)) -> dict:
        env = _env_of(session_id)
        obs = await _call(session_id, env.reset, **data)
        return serialize_observation(obs)

    @app.post("/sessions/{session_id}/step", tags=["Sessions"])
    async def step_session(session_id: str, body: dict[str, Any] = Body(...)) -> dict:
        env = _env_of(session_id)
        if set(body) != {"action"} or not isinstance(body["action"], dict):
            raise HTTPException(422, 'step body must be {"action": {"content": str|null, "tool_calls": list|null}}')
        try:
            action = TextAction.model_validate(body["action"])
        except Exception as e:  # pydantic ValidationError
            raise HTTPException(422, f"invalid action: {e}") from e
        obs = await _call(session_id, env.step, action, step=True)
        return serialize_observation(obs)

    @app.get("/sessions/{session_id}/state", tags=["Sessions"])
    async def session_state(session_id: str) -> dict:
        env = _env_of(session_id)
        state = await _call(session_id, lambda: env.state)
        return state.model_dump()

    @app.delete("/sessions/{session_id}", tags=["Sessions"])
    async def close_session(session_id: str) -> dict:
        _env_of(session_id)
        await server._destroy_session(session_id)
        return {"closed": session_id}

    @app.get("/sessions", tags=["Sessions"])
    async def sessions() -> dict:
        return {"active": server.active_sessions, "max": server.max_concurrent_envs, "idle_timeout_s": idle_timeout_s}

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    return _BodyLimit(app, max_body_bytes)  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m envs.serve ENV_ID [--host 127.0.0.1] [--port 8000] [--max-sessions 64] ...``."""
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m envs.serve", description="Serve a registered env id over OpenEnv (HTTP + WebSocket).")
    p.add_argument("env_id", help="registered id, e.g. tau2/telecom-v0, GSM8K-v0")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-sessions", type=int, default=64, help="most concurrent sessions (default 64)")
    p.add_argument("--idle-timeout", type=float, default=600.0, help="seconds before an idle session is closed; 0 = never")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="largest request body / WS message")
    p.add_argument("--env-kwargs", default="{}", help='JSON kwargs for gym.make, e.g. \'{"split": "test"}\'')
    p.add_argument("--log-level", default="warning")
    a = p.parse_args(argv)
    try:
        env_kwargs = json.loads(a.env_kwargs)
    except json.JSONDecodeError as e:
        p.error(f"--env-kwargs is not JSON: {e}")
    if not isinstance(env_kwargs, dict):
        p.error("--env-kwargs must be a JSON object")
    try:
        gym.spec(a.env_id)
    except gym.error.Error as e:
        p.error(f"unknown env id {a.env_id!r} ({e}); registered here: {', '.join(_envs.ENV_IDS + _envs.COMPAT_IDS)}")
    app = build_app(a.env_id, env_kwargs, max_sessions=a.max_sessions, idle_timeout_s=a.idle_timeout or None,
                    max_body_bytes=a.max_body_bytes)
    uvicorn.run(app, host=a.host, port=a.port, ws_max_size=a.max_body_bytes, log_level=a.log_level)


if __name__ == "__main__":
    main()
