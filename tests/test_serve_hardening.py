"""envs.serve under hostile clients (issue 25, section B), against a real server on 127.0.0.1 (in-thread uvicorn).

Each test names the defect it guards: conversation size (only new messages on ``step``, a byte cap per
session), env work off the event loop (a WebSocket ``state`` does not stall ``/health``), cross-origin
requests (Origin / Host checks), status codes and malformed WebSocket frames, header / body read
timeouts, the routes served, a reply that cannot be encoded (lone surrogate), the idle timeout on an
injected clock. Toy envs only (fast): the tau2 path is covered by tests/test_serve.py.
"""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import pytest

pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]': openenv-core)")

import gymnasium as gym
import httpx
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect as ws_connect

from envs import serve
from envs.serve import build_app
from tests.served import ToyChatEnv, serve_app

LIMIT = 64 * 1024
RELEASE = threading.Event()  # the blocking db hash of HashEnv waits on this


class EchoEnv(ToyChatEnv):
    """Never-ending toy chat: each action is answered by a user message echoing it (the conversation grows by 2x the
    action). ``"stop"`` ends the episode. Counts its instances (``made``)."""

    made = 0
    opening = "say something"
    tools = [{"type": "function", "name": "t"}]

    def __init__(self):
        type(self).made += 1
        super().__init__()

    def reply(self, text):
        return super().reply(text)[0], text == "stop"


class _BlockingHash:
    calls = 0

    def get_db_hash(self) -> str:
        type(self).calls += 1
        assert RELEASE.wait(30), "test never released the hash"
        return "h"


class HashEnv(EchoEnv):
    """EchoEnv whose tau2-style ``get_db_hash`` (computed by ``state``) blocks until the test releases it."""

    tau2_environment = _BlockingHash()


for _id, _cls in (("ServeTest/Echo-v0", EchoEnv), ("ServeTest/Hash-v0", HashEnv)):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_cls, disable_env_checker=True)


@contextlib.contextmanager
def _serve(app, **config):
    """:func:`tests.served.serve_app` of ``app`` with this file's body cap, yielding its URL; releases
    :data:`RELEASE` (a blocked ``get_db_hash``) before the server shuts down."""
    with serve_app(app, max_body_bytes=LIMIT, **config) as (url, _):
        try:
            yield url
        finally:
            RELEASE.set()


def _echo_app(**kw):
    kw = {"max_sessions": 4, "idle_timeout_s": 600, "max_body_bytes": LIMIT, **kw}
    return build_app("ServeTest/Echo-v0", **kw)


def _open(c: httpx.Client) -> str:
    r = c.post("/sessions")
    assert r.status_code == 201, r.text
    return r.json()["session_id"]


def _ws(url: str, **kw):
    return ws_connect(url.replace("http", "ws") + "/ws", **kw)


def _ask(ws, msg) -> dict:
    ws.send(msg if isinstance(msg, (str, bytes)) else json.dumps(msg))
    return json.loads(ws.recv(timeout=20))


# ---------------------------------------------------------------- 1. conversation size


def test_step_returns_only_new_messages_and_state_the_whole_conversation():
    """Defect B1: every step answered with the whole conversation (info["messages"]): responses grew with it."""
    with _serve(_echo_app()) as url, httpx.Client(base_url=url, timeout=20) as c:
        sid = _open(c)
        c.post(f"/sessions/{sid}/reset", json={})
        action = "x" * 10_000
        sizes = []
        for _ in range(5):
            r = c.post(f"/sessions/{sid}/step", json={"action": {"content": action}})
            assert r.status_code == 200, r.text
            sizes.append(len(r.content))
            assert "messages" not in r.json()["observation"]["info"]
            assert [m["content"] for m in r.json()["observation"]["messages"]] == ["you said: " + action]
        assert max(sizes) < 2 * len(action) and max(sizes) - min(sizes) < 100, sizes  # constant, not growing
        st = c.get(f"/sessions/{sid}/state").json()
        assert len(st["messages"]) == 11 and st["messages"][-2] == {"role": "assistant", "content": action}
        with _ws(url) as ws:  # same over the WebSocket
            assert _ask(ws, {"type": "reset", "data": {}})["data"]["observation"]["info"]["tools"]  # tools on reset
            for _ in range(3):
                obs = _ask(ws, {"type": "step", "data": {"content": action}})["data"]["observation"]
                assert "messages" not in obs["info"] and "tools" not in obs["info"] and len(obs["messages"]) == 1
            assert len(_ask(ws, {"type": "state"})["data"]["messages"]) == 7


