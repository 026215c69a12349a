"""Issue 49, the load target: ``build_app(..., workers=N)`` / ``python -m envs.serve --workers N`` keeps every
session's env in one of N worker processes (:mod:`envs.serving.workers`) while the server process keeps the sockets,
the routes and ``/health``. A session is placed once, on the emptiest worker, and every later request of it -- over
HTTP sessions, the WebSocket, ``/sessions/{id}/mcp``, any connection -- reaches that worker (what uvicorn's own
``--workers`` cannot do: the kernel hands each connection to any worker). Checked here: sessions spread over two
worker processes (not the server's), each protocol plays an episode whose reward equals ``gym.make``'s, a session's
requests on fresh connections reach its env, the unsent-bytes accounting comes back to zero, a DELETE frees its
worker's place, a bad env build is a 500 naming the error, and the workers stop with the server.
"""
from __future__ import annotations

import json
import os
import re
import time

import pytest

pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]': openenv-core)")

import gymnasium as gym
import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from envs.grader_process import process_alive
from envs.serve import build_app
from tests.served import serve_app

ENV_ID = "DigitSum-v0"  # registered by ``import envs``: what a spawned worker knows


def _answer(prompt: str, right: bool) -> str:
    digits = sum(int(c) for c in re.findall(r"\d+", prompt)[-1])
    return f"<answer>{digits if right else digits + 1}</answer>"


def _in_process_reward(index: int, action: str) -> float:
    env = gym.make(ENV_ID)
    env.reset(options={"index": index})
    return float(env.step(action)[1])


@pytest.fixture(scope="module")
def served():
    """A server with two workers; once it has shut down, its worker processes are gone."""
    app = build_app(ENV_ID, max_sessions=8, idle_timeout_s=600, workers=2)
    with serve_app(app, timeout_s=900) as (url, _):
        pids = [int(k) for k in httpx.get(url + "/sessions", timeout=60).json()["workers"]]
        yield url, app
    t0 = time.time()
    while [p for p in pids if process_alive(p)] and time.time() - t0 < 30:
        time.sleep(0.2)
    assert not [p for p in pids if process_alive(p)], f"worker processes {pids} outlived the server"


def _kill_and_wait(pid: int) -> None:
    """SIGKILL ``pid`` and wait (up to 30 s) until it is gone."""
    import signal

    os.kill(pid, signal.SIGKILL)
    t0 = time.time()
    while process_alive(pid) and time.time() - t0 < 30:
        time.sleep(0.1)


def test_sessions_spread_over_worker_processes_and_keep_their_env(served):
    url, _ = served
    sids = []
    for _ in range(4):
        with httpx.Client(base_url=url, timeout=120) as c:  # a fresh connection per request: no stickiness by connection
            sid = c.post("/sessions").json()["session_id"]
            sids.append(sid)
    listing = httpx.get(url + "/sessions", timeout=60).json()
    workers = {int(k): v for k, v in listing["workers"].items()}
    assert len(workers) == 2 and os.getpid() not in workers and sorted(workers.values()) == [2, 2], listing
    for i, sid in enumerate(sids):
        with httpx.Client(base_url=url, timeout=120) as c:
            r = c.post(f"/sessions/{sid}/reset", json={"index": i})
            assert r.status_code == 200, r.text
            prompt = r.json()["observation"]["messages"][-1]["content"]
        action = _answer(prompt, right=i % 2 == 0)
        with httpx.Client(base_url=url, timeout=120) as c:
            r = c.post(f"/sessions/{sid}/step", json={"action": {"content": action}})
            assert r.status_code == 200, r.text
            assert r.json()["reward"] == _in_process_reward(i, action) == (1.0 if i % 2 == 0 else 0.0)
            state = c.get(f"/sessions/{sid}/state").json()
            assert state["index"] == i and state["done"] and state["step_count"] == 1, state
    for sid in sids:
        assert httpx.delete(f"{url}/sessions/{sid}", timeout=60).status_code == 200
    listing = httpx.get(url + "/sessions", timeout=60).json()
    assert listing["active"] == 0 and listing["unsent_bytes"] == 0 and set(listing["workers"].values()) == {0}, listing


def test_websocket_mcp_and_stateless_routes_play_on_workers(served):
    url, _ = served
    with ws_connect(url.replace("http", "ws") + "/ws", open_timeout=120) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"index": 5}}))
        obs = json.loads(ws.recv(timeout=120))["data"]["observation"]
        action = _answer(obs["messages"][-1]["content"], right=True)
        ws.send(json.dumps({"type": "step", "data": {"content": action}}))
        reply = json.loads(ws.recv(timeout=120))["data"]
        assert reply["reward"] == _in_process_reward(5, action) == 1.0 and reply["done"], reply
    r = httpx.post(url + "/step", json={"action": {"content": "<answer>0</answer>"}, "index": 2}, timeout=120)
    assert r.status_code == 200 and r.json()["reward"] == _in_process_reward(2, "<answer>0</answer>"), r.text
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "respond", "arguments": {
        "content": "<answer>0</answer>"}}}
    r = httpx.post(url + "/mcp", json=body, timeout=120)
    assert r.status_code == 200 and "result" in r.json(), r.text
    with httpx.Client(base_url=url, timeout=120) as c:
        sid = c.post("/sessions").json()["session_id"]
        c.post(f"/sessions/{sid}/reset", json={"index": 1}).raise_for_status()
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "respond", "arguments": {
            "content": "<answer>0</answer>"}}}
        r = c.post(f"/sessions/{sid}/mcp", json=rpc, headers={"accept": "application/json, text/event-stream",
                                                              "mcp-protocol-version": "2025-06-18"})
        assert r.status_code == 200, r.text
        assert c.get(f"/sessions/{sid}/state").json()["step_count"] == 1
        c.delete(f"/sessions/{sid}")
    listing = httpx.get(url + "/sessions", timeout=60).json()
    assert listing["active"] == 0 and listing["unsent_bytes"] == 0, listing


