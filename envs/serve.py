"""Serve any registered env id over OpenEnv (HTTP + WebSocket), one env instance per session or stateless request.

Usage (extra ``[serve]``: ``pip install -e '.[serve]'``, which installs ``openenv-core``)::

    python -m envs.serve tau2/telecom-v0 --port 8000            # binds 127.0.0.1
    python -m envs.serve GSM8K-v1 --env-kwargs '{"split": "test"}' --max-sessions 64 --idle-timeout 600

Client side, OpenEnv's own WebSocket client (what TRL's and TorchRL's OpenEnv integrations drive)::

    from openenv.core.generic_client import GenericEnvClient
    with GenericEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        r = env.reset(task_id="3")                 # or index=i, seed=s
        r = env.step({"content": "<tool_call>{...}</tool_call>"})   # or {"tool_calls": [...]}
        r.observation["messages"], r.reward, r.done, env.state()

Over plain HTTP, openenv-core 0.1.1's ``HTTPEnvClient`` (the last openenv-core with an HTTP env client; subclass it
with ``_step_payload`` returning the action dict, ``_parse_result``, ``_parse_state``): ``base_url=<server>`` for the
stateless routes (a one-step episode; name the task in the action's ``metadata``, e.g. ``{"content": text,
"metadata": {"index": 3}}``), ``base_url=<server>/sessions/<id>`` (after ``POST /sessions``) for a whole episode
(``tests/test_openenv_http_client.py``).

Protocol (OpenEnv 0.3's session protocol, ``openenv.core.env_server``; the routes are ours):

* ``/ws`` -- one WebSocket = one session = one env instance (created by ``gym.make(env_id,
  **env_kwargs)`` when the socket opens, closed when it closes). Messages ``{"type": "reset", "data":
  {seed?, episode_id?, task_id?, index?}}``, ``{"type": "step", "data": action}``, ``{"type":
  "state"}``, ``{"type": "close"}``; answers ``{"type": "observation"|"state"|"error", "data": ...}``,
  an error's data being ``{"message", "code"}``. Anything malformed -- invalid JSON, JSON that is not an
  object (array, string, number, ``null``), a binary frame, an unknown type, wrong types, a refused
  step, an env exception -- is answered by an ``error`` message and the socket keeps serving the same
  episode. A message over ``max_body_bytes`` closes that socket only (WebSocket code 1009); an idle
  session's socket is closed (code 1001).
* ``/sessions`` -- the same sessions over plain HTTP for clients without WebSockets:
  ``POST /sessions`` -> ``201 {"session_id"}``; ``POST /sessions/{id}/reset`` (body: the reset
  data), ``POST /sessions/{id}/step`` (body OpenEnv's ``StepRequest``: ``{"action": ..., "timeout_s"?,
  "request_id"?}``, the last two checked as OpenEnv does and otherwise ignored; an action whose ``metadata`` names a
  task is refused, 422: a session's task is chosen by ``reset``), ``GET /sessions/{id}/state``,
  ``DELETE /sessions/{id}``, ``GET /sessions`` (counts, and ``unsent_bytes``: replies not yet taken by
  clients). Errors: 400 bad reset options (unknown
  option, task id or index the env rejects, ``episode_id`` not a string of at most
  ``MAX_EPISODE_ID_CHARS``), 403 a cross-origin request or a foreign ``Host`` (below), 404 unknown /
  expired session, 408 a body not received within ``body_timeout_s``, 409 step before reset or after
  the episode ended, 413 body over ``max_body_bytes`` (also when sent chunked), an action that would
  bring the session's conversation over ``max_session_bytes`` (refused; the episode is kept) or an env
  output that would (the step ran; its output is withheld and the session is closed), 422 invalid JSON,
  JSON nested deeper than :data:`MAX_JSON_NESTING` or holding an integer of more than
  :data:`MAX_JSON_INT_DIGITS` digits (the detail names the limit), or wrong types, 429 session cap
  reached or the session's unsent replies over its cap (below), 500 the env raised (that session only;
  it stays usable, e.g. by ``reset``).
  Every error body is ``{"detail": msg}``; the WebSocket error codes are OpenEnv's
  (``INVALID_JSON``, ``UNKNOWN_TYPE``, ``VALIDATION_ERROR``, ``EXECUTION_ERROR``, ``CAPACITY_REACHED``,
  ``FACTORY_ERROR``, ``SESSION_ERROR``) plus ``SESSION_BYTES_EXCEEDED`` (the 413s and the unsent-replies 429
  above); an env output over the cap is answered by that error and the socket is then closed (code 1008).
* ``POST /reset``, ``POST /step``, ``GET /state`` -- OpenEnv's stateless routes, with its semantics (its
  ``HTTPEnvServer`` builds a fresh env for every request and closes it after): no episode outlives its request.
  Bodies and replies are OpenEnv's ``ResetRequest`` / ``ResetResponse`` (``{"observation", "reward", "done"}``),
  ``StepRequest`` / ``StepResponse``. ``/reset`` (body: the reset data, as above) answers the task's opening;
  ``/step`` (body ``{"action": ..., "index" | "task_id" | "seed": ..., "episode_id"?, "timeout_s"?,
  "request_id"?}``, the task options also accepted inside the action's ``metadata``, where openenv-core 0.1.1's
  ``HTTPEnvClient`` -- which sends only ``{"action", "timeout_s"}`` -- can put them) plays a *one-step episode*: a
  fresh env reset to the task named beside (or in) the action, then the
  action -- the whole episode of a one-turn env (GSM8K, ReasoningGym, IFEval), only the first step of a tau2 one
  (play those through a session); a body naming no task is refused (422: a fresh env that was never reset has no
  task to act on); ``timeout_s`` and ``request_id`` are checked as OpenEnv's ``StepRequest`` does and otherwise
  ignored. ``/state`` answers a fresh env's state (no episode; built without an env: ask a session for an
  episode's). Within the rules of sessions: each request's env *is* a session (one thread, the same bounds and
  error codes as above), counted against ``max_sessions`` (429) from before it is built until its reply has been
  handed to the connection (an unread reply keeps its place and its ``unsent_bytes`` until the send timeout
  drops the connection), then closed; its id is never given out, so nothing else can reach it. A body is parsed and
  checked (JSON limits, shape, action, keys) before any env is built.
* ``/sessions/{id}/mcp`` -- a session's tools over standard MCP (the ``mcp`` SDK's Streamable HTTP transport,
  :mod:`envs.serving.mcp_routes`; ``docs/mcp.md``): ``tools/list`` the env's tools plus ``respond`` (a message to the
  customer), ``tools/call`` one step; results never carry the reward (``GET /sessions/{id}/state`` does).
* ``POST /mcp`` -- OpenEnv 0.10's JSON-RPC dialect (:mod:`envs.serving.openenv_mcp_routes`):
  ``openenv/session/create|close`` open and close sessions of the same registry (same cap), ``tools/list`` /
  ``tools/call`` with a ``session_id`` act on that session, without one on a fresh env per request. ``/ws?session_id=ID``
  attaches a WebSocket to an open session (OpenEnv's ``MCPToolClient`` resets over it); the session outlives the socket.
* ``/health``, ``/schema``, ``/metadata`` -- as OpenEnv's, but none builds an env (OpenEnv's
  ``/metadata`` builds one per request, outside the session cap). ``/schema``'s action schema states the action's
  shape in its ``description`` and gives ``examples``. ``/openapi.json``: FastAPI's document of the routes (what
  ``openenv validate --url`` reads; it passes all six of its checks).
* Any other path: 404 whose detail lists the routes served.

Not served, where we diverge from OpenEnv's ``HTTPEnvServer.register_routes`` and why: its WebSocket ``/mcp`` (the
HTTP ``/mcp`` and ``/ws?session_id=`` cover its clients); FastAPI's ``/docs`` and ``/redoc`` -- pages meant for a
browser, the client this server refuses (``/schema`` has the schemas).

Layout: this module holds :func:`build_app` (the wiring) and the CLI; each protocol's routes are a module of
:mod:`envs.serving` -- ``session_routes``, ``stateless_routes``, ``ws_routes``, ``info_routes``, ``mcp_routes``,
``openenv_mcp_routes`` -- over one session registry (``sessions``), one env wrapper and request work
(``environment``), one set of bounds (``limits``) and one guard (``guard``), so no route can bypass a bound.

Action (:class:`TextAction`): a JSON object ``{"content": str | None, "tool_calls": list | None}``, never a bare
string (over HTTP: 422 naming the shape; OpenEnv's ``GenericEnvClient.step("text")`` fails inside the client with
a ``ValueError`` before sending: pass ``{"content": "text"}``). With
``tool_calls`` it is passed to the env as an assistant message dict, otherwise ``content`` as the
model's raw text (parsed as in :mod:`envs.contract`, "Action"). Observation
(:class:`TextObservation`): the env's ``obs`` messages -- the messages *new* since the last step, never
the whole conversation -- ``reward``, ``done`` (``terminated or truncated``), both flags and the
step's ``info`` (JSON-safe copy) without ``info["messages"]`` (the whole conversation: ask ``state``)
and, on ``step``, without ``info["tools"]`` (sent once, on ``reset``). State (:class:`TextState`): the
session's env id, task, whole conversation, step count, reward so far and -- for tau2 -- the episode
database hash (``db_hash``), so two sessions can be checked for isolation.

Bounds (every one a :func:`build_app` / :func:`uvicorn_config` argument and a CLI flag; default, and what
happens past it):

* sessions: 64 (``--max-sessions``) -> 429 / ``CAPACITY_REACHED``;
* request body / WebSocket message: 1 MiB (``--max-body-bytes``) -> 413 / socket closed (1009);
* conversation per session: 8 MiB (``--max-session-bytes``; 0 = none), checked on every append and every
  reply: an action over it -> the step is refused (413 / ``SESSION_BYTES_EXCEEDED``) and the episode kept
  (``reset`` starts again from zero); an env output over it (a flood of tool calls, a reset opening) -> 413 /
  ``SESSION_BYTES_EXCEEDED``, the output withheld and the session closed (WebSocket close code 1008);
* replies a client has not taken (``unsent_bytes``) count with the conversation: while a session's conversation
  plus its unsent replies are over ``max_session_bytes``, its requests are refused (429 /
  ``SESSION_BYTES_EXCEEDED``); HTTP replies are handed to the connection in :data:`REPLY_CHUNK_BYTES` pieces, so an
  unread reply waits, counted, in the server rather than in the transport's buffer;
* sending: 30 s (``--send-timeout``) from a connection's send buffer filling up to the client taking the reply ->
  the connection is aborted (its buffer freed at once; a WebSocket's session closed);
* JSON of a body / message: nesting :data:`MAX_JSON_NESTING` (100, checked in linear time before parsing),
  integer literals :data:`MAX_JSON_INT_DIGITS` (100) digits, arrays + objects :data:`MAX_JSON_CONTAINERS` (100,000,
  counted by the same scan) -> 422 / ``INVALID_JSON`` naming the limit;
* idle session: 600 s (``--idle-timeout``) -> session closed, id forgotten, its socket closed;
* request head: 10 s from the connection's opening or its last response (``--header-timeout``) -> connection
  closed (uvicorn has no such timer: half-open connections were held forever);
* request body: 30 s (``--body-timeout``) -> 408, connection closed.

The conversation size is counted as UTF-8 JSON bytes of the reset messages, every action and every
observation's messages (and, for the 429 above, the replies not yet sent). The server holds several bytes of
memory per counted byte (issue 25 measured +197
MB RSS for 40 steps of 1 MB on tau2, ~5x; ``benchmarks/openenv_serve_load.py`` saw +105 MB after 4 airline
sessions filled to ~7 MiB each, ~4x), so 64 sessions at the 8 MiB cap need ~2-3 GB. A step is refused
when the action would bring the count over the cap, and an env output that would is withheld (the session
ends), so the count never exceeds the cap; a session holds at most its conversation plus about one cap of unsent replies (plus one reply in
a WebSocket's buffer), each for at most the send timeout once its client stops reading.

Browsers: a request carrying an ``Origin`` header not in ``allowed_origins`` (``--allow-origin``;
none by default) is refused with 403 -- HTTP and WebSocket handshakes alike -- and so is a ``Host``
header not in ``allowed_hosts`` (loopback names, the bind address, ``--allow-host``; ``*`` allows any),
so that a web page in the user's browser can neither drive the server directly nor by DNS rebinding.
Clients that are not browsers send no ``Origin`` and are served. ``--host 0.0.0.0`` prints a warning.

Event loop: every piece of env work -- ``gym.make``, ``reset``, ``step``, ``state`` (tau2's
database hash), ``close`` -- and the JSON parsing and encoding of messages runs on the session's own
single thread; the bodies of requests without a session (``/reset``, ``/step``, ``POST /mcp``) are parsed and their
replies encoded on a pool of :data:`~envs.serving.limits.PARSE_THREADS` threads, and the ``mcp`` SDK behind
``/sessions/{id}/mcp`` (which parses each body again) runs on an event loop of its own; the event loop only moves
bytes, so ``/health`` and other sessions stay responsive (issue 49: 1 MiB of ``[0,0,...]`` parsed on the loop held it
~0.6 s; a body now holds it at most for one C-level parse, and integers are checked by a Python call only when the
text holds a run of digits over the limit). A session's thread is started off the loop (on a starter thread,
:mod:`envs.serving.session_threads`: ``Thread.start()`` waits for the new thread to be scheduled), and WebSocket
messages are not compressed unless ``--ws-compression`` (permessage-deflate runs on the loop, per message).
Replies are encoded as UTF-8 with errors replaced (a lone surrogate an env echoes becomes ``?``), so a
reply can always be sent.

Worker processes (``--workers N``, :mod:`envs.serving.workers`; default 0): the sessions' envs live in N worker
processes instead of this one, so that env work never shares the event loop's GIL; this process keeps the sockets,
the guard, every route, the session registry (cap, idle reaper, unsent bytes) and ``/health``. A session is placed
once, when opened, on the worker with the fewest open sessions, and every later request of it, on any connection and
protocol, goes to that worker (``GET /sessions`` lists open sessions per worker pid). uvicorn's own ``--workers`` is
not used: its workers share the listening socket, so a session id on a new connection would reach whichever worker
accepted it. A worker that dies takes its sessions with it (503s);
the next session placed starts a fresh one in its place. The event loop sends each session operation to its worker
itself, over one link per worker (:mod:`envs.serving.worker_link`): no thread of this process runs for it.

Priority (``--session-nice N``, default :data:`~envs.serving.limits.DEFAULT_SESSION_NICE` = 10; Linux): each
session's thread and each worker process runs at N above the event loop's niceness, so that when the cores are busy
``/health``, admission and every socket's bytes are served before session work. A server already at niceness 19 (or
``--session-nice 0``) runs both at the same priority. On a machine shared with other work the sessions then also yield
to that work.

Sessions are isolated because each owns its env instance (tau2: its own copy-on-write database,
:mod:`envs.tau2.cow`) and runs it on its own single thread; session ids are random UUIDs.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable

import gymnasium as gym

import envs as _envs
from envs.serving.protocols import add_mcp_protocols


try:  # the optional extra [serve]
    import uvicorn
    from fastapi import FastAPI
    from openenv.core.env_server.types import ConcurrencyConfig
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("envs.serve needs the [serve] extra: pip install -e '.[serve]' (openenv-core)") from e

from envs.serving.limits import (
    DEFAULT_BODY_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_INFLIGHT_BODY_BYTES, DEFAULT_MAX_SESSION_BYTES, DEFAULT_SEND_TIMEOUT_S, FD_RESERVE, LOOPBACK_HOSTS,
    MAX_JSON_CONTAINERS, MAX_JSON_INT_DIGITS, MAX_JSON_NESTING, SMALL_BODY_BYTES, _check_bounds,
    DEFAULT_SESSION_NICE,
)
from envs.serving.environment import GymTextEnvironment, TextAction, TextObservation, TextState
from envs.serving.guard import _Guard, uvicorn_config
from envs.serving.sessions import _Sessions, _SessionServer, _add_lifecycle
from envs.serving.session_threads import SessionThreads, check_nice
from envs.serving.session_routes import _add_session_routes
from envs.serving.stateless_routes import _add_stateless_routes
from envs.serving.ws_routes import _add_websocket_route
from envs.serving.info_routes import _add_info_routes, _add_not_found_handler
from envs.serving.workers import WorkerPool, worker_factory


__all__ = ["GymTextEnvironment", "TextAction", "TextObservation", "TextState", "build_app", "main", "uvicorn_config",
           "DEFAULT_MAX_BODY_BYTES", "DEFAULT_MAX_INFLIGHT_BODY_BYTES", "DEFAULT_MAX_SESSION_BYTES", "MAX_JSON_CONTAINERS", "MAX_JSON_INT_DIGITS",
           "MAX_JSON_NESTING", "SMALL_BODY_BYTES"]


def build_app(env_id: str, env_kwargs: dict | None = None, *, max_sessions: int = 64, idle_timeout_s: float | None = 600.0,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_session_bytes: int | None = DEFAULT_MAX_SESSION_BYTES,
              body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S, allowed_origins: list[str] | tuple = (),
              allowed_hosts: list[str] | tuple = LOOPBACK_HOSTS, clock: Callable[[], float] = time.monotonic,
              reap_interval_s: float | None = None, max_inflight_body_bytes: int = DEFAULT_MAX_INFLIGHT_BODY_BYTES,
              workers: int = 0, session_nice: int = DEFAULT_SESSION_NICE):
    """The ASGI app serving ``env_id`` (see the module docstring for routes, errors and bounds).

    Args:
        env_id: a registered Gymnasium id (``envs.ENV_IDS`` or any other registered id).
        env_kwargs: keyword arguments of ``gym.make`` for every session's env.
        max_sessions: most sessions open at once (WebSocket + HTTP, a stateless request's env included until its
            reply is read); more -> 429 / ``CAPACITY_REACHED``.
        idle_timeout_s: seconds (of ``clock``) without a request after which a session is closed (``None``: never).
        max_body_bytes: largest HTTP body accepted (the WebSocket message limit is uvicorn's ``ws_max_size``:
            :func:`uvicorn_config`).
        max_inflight_body_bytes: cap on the bytes of HTTP bodies being received or served at once, across all
            connections (default :data:`DEFAULT_MAX_INFLIGHT_BODY_BYTES`, 64 MiB; bodies of at most
            :data:`SMALL_BODY_BYTES` are not counted); a body that would go over it -> 503 before it is read.
        max_session_bytes: cap on one session's conversation in UTF-8 JSON bytes, checked on every append and reply,
            with the session's unsent replies counted against it too (``None``: none; see the module docstring).
        body_timeout_s: seconds a client has to send a whole request body (else 408).
        allowed_origins: ``Origin`` values served (exact, e.g. ``"http://localhost:3000"``); a request with any
            other ``Origin`` is refused (403). Requests without ``Origin`` (non-browser clients) are served.
        allowed_hosts: ``Host`` names served (port ignored); ``"*"``: any.
        clock: time source of the idle timeout (seconds; injectable for tests).
        reap_interval_s: how often (real seconds) idle sessions are looked for; default ``idle_timeout_s / 4``
            within [0.05, 5].
        workers: ``0`` (default): every session's env in this process, on the session's own thread; ``N``: the envs
            in ``N`` worker processes (started with the app), a session placed once on the emptiest and kept there
            (:mod:`envs.serving.workers`; ``env_id`` must then be registered by ``import envs``, and the env's state
            lives in the worker: ``tau2``'s database, its graders).
        session_nice: niceness (0-19, default :data:`~envs.serving.limits.DEFAULT_SESSION_NICE`) each session's thread
            and each worker process adds to the niceness of the thread calling this (the event loop's): session work
            yields the CPU to ``/health``, admission and every socket's bytes (Linux; 0: the same priority).

    Raises:
        gymnasium.error.Error: ``env_id`` is not registered (checked at once, not at the first session).
        ValueError: a non-positive bound, ``workers`` < 0, or ``session_nice`` not an integer in [0, 19].
    """
    gym.spec(env_id)  # fail fast on an unknown id
    _check_bounds(max_sessions, idle_timeout_s, max_body_bytes, body_timeout_s, max_session_bytes)
    if max_inflight_body_bytes < max_body_bytes:
        raise ValueError(f"max_inflight_body_bytes ({max_inflight_body_bytes}) must be >= max_body_bytes ({max_body_bytes})")
    threads = SessionThreads(nice=session_nice)  # checks session_nice
    pool = _worker_pool(workers, session_nice)
    factory = (worker_factory(pool, env_id, dict(env_kwargs or {}), max_session_bytes) if pool is not None else
               functools.partial(GymTextEnvironment, env_id, dict(env_kwargs or {}), max_session_bytes))
    # OpenEnv's session registry (cap, one thread per session, env built and closed on it; the threads started off the
    # event loop); its reaper is off (ours, _Sessions.reap_forever, runs on `clock`), and its routes are not registered
    # (see the module docstring).
    server = _SessionServer(factory, TextAction, TextObservation, threads=threads,
                            concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=None))
    app = FastAPI(title=f"envs.serve: {env_id}", version="0", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.openenv_server = server
    app.state.env_id = env_id
    sessions = _Sessions(server, clock, idle_timeout_s, reap_interval_s, pool)
    _add_lifecycle(app, sessions)
    _add_session_routes(app, sessions, env_id, max_session_bytes)
    _add_stateless_routes(app, sessions, env_id)
    _add_not_found_handler(app)
    _add_info_routes(app, env_id)
    _add_websocket_route(app, sessions, env_id)
    add_mcp_protocols(app, sessions, max_body_bytes=max_body_bytes)
    return _Guard(app, max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s, allowed_hosts=list(allowed_hosts),
                  allowed_origins=list(allowed_origins), max_inflight_body_bytes=max_inflight_body_bytes)


def _worker_pool(workers: int, nice: int = 0) -> WorkerPool | None:
    """``None`` for ``workers == 0``, else a (not yet started) pool of ``workers`` processes at ``nice`` above this
    thread. Raises: ValueError ``workers`` < 0."""
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    return WorkerPool(workers, nice) if workers else None


class _Server(uvicorn.Server):
    """uvicorn's server that prints one ``envs.serve: ENV_ID listening on http://HOST:PORT (WebSocket ...)`` line on
    stdout once its sockets are bound (the bound port: ``--port 0`` picks a free one)."""

    def __init__(self, config, env_id: str):
        super().__init__(config)
        self.env_id = env_id

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                host = f"[{host}]" if ":" in host else host
                print(f"envs.serve: {self.env_id} listening on http://{host}:{port} (WebSocket ws://{host}:{port}/ws)",
                      flush=True)


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m envs.serve ENV_ID [--host 127.0.0.1] [--port 8000] [--max-sessions 64] ...``."""
    p = argparse.ArgumentParser(prog="python -m envs.serve", description="Serve a registered env id over OpenEnv (HTTP + WebSocket).")
    p.add_argument("env_id", help="registered id, e.g. tau2/telecom-v0, GSM8K-v1")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-sessions", type=int, default=64, help="most concurrent sessions (default 64)")
    p.add_argument("--idle-timeout", type=float, default=600.0, help="seconds before an idle session is closed; 0 = never")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="largest request body / WS message (default 1 MiB)")
    p.add_argument("--max-inflight-body-bytes", type=int, default=DEFAULT_MAX_INFLIGHT_BODY_BYTES,
                   help="cap on the bytes of request bodies being received or served at once, across all connections "
                        f"(default 64 MiB; bodies of at most {SMALL_BODY_BYTES} bytes not counted); beyond: 503")
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                   help="most open connections, HTTP and WebSocket (default 256); beyond: 503 and closed")
    p.add_argument("--max-session-bytes", type=int, default=DEFAULT_MAX_SESSION_BYTES,
                   help="cap on one session's conversation (UTF-8 JSON bytes; default 8 MiB); 0 = none")
    p.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT_S, help="seconds to send request headers")
    p.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT_S, help="seconds to send a request body")
    p.add_argument("--send-timeout", type=float, default=DEFAULT_SEND_TIMEOUT_S,
                   help="seconds a client has to take a reply once its connection's send buffer is full, else dropped")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a browser Origin to serve, e.g. http://localhost:3000 (repeatable; default: none)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a Host name to serve besides loopback and the bind address (repeatable; '*': any)")
    p.add_argument("--ws-compression", action="store_true",
                   help="WebSocket permessage-deflate (default off: it costs event-loop CPU per message, for JSON "
                        "on loopback or a LAN)")
    p.add_argument("--workers", type=int, default=0,
                   help="sessions' envs in N worker processes, each session kept on one (default 0: in this process)")
    p.add_argument("--session-nice", type=int, default=DEFAULT_SESSION_NICE,
                   help="niceness the sessions' threads and worker processes add to the event loop's (0-19, default "
                        f"{DEFAULT_SESSION_NICE}: /health and admission are served first when the CPUs are busy; 0: same)")
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
        check_nice(a.session_nice, "--session-nice")
    except ValueError as e:
        p.error(str(e))
    try:
        gym.spec(a.env_id)
    except gym.error.Error as e:
        p.error(f"unknown env id {a.env_id!r} ({e}); registered here: {', '.join(_envs.ENV_IDS + _envs.COMPAT_IDS)}")
    hosts = list(LOOPBACK_HOSTS) + list(a.allow_host)
    if a.host in ("0.0.0.0", "::", ""):
        print(f"WARNING: --host {a.host or '0.0.0.0'} serves every network interface: anyone who can reach this machine can "
              "open sessions (no authentication). Requests are served only with a Host header in "
              f"{hosts} (add names with --allow-host).", file=sys.stderr, flush=True)
    elif a.host not in hosts:
        hosts.append(a.host)
    app = build_app(a.env_id, env_kwargs, max_sessions=a.max_sessions, idle_timeout_s=a.idle_timeout or None,
                    max_body_bytes=a.max_body_bytes, max_session_bytes=a.max_session_bytes or None,
                    body_timeout_s=a.body_timeout, allowed_origins=a.allow_origin, allowed_hosts=hosts,
                    max_inflight_body_bytes=a.max_inflight_body_bytes, workers=a.workers, session_nice=a.session_nice)
    # with workers, a margin of one descriptor per session (sessions reach their worker over one link per worker now)
    # and OpenEnv's shared pool (32 threads) may hold some
    reserve = FD_RESERVE + (a.max_sessions + 32 * a.workers if a.workers else 0)
    _Server(uvicorn_config(app, host=a.host, port=a.port, max_body_bytes=a.max_body_bytes, header_timeout_s=a.header_timeout,
                           send_timeout_s=a.send_timeout, max_connections=a.max_connections, log_level=a.log_level,
                           fd_reserve=reserve, ws_per_message_deflate=a.ws_compression),
            env_id=a.env_id).run()


if __name__ == "__main__":
    main()
