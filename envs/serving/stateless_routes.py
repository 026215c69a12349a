"""OpenEnv's stateless routes of :mod:`envs.serve`: ``POST /reset``, ``POST /step`` (a one-step
episode on a fresh env counted against the session cap), ``GET /state``."""
from __future__ import annotations

import functools


try:  # the optional extra [serve]
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
    from openenv.core.env_server.serialization import serialize_observation
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("envs.serve needs the [serve] extra: pip install -e '.[serve]' (openenv-core)") from e

from envs.serving.environment import (
    ACTION_SHAPE, ClientError, GymTextEnvironment, TextAction, TextState, _RESET_KEYS, _STEP_KEYS, _action,
    _check_step_request, _dumps, _http_reply, _parse, _reset_data,
)
from envs.serving.offload import off_loop
from envs.serving.sessions import _ChunkedReply, _Sessions, _json, _open_failed


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


def _stateless_reply(env: GymTextEnvironment, op: str, reset: dict, action: TextAction | None) -> tuple[int, bytes, bool]:
    """:func:`_stateless_work` answered as an HTTP reply (:func:`_http_reply`), on its env's thread."""
    return _http_reply(env, functools.partial(_stateless_work, env, op, reset, action))


async def _stateless_call(sessions: _Sessions, env_id: str, op: str, raw: bytes) -> Response:
    """OpenEnv's stateless semantics: a fresh env for this request only, counted against the session cap (as a
    session nobody else can name) until its reply has been handed over, then closed. The body is checked
    (:func:`_stateless_request`) before any env is built."""
    try:
        reset, action = await off_loop(_stateless_request, op, raw)  # off the event loop; no env is built for a bad body
    except ClientError as e:
        return _json(e.status, _dumps({"detail": str(e)}))
    try:
        sid, env = await sessions.open()
    except Exception as e:  # noqa: BLE001 - the cap (429) or the env's build (500)
        return _open_failed(env_id, e, " (a stateless request's env takes a session's place until its reply is read)")
    try:
        status, body, _ = await sessions.run(sid, env, _stateless_reply, op, reset, action)
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
