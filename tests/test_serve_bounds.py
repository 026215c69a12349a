"""envs.serve's own bounds (issue 34, item 3, server parts; issue 36's missing "listening on" line).

One test per defect, each failing on the code before its fix, against a real server on 127.0.0.1 (in-thread uvicorn,
toy envs: fast):

* a step's *output* was never checked against the session byte cap (only the action was): a 1 MiB action of 7,300
  airline tool calls returned a 23 MB response and grew the conversation to 2.9x the cap. Now the cap holds on every
  append and every reply: an output over it is answered 413 / ``SESSION_BYTES_EXCEEDED`` and the session ends;
* the server's own JSON parsing had no depth or digit limit: a 50,000-deep body -> 500 ``RecursionError``, a
  5,000-digit integer -> 500 ``ValueError`` (over WebSocket: the env's error). Now 422 / ``INVALID_JSON`` naming the
  limit (:data:`envs.serve.MAX_JSON_NESTING`, :data:`envs.serve.MAX_JSON_INT_DIGITS`);
* no write timeout: clients that asked for a big ``state`` and never read held its bytes until they disconnected.
  Now a reply not taken within ``send_timeout_s`` drops the connection, and a session's unsent replies count with its
  conversation against ``max_session_bytes`` (more requests are refused with 429 until they are read);
* ``python -m envs.serve`` printed nothing when it started serving: now one ``listening on http://HOST:PORT`` line.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time

import pytest

pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]': openenv-core)")

import gymnasium as gym
import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from envs import serve
from tests.served import ToyChatEnv, answered, hold_bodies, serve_app, serve_process
from envs.serve import build_app

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT = 256 * 1024


class FloodEnv(ToyChatEnv):
    """Never-ending toy chat whose output size the action picks: ``"flood N"`` answers with N tool messages of ~100
    bytes (a flood of tool calls, as tau2 answers 7,300 calls in one action), ``"big N"`` with one user message of N
    bytes, anything else with an echo."""

    def reply(self, text):
        word, _, n = text.partition(" ")
        if word == "flood":
            return [{"role": "tool", "tool_call_id": f"call_{i}", "content": "Error: unknown tool " + "z" * 60}
                    for i in range(int(n))], False
        if word == "big":
            return [{"role": "user", "content": "b" * int(n)}], False
        return super().reply(text)


class SlowMakeEnv(FloodEnv):
    """FloodEnv that takes 1 s to build (a session is being created meanwhile)."""

    def __init__(self):
        time.sleep(1.0)
        super().__init__()


for _id, _cls in (("ServeBounds/Flood-v0", FloodEnv), ("ServeBounds/SlowMake-v0", SlowMakeEnv)):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_cls, disable_env_checker=True)


def _serve(app, sndbuf: int | None = None, **config):
    """:func:`tests.served.serve_app` of ``app`` with this file's body cap; ``sndbuf`` shrinks the kernel send buffer
    of every accepted connection so that a reply of a few hundred kB stalls on a client that does not read. A context
    manager yielding ``(url, server)``."""
    return serve_app(app, sndbuf=sndbuf, max_body_bytes=LIMIT, **config)


def _app(**kw):
    return build_app("ServeBounds/Flood-v0", **{"max_sessions": 8, "idle_timeout_s": 600, "max_body_bytes": LIMIT, **kw})


def _open(c: httpx.Client) -> str:
    r = c.post("/sessions")
    assert r.status_code == 201, r.text
    return r.json()["session_id"]


def _ask(ws, msg) -> dict:
    ws.send(msg if isinstance(msg, (str, bytes)) else json.dumps(msg))
    return json.loads(ws.recv(timeout=20))


# ---------------------------------------------------------------- 1. the cap on every append and every reply


def test_step_output_over_the_session_cap_is_refused_and_ends_the_session():
    """Defect: the cap was checked on the action only; a flood of tool calls in one small action returned
    ~640 kB (3x this cap) and grew the conversation past the cap."""
    cap = 200_000
    with _serve(_app(max_session_bytes=cap)) as (url, _), httpx.Client(base_url=url, timeout=30) as c:
        sid = _open(c)
        assert c.post(f"/sessions/{sid}/reset", json={}).status_code == 200
        assert c.post(f"/sessions/{sid}/step", json={"action": {"content": "flood 100"}}).status_code == 200  # ~10 kB: fits
        r = c.post(f"/sessions/{sid}/step", json={"action": {"content": "flood 6000"}})
        assert r.status_code == 413, (r.status_code, len(r.content))
        assert len(r.content) < 2000 and "max_session_bytes" in r.json()["detail"] and "session" in r.json()["detail"]
        assert c.get(f"/sessions/{sid}/state").status_code == 404  # the session ended: its env and conversation freed
        assert c.get("/sessions").json()["active"] == 0
        sid = _open(c)  # the client can start again
        assert c.post(f"/sessions/{sid}/reset", json={}).status_code == 200
        with ws_connect(url.replace("http", "ws") + "/ws") as ws:
            assert _ask(ws, {"type": "reset", "data": {}})["type"] == "observation"
            ws.send(json.dumps({"type": "step", "data": {"content": "big 300000"}}))  # one message over the cap
            raw = ws.recv(timeout=20)
            msg = json.loads(raw)
            assert len(raw) < 2000 and msg["type"] == "error" and msg["data"]["code"] == "SESSION_BYTES_EXCEEDED", raw[:300]
            with pytest.raises(ConnectionClosed) as e:  # then the socket (the session) is closed
                ws.recv(timeout=20)
            assert e.value.rcvd is not None and e.value.rcvd.code == 1008
        t0 = time.time()
        while c.get("/sessions").json()["active"] != 1:  # only the HTTP session is left
            assert time.time() - t0 < 10
            time.sleep(0.02)


def test_the_cap_still_lets_an_episode_grow_up_to_it():
    """The output check refuses only what goes over: outputs that keep the conversation under the cap are served."""
    cap = 200_000
    with _serve(_app(max_session_bytes=cap)) as (url, _), httpx.Client(base_url=url, timeout=30) as c:
        sid = _open(c)
        c.post(f"/sessions/{sid}/reset", json={})
        for _ in range(4):
            r = c.post(f"/sessions/{sid}/step", json={"action": {"content": "big 40000"}})
            assert r.status_code == 200, r.text[:200]
        st = c.get(f"/sessions/{sid}/state").json()
        assert st["step_count"] == 4 and len(json.dumps(st["messages"])) <= cap
        r = c.post(f"/sessions/{sid}/step", json={"action": {"content": "big 40000"}})  # 5 x 40 kB > 200 kB - the rest
        assert r.status_code == 413


# ---------------------------------------------------------------- 2. JSON depth and digits


def test_deep_and_long_number_bodies_are_422_naming_the_limit():
    """Defect: a 50,000-deep body -> 500 RecursionError; a 5,000-digit integer -> 500 ValueError."""
    deep = "[" * 50_000 + "]" * 50_000
    big = "9" * 5000
    with _serve(_app()) as (url, _), httpx.Client(base_url=url, timeout=30) as c:
        sid = _open(c)
        cases = [
            (f"/sessions/{sid}/reset", deep, "nest"),
            (f"/sessions/{sid}/reset", '{"seed": ' + big + "}", "digit"),
            (f"/sessions/{sid}/reset", '{"index": -' + big + "}", "digit"),
            (f"/sessions/{sid}/step", '{"action": {"tool_calls": [{"function": {"name": "f", "arguments": ' + deep[:20_000] + "}}]}}",
             "nest"),
            (f"/sessions/{sid}/step", '{"action": {"tool_calls": [{"id": ' + big + "}]}}", "digit"),
        ]
        for path, body, word in cases:
            r = c.post(path, content=body.encode(), headers={"content-type": "application/json"})
            assert r.status_code == 422, (path, body[:40], r.status_code, r.text[:200])
            detail = r.json()["detail"]
            limit = serve.MAX_JSON_NESTING if word == "nest" else serve.MAX_JSON_INT_DIGITS
            assert word in detail and str(limit) in detail, detail
        assert c.post(f"/sessions/{sid}/reset", json={"seed": 10 ** 30}).status_code == 200  # under the limits: served
        nested = {"a": 1}
        for _ in range(serve.MAX_JSON_NESTING - 8):
            nested = {"a": nested}
        r = c.post(f"/sessions/{sid}/step", json={"action": {"tool_calls": [{"function": {"name": "f", "arguments": nested}}]}})
        assert r.status_code == 200, r.text[:300]
        with ws_connect(url.replace("http", "ws") + "/ws", max_size=None) as ws:
            for raw, word in ((deep, "nest"), ('{"type": "reset", "data": {"seed": ' + big + "}}", "digit"),
                              ('{"type": "step", "data": ' + "[" * 5000 + "]" * 5000 + "}", "nest")):
                msg = _ask(ws, raw)
                assert msg["type"] == "error" and msg["data"]["code"] == "INVALID_JSON", msg
                assert word in msg["data"]["message"] and "env raised" not in msg["data"]["message"], msg
            assert _ask(ws, {"type": "reset", "data": {}})["type"] == "observation"  # the socket keeps serving


# ---------------------------------------------------------------- 3. slow readers


def _slow_request(port: int, path: str) -> socket.socket:
    """A client that sends ``GET path`` and then never reads (a 4 kB receive window)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return s


