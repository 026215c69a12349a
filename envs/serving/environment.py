"""One session's env behind OpenEnv's ``Environment`` API (:class:`GymTextEnvironment`), the wire models
(:class:`TextAction`, :class:`TextObservation`, :class:`TextState`), the errors a request can get
(:class:`ClientError` and its kinds) and one request's work on the session's thread: JSON parsing within
the limits (:func:`_parse`), the operation (:func:`_run`), the encoded HTTP reply (:func:`_http_reply`)."""
from __future__ import annotations

import functools
import json
import math
import threading
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

import envs as _envs
from envs.action_text import json_shape
from envs.contract import check_action


try:  # the optional extra [serve]
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.serialization import serialize_observation
    from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State, StepRequest
    from pydantic import ConfigDict, Field, ValidationError
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("envs.serve needs the [serve] extra: pip install -e '.[serve]' (openenv-core)") from e

from envs.serving.limits import (
    MAX_EPISODE_ID_CHARS, MAX_JSON_CONTAINERS, MAX_JSON_INT_DIGITS, MAX_JSON_NESTING, SMALL_BODY_BYTES,
)

gym.register_envs(_envs)


_RESET_KEYS = ("seed", "episode_id", "task_id", "index")


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


def _serialised(method: Callable) -> Callable:
    """``method`` of :class:`GymTextEnvironment` run holding the session's lock: ``reset``, ``step``, ``state`` and
    ``close`` of one session never overlap, whichever threads call them (the server runs a session's work on the
    session's own thread only while the session is registered: a request that looked it up just before a ``DELETE`` or
    the idle reaper closed it runs on OpenEnv's shared pool, beside the close). A close waits for the operation in
    progress; an operation after it raises :class:`SessionClosedError`."""
    @functools.wraps(method)
    def locked(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


class UnsentReplyCount:
    """``unsent_bytes``: the bytes of a session's replies not yet handed to its client's connection, counted under a
    lock. Kept by the session's env (:class:`GymTextEnvironment`) and, for a session whose env lives in a worker
    process, by its handle in the server, where the replies are sent (:class:`envs.serving.workers.WorkerEnvironment`).
    """

    def _init_unsent(self) -> None:
        self.unsent_bytes = 0
        self._unsent_lock = threading.Lock()

    def hold_unsent(self, n: int) -> None:
        """Count ``n`` bytes of a reply being sent (thread-safe; :meth:`release_unsent` when handed over)."""
        with self._unsent_lock:
            self.unsent_bytes += n

    def release_unsent(self, n: int) -> None:
        with self._unsent_lock:
            self.unsent_bytes -= n


class GymTextEnvironment(UnsentReplyCount, Environment):
    """One session's env: ``gym.make(env_id, **env_kwargs)`` behind OpenEnv's ``Environment`` API.

    Args:
        env_id, env_kwargs: what ``gym.make`` builds.
        max_session_bytes: cap on the conversation (see the module docstring, "Bounds"); ``None``: none.

    Raises (from ``reset``/``step``): :class:`BadRequestError` (unknown reset option, task id or
    index the env rejects, a bad ``episode_id``, action outside the action space),
    :class:`StepOrderError`, :class:`SessionClosedError`, :class:`SessionBytesExceeded` (nothing is
    changed: the episode goes on); anything else the env raises propagates (an env failure).

    Thread-safe per session: ``reset``, ``step``, ``state`` and ``close`` hold the session's lock (a close waits for
    the operation in progress; issue 49).
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
        self._init_unsent()  # bytes of this session's replies not yet handed to the client's connection
        self._lock = threading.RLock()  # one operation of this session at a time, its close included (_serialised)
        self._episode_no = 0  # counts resets: with the step count, the key of the cached db hash
        self._hash_key: tuple | None = None
        self._db_hash: str | None = None

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError("session closed (idle timeout or server shutdown); open a new session")

    @_serialised
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

    @_serialised
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

    def call(self, fn: Callable, *args: Any) -> Any:
        """``fn(self, *args)``: a route's work on this session (:meth:`envs.serving.sessions._Sessions.run`; a
        session in a worker process has the same method, :class:`envs.serving.workers.WorkerEnvironment`)."""
        return fn(self, *args)

    def check_unsent(self) -> None:
        """Raise :class:`UnsentRepliesExceeded` when the conversation plus the unsent replies are over the cap."""
        if self.max_session_bytes is not None and self.unsent_bytes and \
                self.session_bytes + self.unsent_bytes > self.max_session_bytes:
            raise UnsentRepliesExceeded(
                f"request refused: this session's conversation ({self.session_bytes} bytes) plus its replies not yet read "
                f"by the client ({self.unsent_bytes} bytes) are over max_session_bytes={self.max_session_bytes}; read "
                "them first (a reply not taken within the send timeout drops its connection)")

    @property
    @_serialised
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

    @property
    def tools(self) -> list[dict] | None:
        """The current episode's tools: the env's OpenAI function schemas (``info["tools"]``; ``[]`` for an env
        without tools), ``None`` before the first ``reset``."""
        return (self._info.get("tools") or []) if self._started else None

    def get_metadata(self) -> EnvironmentMetadata:
        return _metadata(self.env_id)

    @_serialised
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


def _bounded_int(text: str) -> int:
    """``parse_int`` of :func:`_parse`: an integer literal of more than :data:`MAX_JSON_INT_DIGITS` digits is refused
    before conversion (Python refuses over 4,300 digits with a ``ValueError``, and converting is quadratic)."""
    digits = len(text) - text.startswith("-")
    if digits > MAX_JSON_INT_DIGITS:
        raise ClientError(f"invalid JSON: an integer literal of {digits} digits, over the limit of {MAX_JSON_INT_DIGITS} "
                          "digits", status=422, code="INVALID_JSON")
    return int(text)


def _longest_digit_run(text: str) -> int:
    """Length of the longest run of ASCII digits in ``text`` (anywhere: numbers and strings alike); linear time,
    vectorised (UTF-8 continuation bytes are never ASCII digits)."""
    b = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    if b.size == 0:
        return 0
    other = np.flatnonzero((b < 0x30) | (b > 0x39))
    return int(np.diff(other, prepend=-1, append=b.size).max()) - 1


def _parse(raw: bytes | str | None, empty: Any = None) -> Any:
    """A request body / WebSocket message as JSON, within the server's limits.

    Raises:
        ClientError: 422 / ``INVALID_JSON``: not JSON (or not UTF-8/16/32), nested deeper than
            :data:`MAX_JSON_NESTING` or holding more than :data:`MAX_JSON_CONTAINERS` arrays and objects (both checked
            before parsing, in linear time), or an integer literal of more than :data:`MAX_JSON_INT_DIGITS` digits. The
            message names the limit.
    """
    if raw is None or (not raw.strip() if isinstance(raw, (str, bytes)) else False):
        return empty
    if len(raw) <= SMALL_BODY_BYTES:
        return _parse_text(raw)
    with _LARGE_PARSE:  # one large body parsed at a time, whichever thread: each holds the GIL ~10-30 ms per MiB in C
        return _parse_text(raw)


#: Held while a body over :data:`SMALL_BODY_BYTES` is parsed (:func:`_parse`): the C parts of a parse (decoding, the
#: depth scan, ``json.loads``) keep the GIL for their whole call, so parses side by side on several threads -- the parse
#: pool, session threads -- would leave the event loop waiting behind one after another.
_LARGE_PARSE = threading.Lock()


def _parse_text(raw: bytes | str) -> Any:
    """:func:`_parse` of a non-empty body."""
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as e:
        raise ClientError(f"invalid JSON: {e}", status=422, code="INVALID_JSON") from e
    depth, containers = json_shape(text)
    if depth > MAX_JSON_NESTING:
        raise ClientError(f"invalid JSON: nested {depth} levels deep, over the limit of {MAX_JSON_NESTING} levels",
                          status=422, code="INVALID_JSON")
    if containers > MAX_JSON_CONTAINERS:
        raise ClientError(f"invalid JSON: {containers} arrays and objects, over the limit of {MAX_JSON_CONTAINERS}",
                          status=422, code="INVALID_JSON")
    # Each integer is checked by a Python call only when the text holds a run of digits longer than the limit (in a
    # number or a string): one call per integer cost ~0.4 s for 1 MiB of [0,0,...], the C parser alone ~15 ms.
    hook = _bounded_int if _longest_digit_run(text) > MAX_JSON_INT_DIGITS else None
    try:
        return json.loads(text, parse_int=hook)
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