def test_session_byte_cap_413_and_ws_error_without_losing_the_episode():
    """Defect B1: no cap on a session's conversation size (40 x 1 MB steps -> +197 MB RSS for one session)."""
    cap = 100_000
    with _serve(_echo_app(max_session_bytes=cap)) as url, httpx.Client(base_url=url, timeout=20) as c:
        sid = _open(c)
        c.post(f"/sessions/{sid}/reset", json={})
        codes = [c.post(f"/sessions/{sid}/step", json={"action": {"content": "y" * 20_000}}).status_code for _ in range(6)]
        assert codes[:2] == [200, 200] and codes[-1] == 413, codes  # 2 x 20 kB in, 2 x 20 kB echoed: ~80 kB
        r = c.post(f"/sessions/{sid}/step", json={"action": {"content": "y" * 20_000}})
        assert r.status_code == 413 and "max_session_bytes" in r.json()["detail"]
        st = c.get(f"/sessions/{sid}/state").json()
        assert st["step_count"] == codes.count(200) and len(json.dumps(st["messages"])) <= cap  # refused steps not applied
        assert c.post(f"/sessions/{sid}/step", json={"action": {"content": "stop"}}).status_code == 200  # still fits
        assert c.post(f"/sessions/{sid}/reset", json={}).status_code == 200  # a new episode starts from zero
        assert c.post(f"/sessions/{sid}/step", json={"action": {"content": "ok"}}).status_code == 200
        with _ws(url) as ws:
            _ask(ws, {"type": "reset", "data": {}})
            msgs = [_ask(ws, {"type": "step", "data": {"content": "z" * 20_000}}) for _ in range(4)]
            assert msgs[-1]["type"] == "error" and msgs[-1]["data"]["code"] == "SESSION_BYTES_EXCEEDED", msgs[-1]
            assert _ask(ws, {"type": "state"})["type"] == "state"  # the socket keeps serving
            assert _ask(ws, {"type": "reset", "data": {}})["type"] == "observation"


# ---------------------------------------------------------------- 2. event loop


def test_ws_state_db_hash_runs_off_the_event_loop():
    """Defect B2: a WebSocket ``state`` computed the tau2 db hash on the event loop (stalling /health)."""
    RELEASE.clear()
    app = build_app("ServeTest/Hash-v0", max_sessions=2, idle_timeout_s=600, max_body_bytes=LIMIT)
    with _serve(app) as url, httpx.Client(base_url=url, timeout=10) as c, _ws(url) as ws:
        assert _ask(ws, {"type": "reset", "data": {}})["type"] == "observation"
        ws.send(json.dumps({"type": "state"}))  # its hash blocks until RELEASE
        try:
            assert c.get("/health").status_code == 200  # answered while the hash is still blocked
        finally:
            RELEASE.set()
        msg = json.loads(ws.recv(timeout=20))
        assert msg["type"] == "state" and msg["data"]["db_hash"] == "h"


def test_state_loop_hashes_the_database_once_per_step():
    """Load test (B2's state-hash loop): every ``state`` recomputed tau2's database hash (69 ms each), so a client
    looping on ``state`` kept the server's CPU busy; the hash only changes on reset / step."""
    RELEASE.set()
    app = build_app("ServeTest/Hash-v0", max_sessions=2, idle_timeout_s=600, max_body_bytes=LIMIT)
    with _serve(app) as url, _ws(url) as ws:
        _ask(ws, {"type": "reset", "data": {}})
        n0 = _BlockingHash.calls
        assert all(_ask(ws, {"type": "state"})["data"]["db_hash"] == "h" for _ in range(5))
        assert _BlockingHash.calls == n0 + 1
        _ask(ws, {"type": "step", "data": {"content": "a"}})
        _ask(ws, {"type": "state"}), _ask(ws, {"type": "state"})
        assert _BlockingHash.calls == n0 + 2
        _ask(ws, {"type": "reset", "data": {}})
        _ask(ws, {"type": "state"})
        assert _BlockingHash.calls == n0 + 3


# ---------------------------------------------------------------- 3. origin / host