def test_slow_readers_are_counted_against_the_cap_and_dropped_after_the_send_timeout():
    """Defect: 20 clients that requested a 14 MB state and never read held +264 MB until they disconnected."""
    cap = 3_000_000
    with _serve(_app(max_session_bytes=cap), sndbuf=16_384, send_timeout_s=4.0) as (url, _), \
            httpx.Client(base_url=url, timeout=30) as c:
        port = int(url.rsplit(":", 1)[1])
        sid = _open(c)
        c.post(f"/sessions/{sid}/reset", json={})
        for _ in range(4):  # a ~1 MB conversation
            assert c.post(f"/sessions/{sid}/step", json={"action": {"content": "big 250000"}}).status_code == 200
        slow = []
        for _ in range(5):
            slow.append(_slow_request(port, f"/sessions/{sid}/state"))
            time.sleep(0.2)  # each reply is built and stalls before the next request comes
        heads = []
        for s in slow:
            s.settimeout(10)
            heads.append(s.recv(12))  # the status line only: the rest stays unread
        codes = [h.split()[1] for h in heads]
        # conversation ~1 MB + unsent replies of ~1 MB each: the third and later would go over the 3 MB cap
        assert codes.count(b"200") == 2 and codes.count(b"429") == 3, heads
        assert 2_000_000 < c.get("/sessions").json()["unsent_bytes"] <= cap, c.get("/sessions").json()
        assert c.get("/health").status_code == 200  # the server serves on meanwhile
        t0 = time.time()
        while c.get("/sessions").json()["unsent_bytes"]:  # dropped after the send timeout: nothing held for them
            assert time.time() - t0 < 15, c.get("/sessions").json()
            time.sleep(0.1)
        for s, code in zip(slow, codes):
            if code != b"200":
                continue
            got, t0 = 0, time.time()
            with contextlib.suppress(ConnectionResetError):
                while chunk := s.recv(65536):  # what was already on its way, then the reset
                    got += len(chunk)
                    assert time.time() - t0 < 15
            assert got < 1_000_000  # never the whole reply: the connection was cut
        for s in slow:
            s.close()
        r = c.get(f"/sessions/{sid}/state")  # a reader that reads is served the same state
        assert r.status_code == 200 and r.json()["step_count"] == 4


