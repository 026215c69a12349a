"""A session's tools over standard MCP (``/sessions/{id}/mcp``, :mod:`envs.serving.mcp_routes`), through the ``mcp``
SDK's own client: tau2's gold actions played over MCP on every domain score ``gym.make``'s reward (read from
``GET /sessions/{id}/state``; it never appears in what the agent sees), with both protocol eras the SDK speaks (the
2025 initialize handshake: ``streamable_http_client`` + ``ClientSession``; 2026-07-28: ``mcp.Client(mode=...)``).

Hostile and negative cases of the MCP route live here (tests/test_hostile_property.py is the hardening suite's):
unknown session (404 saying ``POST /sessions``), body over the cap (413), a foreign ``Origin`` / ``Host`` (403),
JSON over the nesting / integer-digit limits (422), calls before reset / after the end / over the session's byte cap
(error results), the session cap and the idle timeout applying to sessions driven only over MCP.

The unit stage plays one or a few tasks per domain; every task of every domain is ``@pytest.mark.slow``.
"""
from __future__ import annotations

import asyncio
import json
import time

import gymnasium as gym
import httpx
import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client

import envs
from envs import serve
from envs.serving.agent_tools import as_tool_call
from tests.served import serve_app

gym.register_envs(envs)

#: (env id, gym.make kwargs, task indices in the unit stage): every domain, each in the user mode tau2 gives it.
DOMAINS = [("tau2/mock-v0", {}, [0, 7]), ("tau2/airline-v0", {"user": "scripted"}, [0]),
           ("tau2/retail-v0", {"user": "scripted"}, [1]), ("tau2/telecom-v0", {}, [0])]
MODERN = "2026-07-28"


def _gold_reward(env, index: int) -> tuple[list[dict], float]:
    """The task's gold messages and the reward ``gym.make``'s env gives them."""
    golds = env.unwrapped.demonstration({"index": index})
    env.reset(options={"index": index})
    reward = 0.0
    for g in golds:
        _, reward, term, trunc, _ = env.step(g)
        if term or trunc:
            break
    return golds, float(reward)


async def _play(call, golds: list[dict]) -> list:
    """Each gold message as one MCP tool call (``respond`` for a message to the customer); the results."""
    return [await call(*as_tool_call(g)) for g in golds]


async def _episode(url: str, golds: list[dict], mode: str) -> tuple[list, list]:
    """Play ``golds`` over MCP at ``url``: ``(tools, results)``; ``mode`` ``"legacy"`` (ClientSession over
    streamable_http_client, initialize handshake) or a modern protocol version (``mcp.Client``)."""
    if mode == "legacy":
        async with streamable_http_client(url) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            tools = (await s.list_tools()).tools
            return tools, await _play(s.call_tool, golds)
    async with Client(url, mode=mode) as c:
        tools = (await c.list_tools()).tools
        return tools, await _play(c.call_tool, golds)


def _open(http: httpx.Client, index: int | None = None) -> str:
    sid = http.post("/sessions").json()["session_id"]
    if index is not None:
        assert http.post(f"/sessions/{sid}/reset", json={"index": index}).status_code == 200
    return sid


def _check_domain(env_id: str, kwargs: dict, indices, modes=("legacy", MODERN)) -> None:
    """Play the gold of each task of ``indices`` over MCP (alternating ``modes``) and check the reward, the tool list
    and that no result shows a reward."""
    env = gym.make(env_id, **kwargs)
    with serve_app(serve.build_app(env_id, kwargs)) as (url, _), httpx.Client(base_url=url, timeout=120) as http:
        for n, index in enumerate(indices):
            golds, want = _gold_reward(env, index)
            sid = _open(http, index)
            tools, results = asyncio.run(_episode(f"{url}/sessions/{sid}/mcp", golds, modes[n % len(modes)]))
            state = http.get(f"/sessions/{sid}/state").json()
            assert state["done"] and state["reward"] == want, (env_id, index, state["reward"], want)
            info_tools = env.unwrapped.tools
            assert [t.name for t in tools] == [t["function"]["name"] for t in info_tools] + ["respond"]
            assert [t.input_schema for t in tools[:-1]] == [t["function"]["parameters"] for t in info_tools]
            for r in results:  # the agent never sees a reward
                seen = json.dumps([c.model_dump() for c in r.content]) + json.dumps(r.structured_content)
                assert "reward" not in seen, seen[:300]
            assert results[-1].structured_content["done"] is True
            http.delete(f"/sessions/{sid}")