def test_cross_origin_and_foreign_host_rejected_unless_allowed():
    """Defect B3: a page in the user's browser could drive a local server (any Origin accepted)."""
    evil = {"Origin": "http://evil.example"}
    with _serve(_echo_app(allowed_origins=["http://ok.example"])) as url, httpx.Client(base_url=url, timeout=20) as c:
        for r in (c.post("/sessions", headers=evil), c.get("/health", headers=evil),
                  c.post("/sessions", headers={"Host": "evil.example"}),  # DNS rebinding: a foreign name for 127.0.0.1
                  c.post("/sessions", headers={"Origin": "null"})):
            assert r.status_code == 403 and any(w in r.json()["detail"].lower() for w in ("origin", "host")), r.text
        assert c.get("/sessions").json()["active"] == 0  # nothing was created
        with pytest.raises(InvalidStatus) as e, _ws(url, origin="http://evil.example"):
            pass
        assert e.value.response.status_code == 403
        assert c.post("/sessions", headers={"Origin": "http://ok.example"}).status_code == 201  # allow-list
        assert c.post("/sessions").status_code == 201  # no Origin: not a browser
        with _ws(url, origin="http://ok.example") as ws:
            assert _ask(ws, {"type": "reset", "data": {}})["type"] == "observation"
        assert c.get("/health", headers={"Host": f"localhost:{url.rsplit(':', 1)[1]}"}).status_code == 200  # loopback names


def test_host_header_is_parsed_strictly():
    """Issue 42: ``Host: [::1]evil`` passed the Host check (``_host_name`` took whatever stood between the brackets and
    ignored the rest). An IPv6 literal is served only as exactly ``[::1]`` with an optional ``:port``; a name only with
    an optional ``:port`` of ASCII digits."""
    with _serve(_echo_app()) as url, httpx.Client(base_url=url, timeout=20) as c:
        url_port = url.rsplit(":", 1)[1]
        for host in ("[::1]evil", "[::1]evil.example", "[::1]:80evil", "[::1]:", "[::1]]", "[::1", "[::1]:8000:1",
                     "localhost:80:80", "localhost:80x", "localhost:8O", "localhost.evil.example", "127.0.0.1 evil",
                     "[::2]", "[0::1]evil", "::1evil", "localhost:99999999"):
            r = c.get("/health", headers={"Host": host})
            assert r.status_code == 403 and "host" in r.json()["detail"].lower(), (host, r.status_code, r.text[:200])
        for host in ("[::1]", f"[::1]:{url_port}", "[::1]:80", "localhost", f"LOCALHOST:{url_port}", "127.0.0.1",
                     f"127.0.0.1:{url_port}"):
            r = c.get("/health", headers={"Host": host})
            assert r.status_code == 200, (host, r.status_code, r.text[:200])


def test_cli_warns_on_all_interfaces(monkeypatch, capsys):
    """Defect B3: --host 0.0.0.0 served every interface silently."""
    import uvicorn

    seen = {}
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **k: seen.setdefault("config", self.config))
    serve.main(["ServeTest/Echo-v0", "--host", "0.0.0.0", "--allow-host", "myhost.lan"])
    err = capsys.readouterr().err
    assert "0.0.0.0" in err and "WARNING" in err and seen["config"].host == "0.0.0.0"


# ---------------------------------------------------------------- 4. status codes, frames, timeouts, routes


