"""Issue 49, the load figure: a WebSocket session's keepalive while its env is being built.

uvicorn's WebSocket protocol stops reading a socket once a message waits for the app, and reading is what answers
(and hears answers to) keepalive pings. ``/ws`` builds the session's env when the socket opens -- at 512 sessions opened
at once that queues for tens of seconds -- and a client sends its ``reset`` at once, so the socket went unread for the
whole build: the client's keepalive (websockets: a ping every 20 s, 20 s for the pong) or the server's closed the
connection with 1011 "keepalive ping timeout" although both ends were alive (the benchmark's attempt 4). Now the first
message is read while the env is built. Here: an env whose build takes 3 s, keepalives of 0.3 s ping / 0.5 s timeout
on the client's side, then on the server's: the ``reset`` sent at once is answered, the connection kept.
"""
from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]': openenv-core)")

import gymnasium as gym
from websockets.sync.client import connect as ws_connect

from envs.serve import build_app
from tests.served import ToyChatEnv, serve_app

BUILD_S = 3.0
SLOW_ID = "test/SlowBuildChat-v0"


class SlowBuildChat(ToyChatEnv):
    """:class:`ToyChatEnv` whose construction takes :data:`BUILD_S` seconds (an env loading its data)."""

    def __init__(self, **kwargs):
        time.sleep(BUILD_S)
        super().__init__(**kwargs)


if SLOW_ID not in gym.registry:
    gym.register(id=SLOW_ID, entry_point=SlowBuildChat)


@pytest.mark.parametrize("side", ["client", "server"])
def test_a_reset_sent_while_the_env_is_built_survives_the_keepalive(side):
    app = build_app(SLOW_ID, max_sessions=4)
    server_ping = {"ws_ping_interval": 0.3, "ws_ping_timeout": 0.5} if side == "server" else {}
    client_ping = {"ping_interval": 0.3, "ping_timeout": 0.5} if side == "client" else {"ping_interval": None}
    with serve_app(app, timeout_s=60, **server_ping) as (url, _):
        with ws_connect(url.replace("http", "ws") + "/ws", open_timeout=60, **client_ping) as ws:
            t0 = time.time()
            ws.send(json.dumps({"type": "reset", "data": {}}))
            reply = json.loads(ws.recv(timeout=60))  # a keepalive timeout closes it instead: ConnectionClosedError 1011
            assert reply["type"] == "observation", reply
            assert time.time() - t0 >= BUILD_S * 0.9  # it did wait for the build, past several pings
            ws.send(json.dumps({"type": "step", "data": {"content": "hello"}}))
            assert json.loads(ws.recv(timeout=60))["type"] == "observation"
