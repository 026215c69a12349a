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
* ``/health``, ``/schema``, ``/metadata`` -- as OpenEnv's, but none builds an env (OpenEnv's
  ``/metadata`` builds one per request, outside the session cap). ``/schema``'s action schema states the action's
  shape in its ``description`` and gives ``examples``.
* Any other path: 404 whose detail lists the routes served (``/mcp``: says where actions go instead).

Not served, where we diverge from OpenEnv's ``HTTPEnvServer.register_routes`` and why: its ``/mcp``
(HTTP and WebSocket; JSON-RPC ``openenv/session/create|close`` made and closed sessions beside the
socket that owns them) -- our envs have no MCP tools; FastAPI's ``/docs``, ``/redoc`` and
``/openapi.json`` -- pages meant for a browser, the client this server refuses (``/schema`` has the
schemas). So ``openenv validate --url`` passes its health, metadata and schema checks and fails its
``openapi_version_available``, ``mcp_endpoint`` and ``mode_endpoint_consistency`` ones.

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
  integer literals :data:`MAX_JSON_INT_DIGITS` (100) digits -> 422 / ``INVALID_JSON`` naming the limit;
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
single thread; the event loop only moves bytes, so ``/health`` and other sessions stay responsive.
Replies are encoded as UTF-8 with errors replaced (a lone surrogate an env echoes becomes ``?``), so a
reply can always be sent.

Sessions are isolated because each owns its env instance (tau2: its own copy-on-write database,
:mod:`envs.tau2.cow`) and runs it on its own single thread; session ids are random UUIDs.
"""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import functools
import json
import math
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym

import envs as _envs
from envs.action_text import json_depth
from envs.contract import check_action
from envs.serving.protocols import add_mcp_protocols

__all__ = ["GymTextEnvironment", "TextAction", "TextObservation", "TextState", "build_app", "main", "uvicorn_config"]

try:  # the optional extra [serve]
    import h11
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
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
        StepRequest,
    )
    from pydantic import ConfigDict, Field, ValidationError
    from starlette.websockets import WebSocket, WebSocketDisconnect
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.websockets.websockets_sansio_impl import (
        WebSocketsSansIOProtocol,
    )
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("envs.serve needs the [serve] extra: pip install -e '.[serve]' (openenv-core)") from e

gym.register_envs(_envs)

#: Default limit on a request body / WebSocket message (bytes).
DEFAULT_MAX_BODY_BYTES = 1 << 20
#: Default cap on the bytes of request bodies being received or served at once, across all connections (a body over
#: :data:`SMALL_BODY_BYTES` is counted from its head -- its ``Content-Length``, or as it arrives when chunked -- until
#: the app has answered it; one that would go over the cap is refused, 503, before a byte of it is read).
DEFAULT_MAX_INFLIGHT_BODY_BYTES = 64 << 20
#: Bodies of at most this many bytes are not counted against ``max_inflight_body_bytes``: uvicorn buffers this much per
#: connection before it stops reading anyway, and the connection cap bounds their total, so held large bodies never
#: refuse an honest step (whose body is a few kB).
SMALL_BODY_BYTES = 64 * 1024
#: After this many bytes of counted bodies have been freed, the C allocator is asked to give its free memory back to the
#: system (glibc's ``malloc_trim``, in a worker thread; elsewhere nothing): glibc keeps freed body buffers in its
#: arenas, and 64 held 1 MiB bodies left the server +70 MB above its baseline after they closed (+3 MB with the trim).
TRIM_AFTER_FREED_BYTES = 32 << 20
#: Default cap on open connections (HTTP and WebSocket, counted by uvicorn); one more is answered 503 and closed.
DEFAULT_MAX_CONNECTIONS = 256
#: Seconds a connection refused at the cap stays half-closed (its 503 sent, what it sends read and dropped) before it
#: is aborted: a client whose request was still on its way reads the 503 instead of a connection reset.
REFUSED_LINGER_S = 2.0
#: Default limit on one session's conversation (UTF-8 JSON bytes of its messages and actions).
DEFAULT_MAX_SESSION_BYTES = 8 << 20
#: Default seconds a client has to send a request's headers / its body.
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
#: Default seconds a reply may take to reach the client once the connection's send buffer is full (then the connection
#: is dropped: a client that does not read holds nothing past this).
DEFAULT_SEND_TIMEOUT_S = 30.0
#: Deepest nesting of ``[``/``{`` a request body / WebSocket message may hold (checked before parsing, in linear time).
MAX_JSON_NESTING = 100
#: Most digits an integer literal in a request body / WebSocket message may have.
MAX_JSON_INT_DIGITS = 100
#: An HTTP reply is handed to the connection in pieces of this many bytes, so that an unread reply waits in the app
#: (where it is counted against its session) rather than in the transport's buffer.
REPLY_CHUNK_BYTES = 256 * 1024
#: Longest ``episode_id`` accepted by ``reset``.
MAX_EPISODE_ID_CHARS = 256
#: ``Host`` names always served (loopback).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
_RESET_KEYS = ("seed", "episode_id", "task_id", "index")
#: The routes, as named in a 404's message.
SERVED_ROUTES = ("POST /reset, POST /step, GET /state (OpenEnv's stateless routes); POST /sessions, "
                 "POST /sessions/{id}/reset, POST /sessions/{id}/step, GET /sessions/{id}/state, DELETE /sessions/{id}, "
                 "GET /sessions; WebSocket /ws; GET /health, /schema, /metadata")


class ClientError(Exception):
    """A request the server refuses: an HTTP status, an OpenEnv WebSocket error code and a message."""

    status, code = 400, "VALIDATION_ERROR"

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status or type(self).status
        self.code = code or type(self).code


class BadRequestError(ClientError, ValueError):
    """The caller's request cannot be served (bad reset options, action outside the action space)."""


class StepOrderError(ClientError, RuntimeError):
    """``step`` before ``reset`` or after the episode ended."""

    status, code = 409, "EXECUTION_ERROR"


class SessionClosedError(ClientError, RuntimeError):
    """The session's env was closed (idle timeout or shutdown)."""

    status, code = 404, "SESSION_ERROR"