def test_bad_requests_are_4xx_and_the_session_survives():
    """Defect B4: chunked over-limit body -> 400, reset {"self": 1} -> 500, a dict episode_id -> state 500."""
    with _serve(_echo_app()) as url, httpx.Client(base_url=url, timeout=20) as c:
        sid = _open(c)
        chunks = (b'{"x": "' + b"a" * (LIMIT + 10) + b'"}',)
        r = c.post(f"/sessions/{sid}/reset", content=iter(chunks), headers={"content-type": "application/json"})
        assert r.status_code == 413, (r.status_code, r.text)
        assert c.post(f"/sessions/{sid}/reset", json={"self": 1}).status_code == 400
        r = c.post(f"/sessions/{sid}/reset", json={"episode_id": {"x": 1}})
        assert r.status_code == 400, r.text
        assert c.post(f"/sessions/{sid}/reset", json={"episode_id": "e" * 10_000}).status_code == 400
        assert c.post(f"/sessions/{sid}/reset", json={"episode_id": "ep-1"}).status_code == 200
        st = c.get(f"/sessions/{sid}/state")
        assert st.status_code == 200 and st.json()["episode_id"] == "ep-1"
        with _ws(url) as ws:
            assert _ask(ws, {"type": "reset", "data": {"self": 1}})["type"] == "error"
            assert _ask(ws, {"type": "reset", "data": {"episode_id": {"x": 1}}})["type"] == "error"
            assert _ask(ws, {"type": "state"})["type"] == "state"


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_a_client_still_sending_an_over_limit_body_reads_the_413_not_a_reset(chunked):
    """CI failure (fresh clone of 4f9ba18): the 413 for a body over the cap was answered with ``connection: close`` and
    uvicorn closed the socket at once while the client was still sending; the unread bytes made the kernel answer
    with a reset, which can destroy the 413 before the client reads it (``httpx.ReadError: Connection reset by
    peer``). The server must half-close and drain what the client is still sending (a lingering close, bounded in
    time) so that the client reads the 413. A body 64x over the cap makes the race near certain."""
    body = b'{"x": "' + b"a" * (64 * LIMIT) + b'"}'
    with _serve(_echo_app()) as url:
        with httpx.Client(base_url=url, timeout=20) as c:
            sid = _open(c)
        for _ in range(5):
            with httpx.Client(base_url=url, timeout=20) as c:
                content = iter((body[i:i + 8192] for i in range(0, len(body), 8192))) if chunked else body
                r = c.post(f"/sessions/{sid}/reset", content=content, headers={"content-type": "application/json"})
                assert r.status_code == 413 and "over the limit" in r.json()["detail"], (r.status_code, r.text)
            with httpx.Client(base_url=url, timeout=20) as c:  # and the server still serves the session
                assert c.post(f"/sessions/{sid}/reset", json={}).status_code == 200


def test_ws_non_object_json_and_binary_frames_keep_the_episode():
    """Defect B4: JSON arrays / strings / null and binary frames closed the WebSocket (episode lost)."""
    with _serve(_echo_app()) as url, _ws(url) as ws:
        assert _ask(ws, {"type": "reset", "data": {}})["type"] == "observation"
        assert _ask(ws, {"type": "step", "data": {"content": "one"}})["type"] == "observation"
        for raw in ("[1, 2]", '"step"', "null", "3", b"\x00\x01binary", json.dumps({"type": "step", "data": [1]}),
                    json.dumps({"type": ["state"]})):
            msg = _ask(ws, raw)
            assert msg["type"] == "error" and msg["data"]["message"], (raw, msg)
        st = _ask(ws, {"type": "state"})
        assert st["type"] == "state" and st["data"]["step_count"] == 1  # the episode is still there


def test_half_open_connections_and_stalled_bodies_are_dropped():
    """Defect B4: no header / body read timeout (200 half-open connections were held)."""
    with _serve(_echo_app(body_timeout_s=0.5), header_timeout_s=0.5) as url:
        port = int(url.rsplit(":", 1)[1])
        partial_headers = socket.create_connection(("127.0.0.1", port))
        partial_headers.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finishes its headers
        stalled_body = socket.create_connection(("127.0.0.1", port))
        stalled_body.sendall(b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 100\r\n\r\n{\"a\": ")  # 6 of 100 bytes
        for s in (partial_headers, stalled_body):
            s.settimeout(10)  # "does not hang" bound, far above the 0.5 s timeouts
            data = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := s.recv(4096):
                    data += chunk
            s.close()
            assert data == b"" or data.startswith(b"HTTP/1.1 408"), data  # closed (or told 408), not held
        assert httpx.get(url + "/health", timeout=10).status_code == 200


def test_only_documented_routes_and_none_builds_an_env_outside_the_cap():
    """Defect B4: OpenEnv's /mcp (HTTP + WS, session create/close), /docs and a /metadata that builds an env per
    request were served, undocumented and outside the session cap."""
    with _serve(_echo_app(max_sessions=1)) as url, httpx.Client(base_url=url, timeout=20) as c:
        _open(c)
        made = EchoEnv.made
        for path in ("/docs", "/redoc"):
            assert c.get(path).status_code == 404, path
        assert c.get("/openapi.json").status_code == 200  # issue 44: served (what openenv validate reads)
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}
        assert c.post("/mcp", json=rpc).json()["error"]["code"] == -32000  # issue 44: served, inside the session cap
        with pytest.raises(InvalidStatus), ws_connect(url.replace("http", "ws") + "/mcp"):
            pass
        assert c.get("/metadata").json()["name"] == "ServeTest/Echo-v0"
        assert c.get("/schema").status_code == 200 and c.get("/health").status_code == 200
        assert EchoEnv.made == made  # no env built by /metadata, /schema, /health
        assert c.post("/sessions").status_code == 429


