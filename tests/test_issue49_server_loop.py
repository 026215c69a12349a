"""Issue 49, the load figure: what the server's event loop no longer does per session or per message.

* A session's thread is started off the event loop. OpenEnv's registry made each session a one-thread
  ``ThreadPoolExecutor`` on the loop and its first ``run_in_executor`` started the thread there; ``Thread.start()``
  waits until the new thread has run, so at 512 sessions on 2 busy cores the loop (and ``/health``) stalled in it --
  the most frequent stack of its stalls over 50 ms. Here: every ``Thread.start`` is recorded with the thread that
  called it, sessions are opened over every protocol (``POST /sessions``, ``/ws``, stateless ``/step``, ``POST /mcp``
  ``openenv/session/create``), and the thread each env was built on must have been started by a thread that is not
  the one running the app. Each open session still has a thread of its own, a closed session's thread ends, and
  none is left after the server's shutdown or a failed build.
* WebSocket compression (permessage-deflate, uvicorn's default) is off unless asked for: it compresses every message
  on the loop, for JSON that crosses loopback or a LAN.
"""
from __future__ import annotations

import asyncio
import functools
import json
import threading

import pytest

pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]': openenv-core)")

import gymnasium as gym
import httpx
from websockets.sync.client import connect as ws_connect

from envs import serve
from envs.serve import build_app
from envs.serving.environment import TextAction, TextObservation
from envs.serving.session_threads import SessionThread, SessionThreads
from envs.serving.sessions import _SessionServer
from tests.served import ToyChatEnv, serve_app

ID = "test/ThreadOfBuildChat-v0"


class ThreadOfBuildChat(ToyChatEnv):
    """:class:`ToyChatEnv` that records the thread it was built on (:attr:`built_on`); its build raises while
    :attr:`fail` is set."""

    built_on: list[threading.Thread] = []
    fail = False

    def __init__(self, **kwargs):
        type(self).built_on.append(threading.current_thread())
        if type(self).fail:
            raise RuntimeError("no env today")
        super().__init__(**kwargs)


if ID not in gym.registry:
    gym.register(id=ID, entry_point=ThreadOfBuildChat, disable_env_checker=True)


@pytest.fixture
def starts(monkeypatch):
    """Every ``Thread.start`` in this process from now on: ``{started thread: the thread that called start}``."""
    seen: dict[threading.Thread, threading.Thread] = {}
    real = threading.Thread.start

    def start(self):
        seen[self] = threading.current_thread()
        return real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    ThreadOfBuildChat.built_on, ThreadOfBuildChat.fail = [], False
    yield seen
    ThreadOfBuildChat.fail = False


def _recording_loop(app, loop_threads: set):
    """``app``, noting the thread of every ASGI call (the server's event loop)."""
    async def wrapped(scope, receive, send):
        loop_threads.add(threading.current_thread())
        return await app(scope, receive, send)
    return wrapped


def _rpc(method: str, **params) -> dict:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


def test_sessions_threads_are_started_off_the_event_loop_one_each_and_end_with_their_session(starts):
    app = build_app(ID, max_sessions=8, idle_timeout_s=None)
    server = app.app.state.openenv_server
    loop_threads: set[threading.Thread] = set()
    with serve_app(_recording_loop(app, loop_threads)) as (url, _):
        with httpx.Client(base_url=url, timeout=30) as c:  # one session at a time: built_on[i] is the i-th's
            sids = [c.post("/sessions").json()["session_id"] for _ in range(2)]
            ws = ws_connect(url.replace("http", "ws") + "/ws", open_timeout=30)
            ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(ws.recv(timeout=30))["type"] == "observation"
            r = c.post("/mcp", json=_rpc("openenv/session/create"))
            assert r.status_code == 200 and "result" in r.json(), r.text
            r = c.post("/step", json={"action": {"content": "hi"}, "index": 0})
            assert r.status_code == 200, r.text
            assert len(ThreadOfBuildChat.built_on) == 5 and server.active_sessions == 4
            assert len(set(ThreadOfBuildChat.built_on[:4])) == 4, "two open sessions share a thread"
            on_loop = {t.name: starts[t].name for t in ThreadOfBuildChat.built_on if starts.get(t) in loop_threads}
            assert not on_loop, f"session threads started on the event loop ({loop_threads}): {on_loop}"
            assert c.delete(f"/sessions/{sids[0]}").status_code in (200, 204)
            ThreadOfBuildChat.built_on[0].join(10)
            assert not ThreadOfBuildChat.built_on[0].is_alive(), "a closed session's thread still runs"
            ThreadOfBuildChat.built_on[4].join(10)
            assert not ThreadOfBuildChat.built_on[4].is_alive(), "a stateless request's thread still runs"
            ws.close()
            ThreadOfBuildChat.built_on[2].join(10)
            assert not ThreadOfBuildChat.built_on[2].is_alive(), "a closed socket's session thread still runs"
    for t in ThreadOfBuildChat.built_on:
        t.join(10)
    assert not [t.name for t in ThreadOfBuildChat.built_on if t.is_alive()], "session threads left after shutdown"