def test_a_bad_env_build_in_a_worker_is_a_500_naming_it():
    app = build_app(ENV_ID, {"no_such_kwarg": 1}, max_sessions=2, idle_timeout_s=600, workers=1)
    with serve_app(app, timeout_s=900) as (url, _):
        r = httpx.post(url + "/sessions", timeout=120)
        assert r.status_code == 500 and "no_such_kwarg" in r.json()["detail"], r.text
        assert httpx.get(url + "/sessions", timeout=60).json()["active"] == 0


def test_a_dead_worker_is_replaced_when_the_next_session_is_placed():
    """A worker killed under its sessions: a request of theirs answers 503 naming it (the connection kept) and closes the session, the next session opened starts a fresh worker
    in its place and plays there, and the dead worker's sessions do not count against the new one."""
    app = build_app(ENV_ID, max_sessions=4, idle_timeout_s=600, workers=1)
    with serve_app(app, timeout_s=900) as (url, _):
        with httpx.Client(base_url=url, timeout=120) as c:
            old = c.post("/sessions").json()["session_id"]
            c.post(f"/sessions/{old}/reset", json={"index": 0}).raise_for_status()
            (dead,) = [int(k) for k in c.get("/sessions").json()["workers"]]
            _kill_and_wait(dead)
            r = c.post(f"/sessions/{old}/step", json={"action": {"content": "<answer>0</answer>"}})
            assert r.status_code == 503 and "worker process" in r.json()["detail"], r.text
            new = c.post("/sessions").json()["session_id"]
            workers = {int(k): v for k, v in c.get("/sessions").json()["workers"].items()}
            assert dead not in workers and workers == {next(iter(workers)): 1}, workers
            r = c.post(f"/sessions/{new}/reset", json={"index": 3})
            assert r.status_code == 200, r.text
            action = _answer(r.json()["observation"]["messages"][-1]["content"], right=True)
            r = c.post(f"/sessions/{new}/step", json={"action": {"content": action}})
            assert r.status_code == 200 and r.json()["reward"] == _in_process_reward(3, action) == 1.0, r.text
            assert c.delete(f"/sessions/{old}").status_code == 404  # closed when its worker was found gone
            assert set(c.get("/sessions").json()["workers"].values()) == {1}
            c.delete(f"/sessions/{new}")
            listing = c.get("/sessions").json()
            assert listing["active"] == 0 and set(listing["workers"].values()) == {0}, listing


def test_a_dead_worker_over_the_websocket_and_mcp_is_an_error_naming_it_and_the_session_closes():
    """The same dead worker over the other protocols: a WebSocket step answers an error message with code
    ``WORKER_ERROR`` naming the worker process, then the socket closes with 1011 (it closed with 1000, a normal close,
    and no message before), a ``/sessions/{id}/mcp`` tool call
    answers an error result naming it, and both sessions are closed (their ids are gone, the server keeps serving)."""
    app = build_app(ENV_ID, max_sessions=4, idle_timeout_s=600, workers=1)
    with serve_app(app, timeout_s=900) as (url, _):
        with httpx.Client(base_url=url, timeout=120) as c, \
                ws_connect(url.replace("http", "ws") + "/ws", open_timeout=120) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"index": 0}}))
            assert json.loads(ws.recv(timeout=120))["type"] == "observation"
            sid = c.post("/sessions").json()["session_id"]
            c.post(f"/sessions/{sid}/reset", json={"index": 1}).raise_for_status()
            (dead,) = [int(k) for k in c.get("/sessions").json()["workers"]]
            assert c.get("/sessions").json()["active"] == 2
            _kill_and_wait(dead)
            ws.send(json.dumps({"type": "step", "data": {"content": "<answer>0</answer>"}}))
            reply = json.loads(ws.recv(timeout=120))
            assert reply["type"] == "error" and reply["data"]["code"] == "WORKER_ERROR", reply
            assert "worker process" in reply["data"]["message"], reply
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=60)
            assert closed.value.rcvd.code == 1011, closed.value  # an error close, not 1000 (normal)
            rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "respond", "arguments": {
                "content": "<answer>0</answer>"}}}
            r = c.post(f"/sessions/{sid}/mcp", json=rpc, headers={"accept": "application/json, text/event-stream",
                                                                  "mcp-protocol-version": "2025-06-18"})
            assert r.status_code == 200 and "worker process" in r.text, r.text  # an error result the agent reads
            assert c.get(f"/sessions/{sid}/state").status_code == 404  # closed when its worker was found gone
            assert c.get("/sessions").json()["active"] == 0
            assert c.get("/health").status_code == 200