class SessionBytesExceeded(ClientError):
    """The session's conversation would go over ``max_session_bytes``: an action (refused before the step; the
    episode is kept) or an env output (the step ran; ``ends_session``: the session is closed after the reply)."""

    status, code = 413, "SESSION_BYTES_EXCEEDED"

    def __init__(self, message: str, ends_session: bool = False):
        super().__init__(message)
        self.ends_session = ends_session


class UnsentRepliesExceeded(ClientError):
    """The session's conversation plus its replies not yet taken by the client are over ``max_session_bytes``."""

    status, code = 429, "SESSION_BYTES_EXCEEDED"


#: The action's wire shape, in words (``/schema``'s action description and the 422 of a malformed action).
ACTION_SHAPE = '{"content": str|null, "tool_calls": list|null}'


class TextAction(Action):
    """An agent action: a JSON object, never a bare string. Raw model text: {"content": "<text>"} (its tool calls
    parsed from the text as by the env); or an assistant message: {"content": str|null, "tool_calls": [OpenAI-format
    tool calls]}. Over HTTP a step's body is {"action": <this object>, ...}. With OpenEnv's GenericEnvClient pass the
    dict, env.step({"content": text}): env.step(text) fails inside the client with a ValueError ("dictionary update
    sequence element #0 ..."), before anything is sent."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"content": "The answer is 72.\n#### 72"},
        {"content": '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1"}}</tool_call>'},
        {"content": None, "tool_calls": [{"id": "call_0", "type": "function", "function": {
            "name": "get_order_details", "arguments": '{"order_id": "#W1"}'}}]},
    ]})

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
    info: dict[str, Any] = Field(default_factory=dict, description="The step's info (JSON-safe), without the "
                                 "whole conversation ('messages': see state) and, on step, without 'tools'")


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


def _dumps(x: Any) -> str:
    """JSON text of ``x`` that always encodes to UTF-8: lone surrogates (invalid in UTF-8) become ``?``."""
    text = json.dumps(x, ensure_ascii=False, default=str, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8", "replace").decode("utf-8")


def _nbytes(x: Any) -> int:
    """UTF-8 JSON size of ``x`` (the unit of ``max_session_bytes``)."""
    return len(json.dumps(x, ensure_ascii=False, default=str).encode("utf-8", "replace"))


def _nbytes_within(messages: Any, budget: int | None) -> int | None:
    """UTF-8 JSON size of a list of messages, or ``None`` as soon as it is known to exceed ``budget`` (bytes; ``None``:
    no budget). Sized one message at a time, so a flood of 7,300 tool messages is not serialised whole to be refused."""
    if budget is None or not isinstance(messages, list):
        n = _nbytes(messages)
        return None if budget is not None and n > budget else n
    total = 2 + max(len(messages) - 1, 0)  # [ , ]
    for m in messages:
        total += _nbytes(m)
        if total > budget:
            return None
    return total


class GymTextEnvironment(Environment):
    """One session's env: ``gym.make(env_id, **env_kwargs)`` behind OpenEnv's ``Environment`` API.

    Args:
        env_id, env_kwargs: what ``gym.make`` builds.
        max_session_bytes: cap on the conversation (see the module docstring, "Bounds"); ``None``: none.

    Raises (from ``reset``/``step``): :class:`BadRequestError` (unknown reset option, task id or
    index the env rejects, a bad ``episode_id``, action outside the action space),
    :class:`StepOrderError`, :class:`SessionClosedError`, :class:`SessionBytesExceeded` (nothing is
    changed: the episode goes on); anything else the env raises propagates (an env failure).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, env_kwargs: dict | None = None, max_session_bytes: int | None = None):
        super().__init__()
        self.env_id = env_id
        self.max_session_bytes = max_session_bytes
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
        self.session_bytes = 0  # UTF-8 JSON bytes of this episode's conversation (reset messages, actions, obs)
        self.unsent_bytes = 0  # bytes of this session's replies not yet handed to the client's connection
        self._unsent_lock = threading.Lock()
        self._episode_no = 0  # counts resets: with the step count, the key of the cached db hash
        self._hash_key: tuple | None = None
        self._db_hash: str | None = None

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError("session closed (idle timeout or server shutdown); open a new session")

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              index: int | None = None, **kwargs: Any) -> TextObservation:
        self._check_open()
        if kwargs:
            raise BadRequestError(f"unknown reset option(s) {sorted(kwargs)}; accepted: {', '.join(_RESET_KEYS)}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise BadRequestError(f"seed must be a non-negative int, got {seed!r:.80}")
        if index is not None and (isinstance(index, bool) or not isinstance(index, int)):
            raise BadRequestError(f"index must be an int, got {index!r:.80}")
        if task_id is not None and not isinstance(task_id, str):
            raise BadRequestError(f"task_id must be a str, got {task_id!r:.80}")
        if episode_id is not None and (not isinstance(episode_id, str) or len(episode_id) > MAX_EPISODE_ID_CHARS):
            raise BadRequestError(f"episode_id must be a str of at most {MAX_EPISODE_ID_CHARS} chars, got {episode_id!r:.80}")
        options = {k: v for k, v in (("task_id", task_id), ("index", index)) if v is not None}
        try:
            obs, info = self._env.reset(seed=seed, options=options or None)
        except (ValueError, KeyError) as e:
            raise BadRequestError(f"reset rejected: {e}") from e
        self._started, self._done, self._reward, self._steps = True, False, None, 0
        self._info, self._episode_id = info, episode_id
        self._episode_no += 1
        opening = _nbytes_within(obs, self.max_session_bytes)
        if opening is None:
            self._done = True
            raise SessionBytesExceeded(f"reset refused: the episode's opening messages are over max_session_bytes="
                                       f"{self.max_session_bytes}; this session is closed", ends_session=True)
        messages = _jsonable(obs)
        self.session_bytes = opening
        return TextObservation(messages=messages, info=_jsonable(_without(info, "messages")), done=False, reward=None)

    def reset_request(self, data: Any) -> TextObservation:
        """``reset`` from a request's data (a JSON object of :data:`_RESET_KEYS`), checked before the call.

        Raises:
            BadRequestError: ``data`` is not an object, or has a key other than ``seed``, ``episode_id``,
                ``task_id``, ``index`` (e.g. ``{"self": 1}``); and whatever :meth:`reset` raises.
        """
        return self.reset(**_reset_data(data))

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
            raise BadRequestError(f"action outside the action space: {e}", status=422) from e
        action_bytes = _nbytes(env_action)
        if self.max_session_bytes is not None and self.session_bytes + action_bytes > self.max_session_bytes:
            raise SessionBytesExceeded(
                f"step refused: the conversation holds {self.session_bytes} bytes and this action {action_bytes}, over "
                f"max_session_bytes={self.max_session_bytes}; the episode is unchanged (reset starts a new one)")
        self._hash_key = None  # the database may change even if the step raises
        obs, reward, terminated, truncated, info = self._env.step(env_action)
        self._steps += 1
        self._done = bool(terminated or truncated)
        self._reward, self._info = float(reward), info
        room = None if self.max_session_bytes is None else self.max_session_bytes - self.session_bytes - action_bytes
        out_bytes = _nbytes_within(obs, room)
        step_info = _without(info, "messages", "tools")
        if out_bytes is not None and room is not None and _nbytes_within([step_info], room - out_bytes) is None:
            out_bytes = None  # the reply (messages + info) would be over the cap too
        if out_bytes is None:
            self._done = True
            raise SessionBytesExceeded(
                f"step output withheld: the env answered this action with more than the {room} bytes left under "
                f"max_session_bytes={self.max_session_bytes} (the conversation holds {self.session_bytes} bytes, the action "
                f"{action_bytes}); the step ran, the episode has ended and this session is closed: open a new session",
                ends_session=True)
        self.session_bytes += action_bytes + out_bytes
        return TextObservation(messages=_jsonable(obs), info=_jsonable(step_info), done=self._done,
                               reward=float(reward), terminated=bool(terminated), truncated=bool(truncated))

    def hold_unsent(self, n: int) -> None:
        """Count ``n`` bytes of a reply being sent (thread-safe; :meth:`release_unsent` when handed over)."""
        with self._unsent_lock:
            self.unsent_bytes += n

    def release_unsent(self, n: int) -> None:
        with self._unsent_lock:
            self.unsent_bytes -= n

    def check_unsent(self) -> None:
        """Raise :class:`UnsentRepliesExceeded` when the conversation plus the unsent replies are over the cap."""
        if self.max_session_bytes is not None and self.unsent_bytes and \
                self.session_bytes + self.unsent_bytes > self.max_session_bytes:
            raise UnsentRepliesExceeded(
                f"request refused: this session's conversation ({self.session_bytes} bytes) plus its replies not yet read "
                f"by the client ({self.unsent_bytes} bytes) are over max_session_bytes={self.max_session_bytes}; read "
                "them first (a reply not taken within the send timeout drops its connection)")

    @property
    def state(self) -> TextState:
        """The episode so far. tau2's database hash (69 ms on tau2 retail, measured in issue 25) is computed
        once per step: only ``reset``/``step`` change the database, so a loop of ``state`` requests costs a
        copy of the conversation, not a hash each."""
        self._check_open()
        if self._hash_key != (self._episode_no, self._steps):
            db_hash = None
            tau2_env = getattr(self._env.unwrapped, "tau2_environment", None) if self._started else None
            if tau2_env is not None:
                try:
                    db_hash = tau2_env.get_db_hash()
                except Exception:  # noqa: BLE001 - a hash is informative only
                    db_hash = None
            self._hash_key, self._db_hash = (self._episode_no, self._steps), db_hash
        db_hash = self._db_hash
        return TextState(
            episode_id=self._episode_id, step_count=self._steps, env_id=self.env_id,
            task_id=self._info.get("task_id"), index=self._info.get("index"),
            messages=_jsonable(self._info.get("messages", [])), done=self._done, reward=self._reward, db_hash=db_hash,
        )

    def get_metadata(self) -> EnvironmentMetadata:
        return _metadata(self.env_id)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()


def _without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


def _reset_data(data: Any) -> dict:
    """A request's reset data (``None``: none) checked for shape: a JSON object of :data:`_RESET_KEYS` only.

    Raises:
        BadRequestError: 422 not an object; 400 a key other than ``seed``, ``episode_id``, ``task_id``, ``index``
            (e.g. ``{"self": 1}``). The values are checked by :meth:`GymTextEnvironment.reset`.
    """
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadRequestError(f"reset data must be a JSON object, got {type(data).__name__}", status=422)
    unknown = sorted(k for k in data if k not in _RESET_KEYS)
    if unknown:
        raise BadRequestError(f"unknown reset option(s) {unknown!r:.200}; accepted: {', '.join(_RESET_KEYS)}")
    return data


def _metadata(env_id: str) -> EnvironmentMetadata:
    return EnvironmentMetadata(name=env_id, description=f"{env_id} (torchrl-grpo envs, served by envs.serve)", version="0")


# ------------------------------------------------------------------ one request, on the session's thread


def _bounded_int(text: str) -> int:
    """``parse_int`` of :func:`_parse`: an integer literal of more than :data:`MAX_JSON_INT_DIGITS` digits is refused
    before conversion (Python refuses over 4,300 digits with a ``ValueError``, and converting is quadratic)."""
    digits = len(text) - text.startswith("-")
    if digits > MAX_JSON_INT_DIGITS:
        raise ClientError(f"invalid JSON: an integer literal of {digits} digits, over the limit of {MAX_JSON_INT_DIGITS} "
                          "digits", status=422, code="INVALID_JSON")
    return int(text)


def _parse(raw: bytes | str | None, empty: Any = None) -> Any:
    """A request body / WebSocket message as JSON, within the server's limits.

    Raises:
        ClientError: 422 / ``INVALID_JSON``: not JSON (or not UTF-8/16/32), nested deeper than
            :data:`MAX_JSON_NESTING` (checked before parsing, in linear time), or an integer literal of more than
            :data:`MAX_JSON_INT_DIGITS` digits. The message names the limit.
    """
    if raw is None or (not raw.strip() if isinstance(raw, (str, bytes)) else False):
        return empty
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as e:
        raise ClientError(f"invalid JSON: {e}", status=422, code="INVALID_JSON") from e
    depth = json_depth(text)
    if depth > MAX_JSON_NESTING:
        raise ClientError(f"invalid JSON: nested {depth} levels deep, over the limit of {MAX_JSON_NESTING} levels",
                          status=422, code="INVALID_JSON")
    try:
        return json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as e:
        raise ClientError(f"invalid JSON: {e}", status=422, code="INVALID_JSON") from e


def _action(data: Any) -> TextAction:
    """The request's action as a :class:`TextAction`.

    Raises:
        ClientError: 422 naming :data:`ACTION_SHAPE`: ``data`` is not a JSON object (a bare string included) or not of
            that shape (an unknown key, a wrong type).
    """
    if not isinstance(data, dict):
        hint = ' (a bare string is not an action: send {"content": "<text>"})' if isinstance(data, str) else ""
        raise ClientError(f"action must be a JSON object {ACTION_SHAPE}{hint}, got {type(data).__name__}", status=422)
    try:
        return TextAction.model_validate(data)
    except ValidationError as e:
        raise ClientError(f"invalid action (expected {ACTION_SHAPE}): {e}", status=422) from e


def _run(env: GymTextEnvironment, op: str, payload: Any) -> tuple[str, dict]:
    """Do one operation (``reset`` / ``step`` / ``state``) on ``env``: ``(kind, data)`` of the reply."""
    if op == "reset":
        return "observation", serialize_observation(env.reset_request(payload))
    if op == "step":
        action = _action(payload)
        named = sorted(k for k in action.metadata if k in _RESET_KEYS)
        if named:  # a session acts on its own episode: a task named here would be silently ignored
            raise ClientError(f"a session step acts on the session's episode: its action's metadata may not name a task "
                              f"({', '.join(named)}); choose the task by reset", status=422)
        return "observation", serialize_observation(env.step(action))
    return "state", env.state.model_dump()


def _http_call(env: GymTextEnvironment, op: str, raw: bytes) -> tuple[int, bytes, bool]:
    """A session route's work, on the session's thread: parse ``raw``, run ``op``, encode (:func:`_http_reply`)."""
    def work() -> dict:
        if op == "reset":
            payload = _parse(raw, empty={})
        elif op == "step":
            body = _parse(raw)
            if not isinstance(body, dict) or "action" not in body or not set(body) <= set(_STEP_KEYS):
                raise ClientError(f'step body must be {{"action": {ACTION_SHAPE}, "timeout_s"?, "request_id"?}} '
                                  "(OpenEnv's StepRequest)", status=422)
            _check_step_request(body)
            payload = body["action"]
        else:
            payload = None
        return _run(env, op, payload)[1]

    return _http_reply(env, work)


#: Keys of a ``POST /sessions/{id}/step`` body, and of a stateless ``POST /step`` body besides the reset options:
#: OpenEnv's ``StepRequest`` fields.
_STEP_KEYS = ("action", "timeout_s", "request_id")


def _check_step_request(body: dict) -> None:
    """OpenEnv's own checks of a step body's optional fields (``timeout_s`` > 0, ``request_id`` <= 255 chars), which
    are otherwise ignored. Raises: ClientError 422 naming the field."""
    try:
        StepRequest.model_validate({k: body[k] for k in _STEP_KEYS if k in body})
    except ValidationError as e:
        raise ClientError(f"invalid step request: {e}", status=422) from e


def _stateless_request(op: str, raw: bytes) -> tuple[dict, TextAction | None]:
    """A stateless route's body (``POST /reset``, ``POST /step``) parsed and checked before any env is built:
    ``(reset data, action)`` (``action`` ``None`` for ``reset``).

    A ``/step`` body is OpenEnv's ``StepRequest`` -- ``{"action": {...}, "timeout_s"?, "request_id"?}`` -- plus the
    reset options of the one-step episode it plays, of which ``index``, ``task_id`` or ``seed`` must name the task,
    beside the action or in the action's ``metadata`` (OpenEnv's ``Action`` field: openenv-core 0.1.1's
    ``HTTPEnvClient`` sends ``{"action", "timeout_s"}`` only, so its subclass names the task there).

    Raises:
        ClientError: 422 invalid JSON (limits of :func:`_parse`), not an object, no ``action``, an action not of
            :data:`ACTION_SHAPE`, an unknown key, no task named, a task option named both beside the action and in its
            metadata with different values, ``timeout_s`` / ``request_id`` outside OpenEnv's ``StepRequest``; 400 an
            unknown reset option (``/reset``). The messages name the problem.
    """
    if op == "reset":
        return _reset_data(_parse(raw, empty={})), None
    body = _parse(raw)
    if not isinstance(body, dict) or "action" not in body:
        got = "an object without it" if isinstance(body, dict) else "nothing" if body is None else type(body).__name__
        raise ClientError(f'step body must be a JSON object {{"action": {ACTION_SHAPE}, "index" | "task_id" | "seed": '
                          f"...}}, got {got}", status=422)
    action = _action(body["action"])
    unknown = sorted(k for k in body if k not in _STEP_KEYS + _RESET_KEYS)
    if unknown:
        raise ClientError(f"unknown step key(s) {unknown!r:.200}; accepted: {', '.join(_STEP_KEYS + _RESET_KEYS)}",
                          status=422)
    _check_step_request(body)
    beside = {k: body[k] for k in _RESET_KEYS if k in body}
    within = {k: action.metadata[k] for k in _RESET_KEYS if k in action.metadata}
    clash = sorted(k for k in beside.keys() & within.keys() if beside[k] != within[k])
    if clash:
        raise ClientError(f"the step names its task twice, differently: {', '.join(clash)} beside the action and in its "
                          "metadata", status=422)
    reset = {**within, **beside}
    if all(reset.get(k) is None for k in ("index", "task_id", "seed")):
        raise ClientError('a stateless step plays a one-step episode on a fresh env: name its task beside the action '
                          '("index", "task_id" or "seed") or in the action\'s "metadata" (OpenEnv\'s Action field; '
                          "openenv-core 0.1.1's HTTPEnvClient sends only the action and timeout_s); to play an episode "
                          "of several steps keep a session: POST /sessions, then /sessions/{id}/reset and "
                          "/sessions/{id}/step, or the WebSocket /ws", status=422)
    return reset, action


def _stateless_work(env: GymTextEnvironment, op: str, reset: dict, action: TextAction | None) -> dict:
    """A stateless route's env work, on its env's thread: the reset's observation, or the one step's after the
    reset."""
    obs = env.reset(**reset)
    if op == "step":
        obs = env.step(action)
    return serialize_observation(obs)


def _http_reply(env: GymTextEnvironment, work: Callable[[], Any]) -> tuple[int, bytes, bool]:
    """Run ``work`` (on the session's thread) and encode its result or error as an HTTP reply.

    Returns ``(status, UTF-8 JSON body, end the session)``; the body's bytes are counted as unsent on ``env``
    (:meth:`GymTextEnvironment.hold_unsent`) until the route has handed them to the connection."""
    end = False
    try:
        env.check_unsent()
        status, text = 200, _dumps(work())
    except ClientError as e:
        status, text, end = e.status, _dumps({"detail": str(e)}), getattr(e, "ends_session", False)
    except Exception as e:  # noqa: BLE001 - an env failure: 500 for this session only
        status, text = 500, _dumps({"detail": f"env raised {type(e).__name__}: {e}"})
    body = text.encode("utf-8")
    del text
    env.hold_unsent(len(body))
    return status, body, end


def _ws_error(message: str, code: str) -> str:
    return _dumps({"type": "error", "data": {"message": message, "code": code}})


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


class _WriteDeadline:
    """A send timeout for an asyncio protocol: once the transport's buffer is full (``pause_writing``), the client has
    ``send_timeout_s`` to take what is pending (``resume_writing`` -- for HTTP, after the reply's last piece) or the
    connection is aborted, which frees its buffer at once (``close`` would wait for it to drain)."""

    send_timeout_s = DEFAULT_SEND_TIMEOUT_S
    _write_timer = None

    def _arm_write(self) -> None:
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.send_timeout_s, self._write_expired)

    def _disarm_write(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_expired(self) -> None:
        self._write_timer = None
        if self.transport is not None:
            self.transport.abort()


class _TimedWSProtocol(_WriteDeadline, WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol with :class:`_WriteDeadline` (one reply is written whole: taken = resumed)."""

    def pause_writing(self) -> None:
        super().pause_writing()
        self._arm_write()

    def resume_writing(self) -> None:
        self._disarm_write()
        super().resume_writing()

    def connection_lost(self, exc) -> None:
        self._disarm_write()
        super().connection_lost(exc)


# ------------------------------------------------------------------ ASGI guard: origin / host, body size and time


#: A ``Host`` header (RFC 9110 7.2, RFC 3986 3.2.2), parsed strictly: a bracketed IPv6 literal or a name of ASCII
#: letters, digits, ``.``, ``-``, ``_``, then optionally ``:`` and 1 to 5 ASCII digits; nothing else.
_HOST_RE = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9._-]+)(?::[0-9]{1,5})?", re.ASCII)


def _host_name(value: str) -> str | None:
    """The name of a ``Host`` header, lower-cased, without its port (an IPv6 literal without its brackets:
    ``[::1]:8000`` -> ``::1``); ``None`` when the header is not exactly of that form (``[::1]evil``, ``a:1:2``,
    ``a:8x``, a bare ``::1``, spaces or non-ASCII inside)."""
    m = _HOST_RE.fullmatch(value.strip().lower())
    return None if m is None else m.group(1).strip("[]")


class _Guard:
    """ASGI middleware in front of every route (HTTP and WebSocket).

    * ``Host`` not in ``allowed_hosts`` (unless ``"*"``), or an ``Origin`` header not in
      ``allowed_origins`` -> 403 (a WebSocket handshake is refused with 403 too).
    * HTTP bodies: read whole before the app sees them; over ``max_body_bytes`` -> 413 (by
      Content-Length or while streaming, chunked included), not received within ``body_timeout_s``
      -> 408; both close the connection.
    * Bodies in flight: a body over :data:`SMALL_BODY_BYTES` is counted (``inflight``) from its head -- all of its
      ``Content-Length`` at once, a chunked one as it arrives -- until the app has answered it; one that would bring
      the count over ``max_inflight_body_bytes`` -> 503 (``Retry-After: 1``) naming the cap, before any more of it is
      read; the connection stays open (a client still sending reads the 503, not a reset) and uvicorn drops the rest
      of the body as it arrives, which the client must finish within the header timeout (:class:`_TimedH11Protocol`).
      Small bodies are not counted (the connection cap bounds them).
    """

    def __init__(self, app, *, max_body_bytes: int, body_timeout_s: float, allowed_hosts: list[str],
                 allowed_origins: list[str], max_inflight_body_bytes: int = DEFAULT_MAX_INFLIGHT_BODY_BYTES):
        self.app, self.limit, self.body_timeout_s = app, max_body_bytes, body_timeout_s
        self.allowed_hosts = {h.lower().strip("[]") for h in allowed_hosts}
        self.allowed_origins = {o.rstrip("/").lower() for o in allowed_origins}
        self.max_inflight = max_inflight_body_bytes
        self.inflight = 0  # bytes of counted bodies being received or served (one event loop: no lock)
        self.freed = 0  # bytes of counted bodies freed since the allocator was last trimmed

    def _reserve(self, n: int) -> str | None:
        """Count ``n`` more bytes of bodies in flight; or, when that would go over the cap, count nothing and return
        the 503's message."""
        if self.inflight + n > self.max_inflight:
            return (f"server busy: request bodies being received total {self.inflight} bytes and this one needs {n} "
                    f"more, over max_inflight_body_bytes={self.max_inflight} (across all connections; bodies of at most "
                    f"{SMALL_BODY_BYTES} bytes are not counted); retry later")
        self.inflight += n
        return None

    def _refusal(self, scope) -> str | None:
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        if "*" not in self.allowed_hosts and _host_name(host) not in self.allowed_hosts:
            return (f"Host {host!r:.100} is not served here (allowed: {sorted(self.allowed_hosts)}; DNS-rebinding guard, "
                    "--allow-host adds names)")
        origin = headers.get(b"origin")
        if origin is not None and origin.decode("latin-1").rstrip("/").lower() not in self.allowed_origins:
            return (f"cross-origin request refused: Origin {origin.decode('latin-1')!r:.100} is not in the allow-list "
                    f"{sorted(self.allowed_origins)} (--allow-origin adds one)")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        refusal = self._refusal(scope)
        if scope["type"] == "websocket":
            if refusal is not None:  # closing before accepting: the handshake is answered 403
                await receive()  # websocket.connect
                return await send({"type": "websocket.close", "code": 1008, "reason": refusal[:120]})
            try:  # a socket the client already closed is not an error
                return await self.app(scope, receive, send)
            except WebSocketDisconnect:
                return None
        if refusal is not None:
            return await _reply(send, 403, refusal)
        length = next((int(v) for k, v in scope.get("headers", []) if k == b"content-length" and v.isdigit()), None)
        if length is not None and length > self.limit:
            return await _reply(send, 413, f"request body over the limit of {self.limit} bytes", close=True)
        held = [0]  # bytes this request counts in self.inflight
        try:
            if length is not None and length > SMALL_BODY_BYTES:
                busy = self._reserve(length)
                if busy is not None:  # answered at once; uvicorn drops the rest of the body as it comes
                    return await _reply(send, 503, busy)
                held[0] = length
            body = await self._receive_body(receive, send, held)
            if body is None:  # answered (408, 413, 503) or the client left
                return None
            replayed = False

            async def replay():
                nonlocal replayed, body
                if not replayed:
                    replayed = True
                    msg, body = {"type": "http.request", "body": body, "more_body": False}, b""
                    return msg
                return await receive()

            return await self.app(scope, replay, send)
        finally:
            self._release(held[0])

    def _release(self, n: int) -> None:
        """Uncount ``n`` bytes of a body that is gone; every :data:`TRIM_AFTER_FREED_BYTES` freed, trim the C
        allocator in a worker thread (:func:`_malloc_trim`)."""
        self.inflight -= n
        self.freed += n
        if self.freed >= TRIM_AFTER_FREED_BYTES:
            self.freed = 0
            asyncio.get_running_loop().run_in_executor(None, _malloc_trim)

    async def _receive_body(self, receive, send, held: list[int]) -> bytes | None:
        """The request's whole body, or ``None`` once answered (408 not received within ``body_timeout_s``, 413 over
        ``max_body_bytes``, 503 a chunked body over :data:`SMALL_BODY_BYTES` that would bring the bodies in flight over
        their cap: counted in ``held[0]`` as it arrives) or the client left."""
        chunks, seen, more = [], 0, True
        deadline = asyncio.get_running_loop().time() + self.body_timeout_s
        while more:
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except asyncio.TimeoutError:
                return await _reply(send, 408, f"request body not received within {self.body_timeout_s} s", close=True)
            if msg["type"] == "http.disconnect":
                return None
            piece = msg.get("body", b"")
            seen += len(piece)
            if seen > self.limit:
                return await _reply(send, 413, f"request body over the limit of {self.limit} bytes", close=True)
            if seen > max(held[0], SMALL_BODY_BYTES):  # chunked (or over its Content-Length: h11 refuses that first)
                busy = self._reserve(seen - held[0])
                if busy is not None:
                    return await _reply(send, 503, busy)
                held[0] = seen
            chunks.append(piece)
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        chunks.clear()
        return body


@functools.cache
def _libc_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def _malloc_trim() -> None:
    """Give the C allocator's free memory back to the system (glibc's ``malloc_trim(0)``: every arena, free pages
    anywhere in them); nothing where there is no such call."""
    trim = _libc_malloc_trim()
    if trim is not None:
        trim(0)


async def _reply(send, status: int, detail: str, close: bool = False) -> None:
    """Answer ``status`` with ``{"detail": detail}`` (a 503 with ``Retry-After: 1``; ``close``: and close the
    connection)."""
    body = _dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 503:
        headers.append((b"retry-after", b"1"))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _TimedH11Protocol(_WriteDeadline, H11Protocol):
    """uvicorn's h11 protocol with a header deadline: a connection that has not sent a complete request head
    within ``header_timeout_s`` of opening (or of its last response) is closed, and so is one still sending the body
    of a request answered before its body was read (a 503) ``header_timeout_s`` after that answer. uvicorn has no such timer
    (its keep-alive timer stops at the first byte), so half-open connections were held forever. And with a send
    deadline (:class:`_WriteDeadline`): a reply must be taken within ``send_timeout_s`` of the connection's buffer
    filling up (the timer runs from the first stall to the reply's last piece leaving the buffer). And with a cap on
    open connections: a connection that finds ``max_connections`` open (uvicorn's count: HTTP and WebSocket) is
    answered 503 naming the cap at once, then half-closed and aborted after :data:`REFUSED_LINGER_S` (what it sends
    meanwhile is dropped); it is not counted meanwhile."""

    max_connections = DEFAULT_MAX_CONNECTIONS
    _refused = False
    _linger_timer = None

    def _refuse_connection(self) -> None:
        self._refused = True
        self.connections.discard(self)
        body = _dumps({"detail": f"server busy: {self.max_connections} connections open, the cap (max_connections); "
                                 "retry later"}).encode()
        self.transport.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nretry-after: 1\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        self.transport.write_eof()
        self._linger_timer = self.loop.call_later(REFUSED_LINGER_S, self.transport.abort)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._arm_write()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.cycle is None or self.cycle.response_complete:
            self._disarm_write()

    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
    _head_timer = None

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_expired)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        answered = self.conn.our_state in (h11.DONE, h11.MUST_CLOSE) and self.conn.their_state is h11.SEND_BODY
        if not self.transport.is_closing() and (self.conn.their_state is h11.IDLE or answered):
            if self.transport.get_write_buffer_size():  # it has not even read our last reply: close() would wait on it
                self.transport.abort()
            else:
                self.transport.close()

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._refuse_connection()
        else:
            self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        self._disarm_write()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:  # answered 503 already: what it sends is dropped
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the request head is complete
            self._disarm()

    def handle_websocket_upgrade(self, event) -> None:
        self._disarm()
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.flow.write_paused:
            self._disarm_write()
        if not self.transport.is_closing():
            self._arm()


def uvicorn_config(app, *, host: str = "127.0.0.1", port: int = 8000, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                   header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
                   max_connections: int = DEFAULT_MAX_CONNECTIONS, log_level: str = "warning", **kwargs):
    """The ``uvicorn.Config`` that serves ``app``: WebSocket messages capped at ``max_body_bytes``, the h11
    protocol with a ``header_timeout_s`` head deadline (:class:`_TimedH11Protocol`), HTTP and WebSocket connections
    dropped when a reply is not taken within ``send_timeout_s`` seconds of their send buffer filling up, and at most
    ``max_connections`` open connections (default :data:`DEFAULT_MAX_CONNECTIONS`, 256; one more is answered 503 and
    closed).

    Raises:
        ValueError: a non-positive timeout or ``max_connections`` < 1.
    """
    for name, v in (("header_timeout_s", header_timeout_s), ("send_timeout_s", send_timeout_s),
                    ("max_connections", max_connections)):
        if v <= 0:
            raise ValueError(f"{name} must be > 0, got {v}")
    timers = {"header_timeout_s": float(header_timeout_s), "send_timeout_s": float(send_timeout_s),
              "max_connections": int(max_connections)}
    http = type("TimedH11Protocol", (_TimedH11Protocol,), timers)
    ws = type("TimedWSProtocol", (_TimedWSProtocol,), {"send_timeout_s": float(send_timeout_s)})
    return uvicorn.Config(app, host=host, port=port, http=http, ws=ws, ws_max_size=max_body_bytes, log_level=log_level,
                          **kwargs)


# ------------------------------------------------------------------ the app: sessions, routes, wiring


def _check_bounds(max_sessions: int, idle_timeout_s: float | None, max_body_bytes: int, body_timeout_s: float,
                  max_session_bytes: int | None) -> None:
    """:func:`build_app`'s bounds checked before anything is built.

    Raises:
        ValueError: ``max_sessions`` < 1, or a non-positive ``idle_timeout_s`` (``None`` allowed: never),
            ``max_body_bytes``, ``body_timeout_s`` or ``max_session_bytes`` (``None`` allowed: none); the message names
            the argument.
    """
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
    if idle_timeout_s is not None and idle_timeout_s <= 0:
        raise ValueError(f"idle_timeout_s must be > 0 or None, got {idle_timeout_s}")
    for name, v in (("max_body_bytes", max_body_bytes), ("body_timeout_s", body_timeout_s),
                    ("max_session_bytes", 1 if max_session_bytes is None else max_session_bytes)):
        if v <= 0:
            raise ValueError(f"{name} must be > 0, got {v}")


class _Sessions:
    """The app's open sessions: OpenEnv's session registry ``server`` (an ``HTTPEnvServer``: the cap, one thread per
    session, each env built and closed on its thread; its own reaper off) plus when each session was last used
    (seconds of ``clock``), the WebSocket that owns a session, and the idle reaper that closes a session unused for more
    than ``idle_timeout_s`` (``None``: never), looking every ``reap_interval_s`` real seconds (``None``: ``idle_timeout_s
    / 4`` within [0.05, 5])."""

    def __init__(self, server: HTTPEnvServer, clock: Callable[[], float], idle_timeout_s: float | None,
                 reap_interval_s: float | None):
        self.server, self.clock = server, clock
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
    """On startup, start ``sessions``' idle reaper (``app.state.reaper``; none without an idle timeout); on shutdown,
    stop it and close every session."""
    async def _start() -> None:
        if sessions.idle_timeout_s is not None:
            app.state.reaper = asyncio.create_task(sessions.reap_forever())

    async def _stop() -> None:
        task = getattr(app.state, "reaper", None)
        if task is not None:
            task.cancel()
        for sid in list(sessions.server._sessions):
            await sessions.destroy(sid)

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


async def _session_call(sessions: _Sessions, session_id: str, op: str, raw: bytes = b"") -> Response:
    """A ``/sessions/{id}/...`` request: ``op`` (``reset`` / ``step`` / ``state``) of body ``raw`` run on the session's
    thread (:func:`_http_call`), answered in pieces (:class:`_ChunkedReply`); 404 for an unknown session; a session
    whose output went over its cap is closed before the answer."""
    env = sessions.get(session_id)
    if env is None:
        return _json(404, _dumps({"detail": f"unknown session {session_id!r:.80} (never opened, deleted or idle-expired)"}))
    sessions.touch(session_id)
    try:
        status, body, end = await sessions.server._run_in_session_executor(session_id, _http_call, env, op, raw)
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
            return _json(404, _dumps({"detail": f"unknown session {session_id!r:.80}"}))
        await sessions.destroy(session_id)
        return _json(200, _dumps({"closed": session_id}))

    @app.get("/sessions", tags=["Sessions"], name="sessions")
    async def list_sessions() -> dict:
        server = sessions.server
        return {"active": server.active_sessions, "max": server.max_concurrent_envs,
                "idle_timeout_s": sessions.idle_timeout_s, "max_session_bytes": max_session_bytes,
                "unsent_bytes": sum(e.unsent_bytes for e in list(server._sessions.values()) if e is not None)}


async def _stateless_call(sessions: _Sessions, env_id: str, op: str, raw: bytes) -> Response:
    """OpenEnv's stateless semantics: a fresh env for this request only, counted against the session cap (as a
    session nobody else can name) until its reply has been handed over, then closed. The body is checked
    (:func:`_stateless_request`) before any env is built."""
    try:
        reset, action = await asyncio.to_thread(_stateless_request, op, raw)  # no env is built for a bad body
    except ClientError as e:
        return _json(e.status, _dumps({"detail": str(e)}))
    try:
        sid, env = await sessions.open()
    except Exception as e:  # noqa: BLE001 - the cap (429) or the env's build (500)
        return _open_failed(env_id, e, " (a stateless request's env takes a session's place until its reply is read)")
    try:
        status, body, _ = await sessions.server._run_in_session_executor(
            sid, _http_reply, env, functools.partial(_stateless_work, env, op, reset, action))
    except BaseException:
        await sessions.destroy(sid)
        raise
    return _ChunkedReply(body, status, functools.partial(env.release_unsent, len(body)),
                         after=functools.partial(sessions.destroy, sid))


def _add_stateless_routes(app: FastAPI, sessions: _Sessions, env_id: str) -> None:
    """OpenEnv's stateless routes: ``POST /reset``, ``POST /step`` (:func:`_stateless_call`) and ``GET /state`` (a
    fresh env's state, built without an env)."""
    fresh_state = TextState(env_id=env_id, done=True).model_dump()

    @app.post("/reset", tags=["Stateless"])
    async def stateless_reset(request: Request) -> Response:
        return await _stateless_call(sessions, env_id, "reset", await request.body())

    @app.post("/step", tags=["Stateless"])
    async def stateless_step(request: Request) -> Response:
        return await _stateless_call(sessions, env_id, "step", await request.body())

    @app.get("/state", tags=["Stateless"])
    async def stateless_state() -> dict:
        return fresh_state


def _add_not_found_handler(app: FastAPI) -> None:
    """Any other path: 404 whose detail lists :data:`SERVED_ROUTES` (under ``/mcp``: where actions go instead)."""
    async def not_found(request: Request, exc: Exception) -> Response:
        path = request.url.path
        if path.startswith("/mcp"):
            msg = (f"{path!r:.100} is not served: these envs have no MCP tools; their actions ({ACTION_SHAPE}) go to "
                   "POST /step (stateless), /sessions/{id}/step or the WebSocket /ws")
        else:
            msg = f"no route {request.method} {path!r:.100}; served: {SERVED_ROUTES}"
        return _json(404, _dumps({"detail": msg}))

    app.add_exception_handler(404, not_found)


def _add_info_routes(app: FastAPI, env_id: str) -> None:
    """``GET /health``, ``/schema`` (the action, observation and state JSON schemas) and ``/metadata``; none builds an
    env."""
    schema = {"action": TextAction.model_json_schema(), "observation": TextObservation.model_json_schema(),
              "state": TextState.model_json_schema()}
    metadata = _metadata(env_id).model_dump()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "healthy"}

    @app.get("/schema")
    async def get_schema() -> dict:
        return schema

    @app.get("/metadata")
    async def get_metadata() -> dict:
        return metadata


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


