"""envs.serve: registered env ids over OpenEnv, against a real server on loopback (in-thread uvicorn).

Covers reset/step/state through OpenEnv's own WebSocket client and the HTTP session routes, gold replay
reward == in-process reward, session isolation (two clients on the same task), malformed requests
(4xx, server keeps serving), an env exception (500 for that session only), the session cap, the idle
timeout, and the CLI (subprocess, binds 127.0.0.1 by default).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]': openenv-core)")

import gymnasium as gym
import httpx
from openenv.core.generic_client import GenericEnvClient
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

import envs
from envs.serve import build_app
from envs.tau2.oracle import oracle_actions
from tests.served import free_port, serve_app

gym.register_envs(envs)
LIMIT = 64 * 1024
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BoomEnv(gym.Env):
    """One-step toy env whose ``step`` raises on the text ``"boom"`` (an env failure, not a caller bug)."""

    def __init__(self):
        self.observation_space = gym.spaces.Text(100)
        self.action_space = gym.spaces.Text(100)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        m = [{"role": "user", "content": "say something"}]
        return m, {"messages": m, "task_id": "0", "index": 0}

    def step(self, action):
        if action == "boom":
            raise ZeroDivisionError("boom")
        return [], 1.0, True, False, {"messages": [], "task_id": "0", "index": 0}


if "ServeTest/Boom-v0" not in gym.registry:
    gym.register("ServeTest/Boom-v0", entry_point=BoomEnv, disable_env_checker=True)


@contextlib.contextmanager
def _serve(app):
    """:func:`tests.served.serve_app` of ``app`` with this file's body cap, yielding its URL."""
    with serve_app(app, max_body_bytes=LIMIT) as (url, _):
        yield url


@pytest.fixture(scope="module")
def retail():
    with _serve(build_app("tau2/retail-v0", max_sessions=8, idle_timeout_s=120, max_body_bytes=LIMIT)) as url:
        with httpx.Client(base_url=url, timeout=30) as c:
            yield url, c


@pytest.fixture(scope="module")
def gold0():
    """In-process gold replay of retail task index 0: (actions, final reward)."""
    env = gym.make("tau2/retail-v0")
    env.reset(options={"index": 0})
    u = env.unwrapped
    actions = oracle_actions(u.task, u.solo)
    for a in actions:
        _, reward, term, trunc, _ = env.step(a)
        if term or trunc:
            break
    env.close()
    return actions, float(reward)


def _wire(action: dict) -> dict:
    return {"content": action.get("content"), "tool_calls": action.get("tool_calls")}


def _open(c: httpx.Client) -> str:
    r = c.post("/sessions")
    assert r.status_code == 201, r.text
    return r.json()["session_id"]


def test_openenv_client_gold_replay_matches_in_process(retail, gold0):
    url, _ = retail
    actions, reward = gold0
    with GenericEnvClient(base_url=url).sync() as env:
        r = env.reset(index=0)
        assert not r.done and r.observation["messages"][0]["role"] == "system"
        assert env.state()["task_id"] == "0" and env.state()["step_count"] == 0
        for a in actions:
            r = env.step(_wire(a))
            if r.done:
                break
        assert r.done and r.reward == reward == 1.0
        st = env.state()
        assert st["done"] and st["reward"] == reward and st["step_count"] == len(actions)
        assert r.observation["info"]["termination_reason"] and r.observation["info"]["task_id"] == "0"


def test_http_sessions_gold_replay_and_isolation(retail, gold0):
    _, c = retail
    actions, reward = gold0
    a, b = _open(c), _open(c)
    assert a != b
    obs_a = c.post(f"/sessions/{a}/reset", json={"index": 0}).json()
    obs_b = c.post(f"/sessions/{b}/reset", json={"task_id": "0"}).json()
    assert obs_a == obs_b  # same task, same opening
    before = c.get(f"/sessions/{b}/state").json()
    for act in actions:
        r = c.post(f"/sessions/{a}/step", json={"action": _wire(act)})
        assert r.status_code == 200, r.text
        if r.json()["done"]:
            break
    assert r.json()["reward"] == reward
    after_b = c.get(f"/sessions/{b}/state").json()
    state_a = c.get(f"/sessions/{a}/state").json()
    assert after_b == before  # B's conversation, step count and database untouched
    assert state_a["db_hash"] != after_b["db_hash"], "gold actions should have written A's database"
    # B still plays its own episode from the start: the same gold replay scores the same
    for act in actions:
        r = c.post(f"/sessions/{b}/step", json={"action": _wire(act)})
        if r.json()["done"]:
            break
    assert r.json()["reward"] == reward
    assert c.get(f"/sessions/{b}/state").json()["db_hash"] == state_a["db_hash"]
    for s in (a, b):
        assert c.delete(f"/sessions/{s}").status_code == 200
        assert c.get(f"/sessions/{s}/state").status_code == 404