def test_a_slow_websocket_reader_is_dropped_after_the_send_timeout():
    cap = 8_000_000
    with _serve(_app(max_session_bytes=cap), sndbuf=16_384, send_timeout_s=1.0) as (url, _), \
            httpx.Client(base_url=url, timeout=30) as c:
        port = int(url.rsplit(":", 1)[1])
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        s.settimeout(10)
        assert s.recv(12).startswith(b"HTTP/1.1 101")

        def frame(text: str) -> bytes:  # a masked client text frame
            data = text.encode()
            head = bytes([0x81]) + (bytes([0x80 | 126]) + len(data).to_bytes(2, "big") if len(data) >= 126
                                     else bytes([0x80 | len(data)]))
            return head + b"\0\0\0\0" + data  # mask 0: the payload as is

        s.sendall(frame(json.dumps({"type": "reset", "data": {}})))
        for _ in range(3):
            s.sendall(frame(json.dumps({"type": "step", "data": {"content": "big 500000"}})))
        t0 = time.time()
        while c.get("/sessions").json()["active"] != 0:  # dropped: the session (and its env) closed
            assert time.time() - t0 < 15, c.get("/sessions").json()
            time.sleep(0.1)
        s.close()
        assert c.get("/health").status_code == 200


def test_session_counts_while_a_session_is_being_built():
    """Found by the property test: ``GET /sessions`` summed the unsent bytes of every session, and a session being
    built is a ``None`` placeholder in OpenEnv's registry: 500 during any session's construction."""
    app = build_app("ServeBounds/SlowMake-v0", max_sessions=2, idle_timeout_s=600, max_body_bytes=LIMIT)
    with _serve(app) as (url, _), httpx.Client(base_url=url, timeout=30) as c:
        opener = threading.Thread(target=lambda: httpx.post(url + "/sessions", timeout=30))
        opener.start()
        time.sleep(0.3)  # the env is being built
        r = c.get("/sessions")
        opener.join()
        assert r.status_code == 200 and r.json()["unsent_bytes"] == 0, r.text