async def _ws_serve(websocket: WebSocket, sessions: _Sessions, sid: str, env: GymTextEnvironment) -> None:
    """Serve ``websocket``'s messages on session ``sid`` (:func:`_ws_call` on the session's thread) until the client
    leaves or closes, the reaper closes the session, or its output goes over the cap (close code 1008); then close the
    session and the socket. Each reply counts as unsent until the socket has taken it (a client that does not read is
    dropped after the send timeout)."""
    sessions.sockets[sid] = websocket
    close_code = 1000
    try:
        while True:
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
                reply, then = await sessions.server._run_in_session_executor(sid, _ws_call, env, text)
            sessions.touch(sid)
            try:
                if then == "close":
                    break
                if then == "end":  # free the env before answering
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
        await sessions.destroy(sid)
        try:
            await websocket.close(code=close_code, reason="session over: max_session_bytes" if close_code == 1008 else None)
        except RuntimeError:
            pass


def _add_websocket_route(app: FastAPI, sessions: _Sessions, env_id: str) -> None:
    """``/ws``: one WebSocket = one session (:func:`_ws_open`, then :func:`_ws_serve`)."""
    @app.websocket("/ws")
    async def ws_session(websocket: WebSocket) -> None:
        await websocket.accept()
        opened = await _ws_open(websocket, sessions, env_id)
        if opened is not None:
            await _ws_serve(websocket, sessions, *opened)