@pytest.mark.parametrize("env_id,kwargs,indices", DOMAINS, ids=[d[0] for d in DOMAINS])
def test_gold_over_mcp_scores_gym_make_reward(env_id, kwargs, indices):
    modes = ("legacy", MODERN) if DOMAINS.index((env_id, kwargs, indices)) % 2 == 0 else (MODERN, "legacy")
    _check_domain(env_id, kwargs, indices, modes)  # both eras on mock; airline and telecom 2026-07-28, retail 2025


@pytest.mark.slow
@pytest.mark.parametrize("env_id,kwargs,indices", DOMAINS, ids=[d[0] for d in DOMAINS])
def test_gold_over_mcp_every_task(env_id, kwargs, indices):
    env = gym.make(env_id, **kwargs)
    _check_domain(env_id, kwargs, env.unwrapped.usable_task_indices())


# ------------------------------------------------------------------ negative and hostile cases


@pytest.fixture(scope="module")
def mock_server():
    app = serve.build_app("tau2/mock-v0", max_body_bytes=64 * 1024, max_session_bytes=64 * 1024)
    with serve_app(app) as (url, _), httpx.Client(base_url=url, timeout=60) as http:
        yield url, http


def _rpc(method: str, params: dict | None = None, id_: int = 1) -> dict:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params or {}}


_HEADERS = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-06-18"}


def test_unknown_session_is_404_saying_how_to_get_one(mock_server):
    url, http = mock_server
    r = http.post("/sessions/nope/mcp", json=_rpc("tools/list"), headers=_HEADERS)
    assert r.status_code == 404 and "POST /sessions" in r.json()["detail"]
    assert r.json()["jsonrpc"] == "2.0" and "POST /sessions" in r.json()["error"]["message"]
    raised = ""
    try:  # the SDK's own client fails on it (an exception group holding its MCPError), with that message
        asyncio.run(_episode(f"{url}/sessions/nope/mcp", [], "legacy"))
    except BaseException as e:  # noqa: BLE001
        raised = repr(e)
    assert "MCPError" in raised and "POST /sessions" in raised


def test_oversized_body_bad_origin_bad_host_and_json_limits_are_refused(mock_server):
    _, http = mock_server
    sid = _open(http, 0)
    path = f"/sessions/{sid}/mcp"
    big = _rpc("tools/call", {"name": "respond", "arguments": {"content": "x" * 70_000}})
    assert http.post(path, json=big, headers=_HEADERS).status_code == 413
    r = http.post(path, json=_rpc("tools/list"), headers={**_HEADERS, "origin": "http://evil.example"})
    assert r.status_code == 403 and "Origin" in r.json()["detail"]
    assert http.post(path, json=_rpc("tools/list"), headers={**_HEADERS, "host": "evil.example"}).status_code == 403
    deep = '{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": ' + "[" * 200 + "]" * 200 + "}"
    r = http.post(path, content=deep, headers={**_HEADERS, "content-type": "application/json"})
    assert r.status_code == 422 and "nested" in r.json()["detail"]
    huge_int = '{"jsonrpc": "2.0", "id": ' + "9" * 5000 + ', "method": "tools/list"}'
    r = http.post(path, content=huge_int, headers={**_HEADERS, "content-type": "application/json"})
    assert r.status_code == 422 and "digits" in r.json()["detail"]
    for method in ("GET", "DELETE"):  # stateless JSON: no SSE stream held open, no MCP session to delete
        r = http.request(method, path, headers=_HEADERS)
        assert r.status_code == 405 and "POST" in r.json()["detail"]
    r = http.post(path, json=_rpc("tools/list"), headers=_HEADERS)  # the session still serves
    assert r.status_code == 200 and "respond" in r.text


async def _calls(url: str, calls: list[tuple[str, dict]]) -> list:
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as s:
        await s.initialize()
        return [await s.call_tool(name, args) for name, args in calls]