# ---------------------------------------------------------------- 4. bodies in flight and open connections (issue 42)


def test_bodies_in_flight_are_capped_across_connections():
    """Issue 42: bodies being received were unbounded across connections: 1,500 connections each holding all but one
    byte of a 1 MiB body took the server from 209 MB to 1,686 MB RSS. Now their total is capped
    (``max_inflight_body_bytes``): a body that would go over it is refused at once, 503 naming the cap, before a byte
    of it is read; bodies of at most :data:`envs.serve.SMALL_BODY_BYTES` are not counted (an honest step is never
    refused because of held bodies), and the room comes back when the held bodies go."""
    cap = 4 * LIMIT
    app = _app(max_inflight_body_bytes=cap)
    with _serve(app) as (url, _), httpx.Client(base_url=url, timeout=30) as c:
        port = int(url.rsplit(":", 1)[1])
        held, refused = hold_bodies(port, 7, LIMIT)
        assert len(held) == 4 and len(refused) == 3, (len(held), refused)
        for r in refused:
            assert r.startswith(b"HTTP/1.1 503") and b"max_inflight_body_bytes" in r, r[:400]
        assert answered(held, 0.3) == [None] * 4  # still receiving: nothing answered, nothing refused
        assert c.get("/health").status_code == 200
        sid = _open(c)  # a small body (an honest step) is served beside the held ones
        assert c.post(f"/sessions/{sid}/reset", json={}).status_code == 200
        assert c.post(f"/sessions/{sid}/step", json={"action": {"content": "hi " * 1000}}).status_code == 200
        big = {"action": {"content": "y" * (LIMIT // 2)}}  # a large body while the cap is full: refused
        r = c.post(f"/sessions/{sid}/step", json=big)
        assert r.status_code == 503 and "max_inflight_body_bytes" in r.json()["detail"], r.text[:300]
        chunked = c.post(f"/sessions/{sid}/step", content=iter([json.dumps(big).encode()]),
                         headers={"content-type": "application/json"})  # chunked: counted as it arrives
        assert chunked.status_code == 503, chunked.text[:300]
        for s in held:
            s.close()
        t0 = time.time()
        while (r := c.post(f"/sessions/{sid}/step", json=big)).status_code == 503:  # the room is back
            assert time.time() - t0 < 10, r.text[:300]
            time.sleep(0.1)
        assert r.status_code == 200, r.text[:300]


def test_connections_over_the_cap_are_refused_with_503():
    """Issue 42: the number of open connections was unbounded (each holds buffers, a protocol and a socket). Past
    ``max_connections`` a new connection is answered 503 naming the cap and closed; the room comes back when
    connections close."""
    with _serve(_app(), max_connections=4) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        idle = []
        for _ in range(4):
            s = socket.socket()
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # a head never finished
            idle.append(s)
        time.sleep(0.3)
        with httpx.Client(base_url=url, timeout=30) as c:
            r = c.get("/health")
        assert r.status_code == 503 and "max_connections" in r.json()["detail"], r.text[:300]
        for s in idle:
            s.close()
        t0 = time.time()
        while (r := httpx.get(url + "/health", timeout=30)).status_code == 503:
            assert time.time() - t0 < 10
            time.sleep(0.1)
        assert r.status_code == 200


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) / 1024


@pytest.mark.slow  # a python -m envs.serve subprocess and 300 MB over loopback: 11.7 s at load 8 on 2 cores
def test_held_bodies_leave_the_server_memory_bounded_and_back_near_baseline():
    """Issue 42's measurement, at the defaults, over ``python -m envs.serve``: connections each holding all but one
    byte of a 1 MiB body took the server from 209 MB to 1,686 MB RSS (1,302 MB after they closed; here 300 of them,
    +300 MB before the fix). Now at most ``max_inflight_body_bytes`` (64 MiB) of them are received at once, the rest
    answered 503, and once they leave the server's RSS is back within 40 MB of its baseline."""
    psutil = pytest.importorskip("psutil")
    body = serve.DEFAULT_MAX_BODY_BYTES
    with serve_process("GSM8K-v1", timeout_s=120) as url:
        pid = next(p.pid for p in psutil.Process().children() if "envs.serve" in " ".join(p.cmdline()))
        port = int(url.rsplit(":", 1)[1])
        assert httpx.get(url + "/health", timeout=30).status_code == 200
        base = _rss_mb(pid)
        held, refused = hold_bodies(port, 300, body, "/step")
        time.sleep(0.5)
        during = _rss_mb(pid)
        assert httpx.get(url + "/health", timeout=30).status_code == 200
        for s in held:
            s.close()
        t0 = time.time()
        while (after := _rss_mb(pid)) - base > 40 and time.time() - t0 < 10:
            time.sleep(0.2)
        assert len(held) <= serve.DEFAULT_MAX_INFLIGHT_BODY_BYTES // body, (len(held), len(refused))
        assert refused and all(r.startswith(b"HTTP/1.1 503") for r in refused), refused[:2]
        assert during - base < 2 * serve.DEFAULT_MAX_INFLIGHT_BODY_BYTES / 2**20 + 40, (base, during)
        assert after - base < 40, (base, during, after)


# ---------------------------------------------------------------- 5. the CLI says where it listens


def test_cli_prints_a_listening_line_with_the_bound_port():
    """Issue 36: ``python -m envs.serve`` printed no 'listening on ...' line (and --port 0's port was unknowable)."""
    lines: list[str] = []
    with serve_process("GSM8K-v1", "--max-sessions", "1", timeout_s=60, lines=lines) as url:
        line = next(ln for ln in lines if "listening on" in ln)
        assert url.startswith("http://127.0.0.1:") and int(url.rsplit(":", 1)[1]) > 0, line
        assert "GSM8K-v1" in line
        assert httpx.get(url + "/health", timeout=10).json()["status"] == "healthy"  # serving when it says so