def test_a_failed_build_ends_its_thread_and_the_cap_refuses_without_making_one(starts):
    app = build_app(ID, max_sessions=1, idle_timeout_s=None)
    with serve_app(app) as (url, _), httpx.Client(base_url=url, timeout=30) as c:
        ThreadOfBuildChat.fail = True
        r = c.post("/sessions")
        assert r.status_code == 500 and "no env today" in r.text, r.text
        ThreadOfBuildChat.built_on[0].join(10)
        assert not ThreadOfBuildChat.built_on[0].is_alive(), "a failed build's thread still runs"
        ThreadOfBuildChat.fail = False
        assert c.post("/sessions").status_code == 201
        made = len(starts)
        assert c.post("/sessions").status_code == 429
        assert len(starts) == made, "a refused open started a thread"


def test_an_env_asking_for_one_shared_thread_still_gets_it():
    from envs.serving.environment import GymTextEnvironment

    class OneThread(GymTextEnvironment):
        REQUIRES_SINGLE_THREAD_EXECUTOR = True

    server = _SessionServer(functools.partial(OneThread, ID, {}, None), TextAction, TextObservation,
                            max_concurrent_envs=3, threads=SessionThreads())

    async def opens():
        return [await server._create_session() for _ in range(2)]

    ThreadOfBuildChat.built_on = []
    asyncio.run(opens())
    shared = server._shared_session_executor
    assert shared is not None and not isinstance(shared, SessionThread)
    assert all(ex is shared for ex in server._session_executors.values())
    assert ThreadOfBuildChat.built_on[0] is ThreadOfBuildChat.built_on[1]
    shared.shutdown()


def test_session_thread_runs_calls_in_order_and_shutdown_ends_it():
    ex = SessionThread()
    out: list[int] = []
    futures = [ex.submit(out.append, i) for i in range(100)]
    assert [f.result(10) for f in futures] == [None] * 100 and out == list(range(100))
    assert ex.submit(threading.current_thread).result(10) is ex.thread
    assert isinstance(ex.submit(lambda: 1 / 0).exception(10), ZeroDivisionError)
    ex.shutdown(wait=True)
    assert not ex.thread.is_alive()
    with pytest.raises(RuntimeError):
        ex.submit(int)


def test_ws_compression_is_off_by_default_and_the_option_reaches_uvicorn(monkeypatch):
    app = build_app(ID, max_sessions=2, idle_timeout_s=None)
    assert serve.uvicorn_config(app).ws_per_message_deflate is False
    assert serve.uvicorn_config(app, ws_per_message_deflate=True).ws_per_message_deflate is True
    seen = []
    monkeypatch.setattr(serve._Server, "run", lambda self, *a, **k: seen.append(self.config))
    serve.main([ID])
    serve.main([ID, "--ws-compression"])
    assert [c.ws_per_message_deflate for c in seen] == [False, True]
    for on in (False, True):  # the client offers permessage-deflate (websockets' default); the server's answer
        app = build_app(ID, max_sessions=2, idle_timeout_s=None)  # an app is served once (the mcp SDK's manager)
        with serve_app(app, ws_per_message_deflate=on) as (url, _), \
                ws_connect(url.replace("http", "ws") + "/ws", open_timeout=30) as ws:
            ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(ws.recv(timeout=30))["type"] == "observation"
            accepted = ws.response.headers.get("Sec-WebSocket-Extensions") or ""
            assert ("permessage-deflate" in accepted) is on, accepted