def test_errors_are_results_the_agent_reads(mock_server):
    url, http = mock_server
    sid = _open(http)  # no reset yet
    r = http.post(f"/sessions/{sid}/mcp", json=_rpc("tools/list"), headers=_HEADERS)
    assert "reset" in r.json()["error"]["message"]
    (before,) = asyncio.run(_calls(f"{url}/sessions/{sid}/mcp", [("respond", {"content": "hi"})]))
    assert before.is_error and "409" in before.content[0].text
    http.post(f"/sessions/{sid}/reset", json={"index": 0})
    res = asyncio.run(_calls(f"{url}/sessions/{sid}/mcp", [
        ("respond", {"text": "wrong key"}), ("no_such_tool", {}), ("respond", {"content": "bye ###STOP###"}),
        ("respond", {"content": "again"})]))
    assert res[0].is_error and "content" in res[0].content[0].text  # refused before any step
    assert res[1].is_error and "no_such_tool" in res[1].content[0].text  # the env's own tool error
    assert res[2].structured_content["done"] is True and not res[2].is_error
    assert res[3].is_error and "ended" in res[3].content[0].text
    assert http.get(f"/sessions/{sid}/state").json()["step_count"] == 2


def test_session_byte_cap_applies_over_mcp(mock_server):
    url, http = mock_server
    sid = _open(http, 0)
    (r,) = asyncio.run(_calls(f"{url}/sessions/{sid}/mcp", [("respond", {"content": "y" * 65_200})]))
    assert r.is_error and "413" in r.content[0].text and "max_session_bytes" in r.content[0].text
    assert http.get(f"/sessions/{sid}/state").json()["step_count"] == 0  # refused before the step, episode kept


def test_session_cap_and_idle_timeout_hold_for_mcp_sessions():
    now = [0.0]
    app = serve.build_app("tau2/mock-v0", max_sessions=1, idle_timeout_s=10.0, clock=lambda: now[0],
                          reap_interval_s=0.05)
    with serve_app(app) as (url, _), httpx.Client(base_url=url, timeout=60) as http:
        sid = _open(http, 0)
        assert http.post("/sessions").status_code == 429  # MCP opens no session of its own beside the cap
        asyncio.run(_calls(f"{url}/sessions/{sid}/mcp", [("get_users", {})]))
        now[0] = 100.0
        for _ in range(100):
            if http.get("/sessions").json()["active"] == 0:  # (a request on the session would mark it used)
                break
            time.sleep(0.05)
        r = http.post(f"/sessions/{sid}/mcp", json=_rpc("tools/list"), headers=_HEADERS)
        assert r.status_code == 404 and "POST /sessions" in r.json()["detail"]


# ------------------------------------------------------------------ OpenEnv's /mcp dialect and /openapi.json


def _post_rpc(http: httpx.Client, method: str, params: dict | None = None) -> dict:
    r = http.post("/mcp", json=_rpc(method, params))
    assert r.status_code == 200 and r.json()["jsonrpc"] == "2.0", r.text[:300]
    return r.json()


def test_openenv_mcp_dialect_plays_gold_to_gym_make_reward(mock_server):
    _, http = mock_server
    assert http.post("/mcp", json={}).json()["error"]["code"] == -32600  # what openenv validate posts: a JSON-RPC reply
    sid = _post_rpc(http, "openenv/session/create")["result"]["session_id"]
    assert "reset it first" in _post_rpc(http, "tools/list", {"session_id": sid})["error"]["message"]
    http.post(f"/sessions/{sid}/reset", json={"index": 0})  # (MCPToolClient resets over /ws?session_id=ID)
    tools = _post_rpc(http, "tools/list", {"session_id": sid})["result"]["tools"]
    env = gym.make("tau2/mock-v0")
    golds, want = _gold_reward(env, 0)
    assert [t["name"] for t in tools] == [t["function"]["name"] for t in env.unwrapped.tools] + ["respond"]
    results = []
    for g in golds:
        name, arguments = as_tool_call(g)
        params = {"name": name, "arguments": arguments, "session_id": sid}
        results.append(_post_rpc(http, "tools/call", params)["result"])
    assert results[-1]["data"]["done"] is True and all("reward" not in json.dumps(r) for r in results)
    assert http.get(f"/sessions/{sid}/state").json()["reward"] == want == 1.0
    assert _post_rpc(http, "openenv/session/close", {"session_id": sid})["result"]["closed"] is True
    assert _post_rpc(http, "tools/list", {"session_id": sid})["error"]["code"] == -32602  # gone


