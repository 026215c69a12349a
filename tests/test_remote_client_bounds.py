"""The TRL client of a served env (``environment_factory(url=...)`` / ``RemoteEnv``) under a hostile server (issue 42).

A tiny hostile WebSocket server (websockets' sync server, 127.0.0.1, a thread of this process) answers the client's
``reset`` / ``state`` with what an attacker would send: a tool schema whose ``$defs`` reference themselves 12 times
per level, a 64 MiB reply that deflate packs into ~62 KB, a reply nested 200,000 deep, a redirect to another port.
The victim runs in a subprocess under an address-space limit (1 GiB) and a wall-clock timeout, so code that does not
bound them fails the test in seconds instead of eating the machine: each must end in ``RemoteBoundError`` naming
its bound, quickly, with its peak memory near the baseline.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from http import HTTPStatus
from pathlib import Path

import pytest

pytest.importorskip("websockets")

from envs.adapters.remote_env import (ClientBounds, RemoteBoundError, RemoteEnv, RemoteEnvError,  # noqa: E402
                                      check_json_shape)

REPO = Path(__file__).resolve().parents[1]
#: address-space limit of the victim process (its baseline after imports is ~160 MB of virtual memory)
VICTIM_AS_BYTES = 1 << 30
VICTIM_TIMEOUT_S = 60


def _reply(data: dict, kind: str = "observation") -> str:
    return json.dumps({"type": kind, "data": data})


def _opening(tools: list) -> str:
    return _reply({"observation": {"messages": [{"role": "user", "content": "hi"}], "info": {"tools": tools}}})


@contextlib.contextmanager
def hostile_server(reset_reply: str | None = None, redirect_to: str | None = None):
    """A WebSocket server on 127.0.0.1 answering ``reset`` with ``reset_reply`` and ``state`` with
    ``tau2/mock-v0``'s id (or redirecting every handshake to ``redirect_to``); yields ``(url, seen)`` where ``seen``
    counts the handshakes it got."""
    from websockets.sync.server import serve

    seen = {"handshakes": 0}

    def process_request(connection, request):
        seen["handshakes"] += 1
        if redirect_to is not None:
            response = connection.respond(HTTPStatus.FOUND, "moved\n")
            response.headers["Location"] = redirect_to
            return response
        return None

    def handler(ws):
        try:
            for message in ws:
                kind = json.loads(message)["type"]
                ws.send(reset_reply if kind == "reset" else _reply({"env_id": "tau2/mock-v0"}, "state"))
        except Exception:  # the client hung up on a bomb: nothing to do
            pass

    with serve(handler, "127.0.0.1", 0, process_request=process_request, max_size=None) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.socket.getsockname()[1]}", seen
        finally:
            server.shutdown()
            thread.join(timeout=10)


_VICTIM = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from envs.adapters.trl_env import RemoteEnv, environment_factory
t = time.perf_counter()
try:
    {action}
    out = {{"raised": None}}
except BaseException as e:
    out = {{"raised": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "bound": getattr(e, "bound", None),
           "message": str(e)[:300]}}
out["seconds"] = time.perf_counter() - t
hwm = [x for x in open("/proc/self/status") if x.startswith("VmHWM:")]  # peak RSS of this image (ru_maxrss
out["maxrss_mb"] = int(hwm[0].split()[1]) / 1024 if hwm else 0.0         # keeps the forking parent's across exec)
print("VICTIM " + json.dumps(out))
"""