def test_lone_surrogate_action_never_breaks_encoding():
    """A lone-surrogate action ("\\ud800") echoed back must not turn the session into 500s (replies are
    encoded with errors replaced)."""
    with _serve(_echo_app()) as url, httpx.Client(base_url=url, timeout=20) as c:
        sid = _open(c)
        c.post(f"/sessions/{sid}/reset", json={})
        r = c.post(f"/sessions/{sid}/step", content=b'{"action": {"content": "a\\ud800b"}}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        assert r.json()["observation"]["messages"][0]["content"] == "you said: a?b"
        assert c.get(f"/sessions/{sid}/state").status_code == 200
        assert c.post(f"/sessions/{sid}/step", json={"action": {"content": "fine"}}).status_code == 200
        with _ws(url) as ws:
            _ask(ws, {"type": "reset", "data": {}})
            msg = _ask(ws, '{"type": "step", "data": {"content": "\\ud800"}}')
            assert msg["type"] == "observation" and msg["data"]["observation"]["messages"][0]["content"] == "you said: ?"
            assert _ask(ws, {"type": "state"})["type"] == "state"


def test_idle_timeout_on_an_injected_clock():
    """The idle timeout, driven by a fake clock (no sleeps racing the reaper)."""
    now = [1000.0]
    app = _echo_app(max_sessions=2, idle_timeout_s=60, clock=lambda: now[0], reap_interval_s=0.02)
    with _serve(app) as url, httpx.Client(base_url=url, timeout=20) as c:
        a = _open(c)
        with _ws(url) as ws:
            _ask(ws, {"type": "reset", "data": {}})
            assert c.post(f"/sessions/{a}/reset", json={}).status_code == 200
            assert c.get("/sessions").json()["active"] == 2
            now[0] += 59  # not yet idle
            assert c.post(f"/sessions/{a}/step", json={"action": {"content": "x"}}).status_code == 200  # touches a
            now[0] += 30  # ws idle for 89 s, a for 30 s
            t0 = time.time()
            while c.get("/sessions").json()["active"] != 1:
                assert time.time() - t0 < 10, "idle WebSocket session not reaped"
                time.sleep(0.02)
            with pytest.raises(ConnectionClosed):  # the reaped socket is closed
                ws.recv(timeout=10)
        assert c.post(f"/sessions/{a}/step", json={"action": {"content": "y"}}).status_code == 200
        now[0] += 61
        t0 = time.time()
        while c.get("/sessions").json()["active"] != 0:
            assert time.time() - t0 < 10, "idle HTTP session not reaped"
            time.sleep(0.02)
        assert c.post(f"/sessions/{a}/step", json={"action": {"content": "z"}}).status_code == 404


def _get_health(s: socket.socket) -> bytes:
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return data


def test_an_idle_keep_alive_connection_outlives_a_clients_5_s_pool_expiry():
    """The 512-session benchmark lost an honest request (``httpx.RemoteProtocolError: Server disconnected without
    sending a response`` on an MCP session's ``GET /state`` after its episode): uvicorn closes an idle keep-alive
    connection after 5 s, exactly httpx's pool expiry, so a client whose loop read the last reply late reused a
    connection the server was closing. Idle keep-alive connections now live ``header_timeout_s`` after their last
    response (the head deadline, default 10 s), then close."""
    with _serve(_echo_app(), header_timeout_s=7.0) as url:
        s = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        s.settimeout(10)
        assert _get_health(s).startswith(b"HTTP/1.1 200")
        time.sleep(5.6)  # past uvicorn's default 5 s keep-alive, inside header_timeout_s
        assert _get_health(s).startswith(b"HTTP/1.1 200")  # the same connection answers
        time.sleep(7.6)  # past header_timeout_s after the last response: the idle connection is closed
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            assert _get_health(s) == b""
        s.close()