def test_openenv_mcp_without_session_uses_a_fresh_env_per_call(mock_server):
    _, http = mock_server
    before = http.get("/sessions").json()["active"]
    tools = _post_rpc(http, "tools/list")["result"]["tools"]
    assert "respond" in [t["name"] for t in tools]
    r = _post_rpc(http, "tools/call", {"name": "get_users", "arguments": {}})["result"]
    assert r["isError"] is False and r["data"]["done"] is False
    assert http.get("/sessions").json()["active"] == before  # each request's env closed after its reply
    assert _post_rpc(http, "no/such")["error"]["code"] == -32601
    assert _post_rpc(http, "tools/call", {"arguments": {}})["error"]["code"] == -32602


def test_openenv_mcp_refusals_keep_the_server_bounds(mock_server):
    url, http = mock_server
    r = http.post("/mcp", content="[" * 200 + "]" * 200, headers={"content-type": "application/json"})
    assert r.json()["error"]["code"] == -32700 and "nested" in r.json()["error"]["message"]
    assert http.post("/mcp", json=_rpc("tools/list"), headers={"origin": "http://evil.example"}).status_code == 403
    assert http.post("/mcp", content=b"x" * 70_000).status_code == 413
    app = serve.build_app("tau2/mock-v0", max_sessions=1)
    with serve_app(app) as (url1, _), httpx.Client(base_url=url1, timeout=60) as one:
        assert "session_id" in _post_rpc(one, "openenv/session/create")["result"]
        err = _post_rpc(one, "openenv/session/create")["error"]
        assert err["code"] == -32000 and err["data"] == {"active_sessions": 1, "max_sessions": 1}
        assert _post_rpc(one, "tools/list")["error"]["code"] == -32000  # a fresh env needs a place under the cap too


def test_openapi_json_lists_the_routes_openenv_validate_reads(mock_server):
    _, http = mock_server
    doc = http.get("/openapi.json").json()
    assert isinstance(doc["info"]["version"], str)
    assert {"/reset", "/step", "/state", "/health", "/schema", "/metadata", "/sessions"} <= set(doc["paths"])