def build_app(env_id: str, env_kwargs: dict | None = None, *, max_sessions: int = 64, idle_timeout_s: float | None = 600.0,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_session_bytes: int | None = DEFAULT_MAX_SESSION_BYTES,
              body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S, allowed_origins: list[str] | tuple = (),
              allowed_hosts: list[str] | tuple = LOOPBACK_HOSTS, clock: Callable[[], float] = time.monotonic,
              reap_interval_s: float | None = None, max_inflight_body_bytes: int = DEFAULT_MAX_INFLIGHT_BODY_BYTES):
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

    Raises:
        gymnasium.error.Error: ``env_id`` is not registered (checked at once, not at the first session).
        ValueError: a non-positive bound.
    """
    gym.spec(env_id)  # fail fast on an unknown id
    _check_bounds(max_sessions, idle_timeout_s, max_body_bytes, body_timeout_s, max_session_bytes)
    if max_inflight_body_bytes < max_body_bytes:
        raise ValueError(f"max_inflight_body_bytes ({max_inflight_body_bytes}) must be >= max_body_bytes ({max_body_bytes})")
    factory = functools.partial(GymTextEnvironment, env_id, dict(env_kwargs or {}), max_session_bytes)
    # OpenEnv's session registry (cap, one thread per session, env built and closed on it); its reaper is off
    # (ours, _Sessions.reap_forever, runs on `clock`), and its routes are not registered (see the module docstring).
    server = HTTPEnvServer(factory, TextAction, TextObservation,
                           concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=None))
    app = FastAPI(title=f"envs.serve: {env_id}", version="0", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.openenv_server = server
    app.state.env_id = env_id
    sessions = _Sessions(server, clock, idle_timeout_s, reap_interval_s)
    _add_lifecycle(app, sessions)
    _add_session_routes(app, sessions, env_id, max_session_bytes)
    _add_stateless_routes(app, sessions, env_id)
    _add_not_found_handler(app)
    _add_info_routes(app, env_id)
    _add_websocket_route(app, sessions, env_id)
    add_mcp_protocols(app, sessions, run=_run, parse=_parse, max_body_bytes=max_body_bytes)
    return _Guard(app, max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s, allowed_hosts=list(allowed_hosts),
                  allowed_origins=list(allowed_origins), max_inflight_body_bytes=max_inflight_body_bytes)


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
                    max_inflight_body_bytes=a.max_inflight_body_bytes)
    _Server(uvicorn_config(app, host=a.host, port=a.port, max_body_bytes=a.max_body_bytes, header_timeout_s=a.header_timeout,
                           send_timeout_s=a.send_timeout, max_connections=a.max_connections, log_level=a.log_level),
            env_id=a.env_id).run()


if __name__ == "__main__":
    main()
