"""Issue 49, the server's lower items: one session's ``close`` and its env work are serialised, and a session-less
``POST /mcp`` request's env is counted until its reply has been handed over.

* A step racing a ``DELETE`` or the idle reaper could run while ``close()`` ran on another thread: the server runs a
  session's work on its own thread only while the session is registered -- a request that looked the session up just
  before it was closed runs on OpenEnv's shared pool (``_run_in_session_executor`` falls back to it), beside the close
  on the session's thread -- and ``close`` did not wait for a step in progress (it closed the env under it; only a
  step that *began* after the close found it closed). Now every operation of a session and its close hold the
  session's lock: a close waits for the step in progress, and a later step finds the session closed (404 /
  ``SESSION_ERROR``).
* ``POST /mcp`` without a ``session_id`` closed its env before sending the reply, although its docstring (and the
  stateless routes) say such an env is counted against the cap until its reply is sent: now it is closed after.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]': openenv-core)")

import gymnasium as gym
from envs.serve import build_app
from envs.serving.environment import GymTextEnvironment, SessionClosedError, TextAction
from tests.served import ToyChatEnv


class OverlapEnv(ToyChatEnv):
    """A toy chat that records whether a ``step`` ever ran while ``close`` was running (:attr:`overlaps`): ``reset``
    takes :attr:`reset_s`, ``close`` :attr:`close_s`, a step waits on :attr:`hold` (set by default)."""

    reset_s, close_s = 0.0, 0.0
    hold = threading.Event()
    closing = 0
    overlaps: list[str] = []
    closed: list[float] = []

    def reset(self, *, seed=None, options=None):
        time.sleep(self.reset_s)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if type(self).closing:
            type(self).overlaps.append("step began during close")
        assert type(self).hold.wait(30)
        if type(self).closing:
            type(self).overlaps.append("step ended during close")
        return super().step(action)

    def close(self):
        type(self).closing += 1
        try:
            time.sleep(self.close_s)
        finally:
            type(self).closing -= 1
            type(self).closed.append(time.monotonic())


if "Issue49/Overlap-v0" not in gym.registry:
    gym.register("Issue49/Overlap-v0", entry_point=OverlapEnv, disable_env_checker=True)


@pytest.fixture(autouse=True)
def _fresh():
    OverlapEnv.reset_s, OverlapEnv.close_s, OverlapEnv.closing = 0.0, 0.0, 0
    OverlapEnv.overlaps, OverlapEnv.closed = [], []
    OverlapEnv.hold.set()
    yield
    OverlapEnv.hold.set()


def test_close_waits_for_a_step_in_progress_and_a_later_step_finds_the_session_closed():
    env = GymTextEnvironment("Issue49/Overlap-v0")
    env.reset()
    OverlapEnv.hold.clear()
    stepping = threading.Thread(target=env.step, args=(TextAction(content="hi"),))
    stepping.start()
    time.sleep(0.3)  # the step is inside the env, waiting on hold
    closer = threading.Thread(target=env.close)
    closer.start()
    time.sleep(0.5)
    assert not OverlapEnv.closed, "close ran while the session's step was still running"
    OverlapEnv.hold.set()
    stepping.join(10)
    closer.join(10)
    assert OverlapEnv.closed and not OverlapEnv.overlaps, OverlapEnv.overlaps
    with pytest.raises(SessionClosedError):
        env.step(TextAction(content="again"))


def test_a_sessionless_mcp_request_keeps_its_env_counted_until_the_reply_is_sent():
    app = build_app("Issue49/Overlap-v0", max_sessions=4, idle_timeout_s=None)
    server = app.app.state.openenv_server
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()
    seen = []

    async def call():
        sent = False

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)

        async def send(message):
            if message["type"] == "http.response.body":
                seen.append(("sending", server.active_sessions))

        scope = {"type": "http", "method": "POST", "path": "/mcp", "raw_path": b"/mcp", "query_string": b"",
                 "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())],
                 "http_version": "1.1", "scheme": "http", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
                 "root_path": "", "app": None}
        await app(scope, receive, send)
        seen.append(("after", server.active_sessions))

    asyncio.run(call())
    assert seen == [("sending", 1), ("after", 0)], seen