def test_docs_snippet_runs(mock_server, capsys):
    """docs/mcp.md's evaluation snippet, as written, against the mock server (its URL put in)."""
    import re
    from pathlib import Path

    url, _ = mock_server
    doc = (Path(__file__).resolve().parent.parent / "docs" / "mcp.md").read_text(encoding="utf-8")
    code = next(b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "async def evaluate" in b)
    code = code.replace('URL = "http://127.0.0.1:8000"', f"URL = {url!r}")
    exec(compile(code, "docs/mcp.md", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.startswith("mean reward: ")


def test_websocket_attaches_to_an_open_session_and_leaves_it_open(mock_server):
    """``/ws?session_id=ID`` (OpenEnv 0.10's MCPToolClient: session from ``openenv/session/create``, reset over the
    socket, tools over ``/mcp``): one episode for both; the session outlives the socket; unknown or already attached
    ids are refused with ``SESSION_ERROR``."""
    from websockets.sync.client import connect as ws_connect

    url, http = mock_server
    ws_url = url.replace("http", "ws") + "/ws"
    sid = _post_rpc(http, "openenv/session/create")["result"]["session_id"]
    active = http.get("/sessions").json()["active"]
    with ws_connect(f"{ws_url}?session_id={sid}") as ws:
        ws.send(json.dumps({"type": "reset", "data": {"index": 0}}))
        assert json.loads(ws.recv())["type"] == "observation"
        with ws_connect(f"{ws_url}?session_id={sid}") as second:
            assert "already" in json.loads(second.recv())["data"]["message"]
        tools = _post_rpc(http, "tools/list", {"session_id": sid})["result"]["tools"]  # the socket's episode
        assert "respond" in [t["name"] for t in tools]
        assert http.get("/sessions").json()["active"] == active  # attached: no session of its own
    assert http.get(f"/sessions/{sid}/state").json()["task_id"] is not None  # still open after the socket closed
    assert _post_rpc(http, "openenv/session/close", {"session_id": sid})["result"]["closed"] is True
    with ws_connect(f"{ws_url}?session_id={sid}") as gone:
        err = json.loads(gone.recv())["data"]
        assert err["code"] == "SESSION_ERROR" and "POST /sessions" in err["message"]


#: Hostile JSON-RPC bodies for both MCP routes: wrong shapes and types, batches, notifications, odd ids, surrogates,
#: tool names and arguments of every wrong kind.
_HOSTILE = [b"", b"null", b"[]", b"[{}]", b'"x"', b"1e999", b"{", b'{"jsonrpc": "2.0"}', b'{"jsonrpc": "1.0", "method": 1}',
            b'{"jsonrpc": "2.0", "method": "tools/call", "id": {"a": 1}}',
            b'{"jsonrpc": "2.0", "method": "tools/call", "id": 1, "params": []}',
            b'{"jsonrpc": "2.0", "method": "tools/call", "id": 1, "params": {"name": ["respond"]}}',
            b'{"jsonrpc": "2.0", "method": "tools/call", "id": 1, "params": {"name": "respond", "arguments": "hi"}}',
            b'{"jsonrpc": "2.0", "method": "tools/call", "id": 1, "params": {"name": "respond", "arguments": {"content": 7}}}',
            b'{"jsonrpc": "2.0", "method": "tools/call", "id": 1, "params": {"name": "get_users", "arguments": {"x": [[[[1]]]]}}}',
            b'{"jsonrpc": "2.0", "method": "tools/call", "id": 1, "params": {"name": "\\ud800", "arguments": {}}}',
            b'{"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "respond", "arguments": {"content": "x"}}}',
            b'[{"jsonrpc": "2.0", "method": "tools/list", "id": 1}, {"jsonrpc": "2.0", "method": "tools/list", "id": 2}]',
            b'{"jsonrpc": "2.0", "method": "initialize", "id": 1, "params": {"protocolVersion": "1999-01-01"}}',
            b'{"jsonrpc": "2.0", "method": "openenv/session/close", "id": 1, "params": {"session_id": 5}}',
            b'{"jsonrpc": "2.0", "method": "tools/list", "id": 1, "params": {"session_id": ["a"]}}',
            b'{"jsonrpc": "2.0", "method": "notifications/initialized"}', b"\xff\xfe\x00garbage",
            # last: the env's error echoes the 50 kB name, over this server's 64 KiB session cap: the session ends
            b'{"jsonrpc": "2.0", "method": "tools/call", "id": 1, "params": {"name": "' + b"n" * 50_000 + b'"}}']


def test_hostile_bodies_never_5xx_and_the_session_still_plays_gold(mock_server):
    """Every hostile body on ``/sessions/{id}/mcp`` (2025 and 2026-07-28 headers) and on ``/mcp``: a 4xx or a JSON-RPC
    error / error result, never a 5xx; the last one ends the session through the byte cap; the server then plays a
    gold episode to 1.0."""
    url, http = mock_server
    sid = _open(http, 0)
    for n, body in enumerate(_HOSTILE):
        if n == len(_HOSTILE) - 1:  # every other body left the session serving
            assert http.get(f"/sessions/{sid}/state").status_code == 200
        for version in ("2025-06-18", MODERN):
            r = http.post(f"/sessions/{sid}/mcp", content=body, headers={
                **_HEADERS, "mcp-protocol-version": version, "content-type": "application/json"})
            assert r.status_code < 500, (body[:80], version, r.status_code, r.text[:200])
        r = http.post("/mcp", content=body.replace(b'"id": 1, "params": {', b'"id": 1, "params": {"session_id": "%s", '
                                                   % sid.encode()), headers={"content-type": "application/json"})
        assert r.status_code < 500 and r.json()["jsonrpc"] == "2.0", (body[:80], r.status_code, r.text[:200])
    assert http.get(f"/sessions/{sid}/state").status_code == 404  # closed by the cap (the last body), as designed
    sid = _open(http, 0)
    golds, want = _gold_reward(gym.make("tau2/mock-v0"), 0)
    asyncio.run(_episode(f"{url}/sessions/{sid}/mcp", golds, "legacy"))
    assert http.get(f"/sessions/{sid}/state").json()["reward"] == want == 1.0