def test_malformed_requests_are_4xx_and_server_keeps_serving(retail):
    url, c = retail
    sid = _open(c)
    cases = {
        "bad json": (c.post(f"/sessions/{sid}/reset", content=b"{not json", headers={"content-type": "application/json"}), 422),
        "unknown session": (c.post("/sessions/nope/reset", json={}), 404),
        "step before reset": (c.post(f"/sessions/{sid}/step", json={"action": {"content": "hi"}}), 409),
        "wrong index type": (c.post(f"/sessions/{sid}/reset", json={"index": "zero"}), 400),
        "unknown reset option": (c.post(f"/sessions/{sid}/reset", json={"bogus": 1}), 400),
        "unknown task": (c.post(f"/sessions/{sid}/reset", json={"task_id": "no-such-task"}), 400),
        "body not an object": (c.post(f"/sessions/{sid}/reset", json=[1, 2]), 422),
        "oversized body": (c.post(f"/sessions/{sid}/reset", json={"x": "a" * (LIMIT + 1)}), 413),
    }
    for name, (r, code) in cases.items():
        assert r.status_code == code, (name, r.status_code, r.text)
        assert isinstance(r.json()["detail"], (str, list)) and r.json()["detail"], name
    assert c.post(f"/sessions/{sid}/reset", json={"index": 1}).status_code == 200
    for body in ({"action": {"content": 123}}, {"action": {"tool_calls": "x"}}, {"action": "hi"}, {"act": {}},
                 {"action": {"content": "hi", "extra": 1}}):
        r = c.post(f"/sessions/{sid}/step", json=body)
        assert r.status_code == 422, (body, r.text)
    st = c.get(f"/sessions/{sid}/state").json()
    assert st["step_count"] == 0  # nothing consumed by the bad requests
    # WebSocket: bad JSON / unknown type / wrong types -> error messages, same socket keeps working
    ws_url = url.replace("http", "ws") + "/ws"
    with ws_connect(ws_url) as ws:
        for raw in ("{oops", json.dumps({"type": "fly"}), json.dumps({"type": "step", "data": {"content": 5}})):
            ws.send(raw)
            msg = json.loads(ws.recv(timeout=10))
            assert msg["type"] == "error" and msg["data"]["message"], raw
        ws.send(json.dumps({"type": "reset", "data": {"index": 2}}))
        assert json.loads(ws.recv(timeout=30))["type"] == "observation"
    # an oversized WebSocket message closes that socket only
    with ws_connect(ws_url, max_size=None) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"x": "a" * (LIMIT + 1)}}))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
    assert c.get("/health").json()["status"] == "healthy"
    r = c.post(f"/sessions/{sid}/step", json={"action": {"content": "Hello"}})
    assert r.status_code == 200, r.text
    c.delete(f"/sessions/{sid}")


def test_env_exception_cap_and_idle_timeout():
    now = [0.0]  # injected clock: the idle timeout fires when the test moves it, never by a race with real time
    app = build_app("ServeTest/Boom-v0", max_sessions=2, idle_timeout_s=60, max_body_bytes=LIMIT, clock=lambda: now[0],
                    reap_interval_s=0.02)
    with _serve(app) as url, httpx.Client(base_url=url, timeout=10) as c:
        a, b = _open(c), _open(c)
        # cap: a third session is refused over HTTP and over WebSocket, the open ones keep working
        r = c.post("/sessions")
        assert r.status_code == 429 and "cap" in r.json()["detail"]
        with ws_connect(url.replace("http", "ws") + "/ws") as ws:
            msg = json.loads(ws.recv(timeout=10))
            assert msg["type"] == "error" and msg["data"]["code"] == "CAPACITY_REACHED"
        for s in (a, b):
            assert c.post(f"/sessions/{s}/reset", json={}).status_code == 200
        # env exception: 500 for that session only
        r = c.post(f"/sessions/{a}/step", json={"action": {"content": "boom"}})
        assert r.status_code == 500 and "ZeroDivisionError" in r.json()["detail"]
        r = c.post(f"/sessions/{b}/step", json={"action": {"content": "fine"}})
        assert r.status_code == 200 and r.json()["reward"] == 1.0 and r.json()["done"]
        assert c.post(f"/sessions/{a}/reset", json={}).status_code == 200  # a stays usable
        # idle timeout: untouched sessions are closed and forgotten, the slots are free again
        now[0] += 61
        t0 = time.time()
        while c.get("/sessions").json()["active"] != 0:
            assert time.time() - t0 < 10, "idle sessions not reaped"
            time.sleep(0.02)
        assert c.post(f"/sessions/{a}/step", json={"action": {"content": "x"}}).status_code == 404
        assert c.post("/sessions").status_code == 201


def test_cli_serves_on_loopback_by_default():
    port = free_port()
    env = dict(os.environ, PYTHONPATH=REPO)
    p = subprocess.Popen([sys.executable, "-m", "envs.serve", "GSM8K-v1", "--port", str(port), "--max-sessions", "2",
                          "--idle-timeout", "30"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        t0, ok = time.time(), False
        while time.time() - t0 < 40 and p.poll() is None:
            try:
                ok = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert ok, p.stdout.read().decode() if p.poll() is not None else "no answer on 127.0.0.1"
        out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], check=False, capture_output=True, text=True).stdout
        if out.strip():  # ss available: the socket is bound to loopback only
            assert [line.split()[3] for line in out.strip().splitlines()] == [f"127.0.0.1:{port}"], out
        with GenericEnvClient(base_url=f"http://127.0.0.1:{port}").sync() as e:
            r = e.reset(index=0)
            r = e.step({"content": "The answer is 0. #### 0"})
            assert r.done and r.reward in (0.0, 1.0) and r.observation["info"]["task_id"] == "0"
    finally:
        p.terminate()
        p.wait(15)
    bad = subprocess.run([sys.executable, "-m", "envs.serve", "No/Such-v0"], check=False, cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "No/Such" in bad.stderr