def run_victim(action: str) -> dict:
    """Run ``action`` (one Python statement) in a fresh interpreter under
    :data:`VICTIM_AS_BYTES` and :data:`VICTIM_TIMEOUT_S`: what it raised, its seconds and peak RSS (MB)."""
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    try:
        p = subprocess.run([sys.executable, "-c", _VICTIM.format(limit=VICTIM_AS_BYTES, action=action)], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=VICTIM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the client was still working after {VICTIM_TIMEOUT_S} s (unbounded)")
    lines = [x for x in p.stdout.splitlines() if x.startswith("VICTIM ")]
    assert lines, f"the victim died (rc {p.returncode}): {p.stderr[-2000:]}"
    return json.loads(lines[-1][len("VICTIM "):])


def _assert_refused(out: dict, bound: str, max_seconds: float = 10.0, max_rss_mb: float = 400.0) -> None:
    assert out["raised"] == "RemoteBoundError", out
    assert {"RemoteEnvError", "RuntimeError"} <= set(out["mro"]), out
    assert out["bound"] == bound and bound in out["message"], out
    assert out["seconds"] < max_seconds and out["maxrss_mb"] < max_rss_mb, out


# ------------------------------------------------------------------------------------------------ the four breaks
def test_a_self_referencing_schema_is_refused_by_its_expanded_size():
    """573 bytes of schema, 12 self references per level: refused at ``max_schema_nodes`` in well under a second
    (it used to grow until MemoryError: 35.6 s, 2.1 GB)."""
    defs = {"N": {"type": "object", "properties": {f"p{i}": {"$ref": "#/$defs/N"} for i in range(12)}}}
    tool = {"type": "function", "function": {"name": "boom", "description": "x", "parameters": {
        "type": "object", "properties": {"arg": {"$ref": "#/$defs/N"}}, "required": ["arg"], "$defs": defs}}}
    assert len(json.dumps(tool)) < 700
    with hostile_server(_opening([tool])) as (url, _):
        out = run_victim(f"environment_factory(url={url!r})")
    _assert_refused(out, "max_schema_nodes")
    assert str(ClientBounds().max_schema_nodes) in out["message"]


def test_a_compression_bomb_is_refused_while_it_is_decompressed():
    """A ~64 MiB reply of ``{}``s that permessage-deflate packs into ~62 KB: refused at ``max_reply_bytes`` (8 MiB)
    while it is decompressed (it used to be parsed into 1.7 GB)."""
    n = (63 << 20) // 3
    bomb = '{"type": "observation", "data": {"observation": {"messages": [], "info": {"x": [' + "{}," * n + "{}]}}}}"
    with hostile_server(bomb) as (url, _):
        out = run_victim(f"RemoteEnv({url!r}).reset()")
    _assert_refused(out, "max_reply_bytes")
    assert str(8 << 20) in out["message"]


def test_a_deep_reply_is_refused_before_parsing():
    """200,000 nested arrays (400 KB): refused at ``max_json_depth`` by the linear scan (``json.loads`` used to raise
    ``RecursionError``)."""
    deep = '{"type": "observation", "data": ' + "[" * 200_000 + "]" * 200_000 + "}"
    with hostile_server(deep) as (url, _):
        out = run_victim(f"RemoteEnv({url!r}).reset()")
    _assert_refused(out, "max_json_containers")  # 200,000 arrays: the cheaper count refuses it first
    deep = '{"type": "observation", "data": ' + "[" * 5_000 + "]" * 5_000 + "}"
    with hostile_server(deep) as (url, _):
        out = run_victim(f"RemoteEnv({url!r}).reset()")
    _assert_refused(out, "max_json_depth")
    assert "5001 deep" in out["message"] and "64" in out["message"]


def test_no_redirect_to_another_origin():
    """A 302 to another port of the same host is not followed (the other server never sees a handshake)."""
    with hostile_server(_opening([])) as (target, seen_target):
        with hostile_server(redirect_to=target.replace("http", "ws") + "/ws") as (url, seen):
            with pytest.raises(RemoteBoundError, match="redirect") as e:
                RemoteEnv(url, timeout_s=10)
    assert e.value.bound == "redirect" and seen["handshakes"] == 1 and seen_target["handshakes"] == 0


def test_a_same_origin_redirect_is_followed():
    """Another path on the same server is the same origin: followed (websockets' own rule for those)."""
    from websockets.sync import client

    if not hasattr(client, "reconnect"):
        pytest.skip("websockets < 15 follows no redirect")
    state = {}

    def process_request(connection, request):
        if request.path == "/old/ws":
            response = connection.respond(HTTPStatus.FOUND, "")
            response.headers["Location"] = "/ws"
            return response
        state["path"] = request.path
        return None

    from websockets.sync.server import serve

    def handler(ws):
        for _message in ws:
            ws.send(_opening([]))

    with serve(handler, "127.0.0.1", 0, process_request=process_request) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            env = RemoteEnv(f"ws://127.0.0.1:{server.socket.getsockname()[1]}/old/ws", timeout_s=10)
            env._ws.close()
        finally:
            server.shutdown()
    assert state["path"] == "/ws"


# ------------------------------------------------------------------------------------------------ bounds, unit level
def test_check_json_shape_reads_json_strings_as_json_does():
    """Brackets inside strings (escaped quotes, backslashes) are not nesting; the depth bound is inclusive."""
    check_json_shape(json.dumps({"a": "[[[[[[[[[[\\\"{{{{{{{{", "b": ["\\", "]]]]"]}), max_depth=2, max_containers=2)
    check_json_shape("[" * 64 + "]" * 64, max_depth=64, max_containers=64)
    with pytest.raises(RemoteBoundError, match="max_json_depth: the reply nests JSON 65 deep, more than 64"):
        check_json_shape("[" * 65 + "]" * 65, max_depth=64, max_containers=1000)
    with pytest.raises(RemoteBoundError, match="max_json_containers"):
        check_json_shape("[" + "[]," * 10 + "[]]", max_depth=64, max_containers=10)
    # unbalanced text: the scan still bounds what json.loads could nest before failing
    with pytest.raises(RemoteBoundError, match="max_json_depth"):
        check_json_shape("]" * 10 + "[" * 100, max_depth=64, max_containers=1000)


def test_client_bounds_validate_and_default():
    b = ClientBounds()
    assert (b.max_reply_bytes, b.max_json_depth, b.max_json_containers, b.max_schema_nodes) == (
        8 << 20, 64, 100_000, 50_000)
    for bad in (0, -1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="max_json_depth"):
            ClientBounds(max_json_depth=bad)
    with pytest.raises(ValueError, match="ClientBounds"):
        RemoteEnv("http://127.0.0.1:1", bounds={"max_reply_bytes": 1})


def test_a_reply_that_is_not_json_is_a_remote_env_error():
    with hostile_server("not json {") as (url, _):
        env = RemoteEnv(url, timeout_s=10)
        with pytest.raises(RemoteEnvError, match="BAD_REPLY") as e:
            env.reset()
        env.close()
    assert not isinstance(e.value, RemoteBoundError)


def test_bounds_are_the_callers_to_set():
    """``bounds=`` tightens (or loosens) each bound, on RemoteEnv and through environment_factory."""
    from envs.adapters.trl_env import environment_factory

    tool = {"type": "function", "function": {"name": "echo", "description": "Echo.", "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "description": "what"}}, "required": ["text"]}}}
    with hostile_server(_opening([tool])) as (url, _):
        env = RemoteEnv(url, timeout_s=10, bounds=ClientBounds(max_reply_bytes=64))
        with pytest.raises(RemoteBoundError, match="max_reply_bytes: the reply is larger than 64 bytes"):
            env.reset()
        cls = environment_factory(url=url)
        assert callable(cls.echo)
        with pytest.raises(RemoteBoundError, match="max_schema_nodes: .* more than 2 nodes"):
            environment_factory(url=url, bounds=ClientBounds(max_schema_nodes=2))


def test_worst_case_reply_within_the_default_bounds_stays_small():
    """Just under every default bound, the most expensive shapes per byte (short strings, ~12 bytes of Python per
    byte of text; 99,991 empty objects beside them) cost the victim well under 400 MB peak RSS (measured: 177 MB,
    the baseline 45 MB)."""
    n = ((8 << 20) - 400_000) // 5  # two-character strings: one-character ones are shared singletons
    worst = ('{"type": "observation", "data": {"observation": {"messages": [], "info": {"s": [' + '"ab",' * n
             + '"ab"], "o": [' + "{}," * 99_990 + "{}]}}}}")
    assert len(worst) < 8 << 20
    with hostile_server(worst) as (url, _):
        out = run_victim(f"RemoteEnv({url!r}).reset()")
    assert out["raised"] is None and out["maxrss_mb"] < 400, out
