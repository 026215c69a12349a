"""Issue 49, the load target: with ``--workers N`` the server's event loop sends each session operation to the
session's worker itself (:mod:`envs.serving.worker_link`) instead of handing it to the session's own thread for a
blocking manager call -- at 512 sessions those forwarding threads were the loop's rivals for the GIL.

Checked: the link carries calls concurrently and out of order, large payloads both ways, the error a call raised,
a closed session's error; a link whose worker side goes away fails the calls waiting on it (``EOFError``) and every
later one; a peer without the authkey is refused; and a server with workers plays its routes without calling the
handle's blocking ``call`` (no server thread runs a session's operation) and opens and closes its sessions over the
link (no manager call: no session holds a connection of its own to its worker).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import threading
import time
from multiprocessing.connection import Client
from multiprocessing.managers import BaseProxy

import pytest

pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]': openenv-core)")

import httpx
from websockets.sync.client import connect as ws_connect

from envs.serve import build_app
from envs.serving.environment import SessionClosedError
from envs.serving.worker_link import LinkServer, connect
from envs.serving.workers import WorkerEnvironment, WorkerPool
from tests.served import serve_app


def _echo(env, *args):
    return args


class _Host:
    """A stand-in for a worker's SessionHost: calls run on a small pool; ``gate`` holds calls with key ``"slow"``."""

    def __init__(self):
        self.pool = concurrent.futures.ThreadPoolExecutor(4)
        self.gate = threading.Event()

    def submit(self, key, fn, args, unsent, client):
        if key == "closed":
            raise SessionClosedError("session closed")

        def run():
            if key == "slow":
                assert self.gate.wait(30)
            if key == "boom":
                raise ValueError("env raised")
            return fn(None, *args), unsent, client
        return self.pool.submit(run)


def test_calls_go_concurrently_out_of_order_with_large_payloads_and_errors():
    host = _Host()
    server = LinkServer({"call": host.submit})

    async def main():
        link = await connect(server.address)
        slow = asyncio.ensure_future(link.call("call", "slow", _echo, ("first",), 0, None))
        await asyncio.sleep(0.2)
        big = "x" * (3 * 2 ** 20)
        fast = await link.call("call", "a", _echo, (big, 7), 5, "client-1")  # answered while the first still waits
        assert fast == ((big, 7), 5, "client-1") and not slow.done()
        with pytest.raises(ValueError, match="env raised"):
            await link.call("call", "boom", _echo, (), 0, None)
        with pytest.raises(SessionClosedError):
            await link.call("call", "closed", _echo, (), 0, None)
        host.gate.set()
        assert await asyncio.wait_for(slow, 30) == (("first",), 0, None)
        many = await asyncio.gather(*(link.call("call", f"k{i}", _echo, (i,), i, None) for i in range(200)))
        assert [m[0] for m in many] == [(i,) for i in range(200)]
        link.close()

    asyncio.run(main())


def _refuse_to_unpickle():
    raise RuntimeError("cannot be rebuilt here")


class Unloadable:
    """Pickles, but unpickling it raises (a function the other side cannot import, an exception class whose
    constructor wants other arguments)."""

    def __reduce__(self):
        return _refuse_to_unpickle, ()


class NeedsTwo(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


def _make_unloadable(env):
    return Unloadable()


def _raise_needs_two(env):
    raise NeedsTwo(1, 2)


def test_what_does_not_unpickle_fails_that_call_only_and_the_link_serves_on():
    host = _Host()
    server = LinkServer({"call": host.submit})

    async def main():
        link = await connect(server.address)
        with pytest.raises(RuntimeError, match="cannot be rebuilt here"):  # a request the worker cannot load
            await asyncio.wait_for(link.call("call", "a", _echo, (Unloadable(),), 0, None), 10)
        with pytest.raises(RuntimeError, match="could not be unpickled here"):  # a result the server cannot load
            await asyncio.wait_for(link.call("call", "a", _make_unloadable, (), 0, None), 10)
        with pytest.raises(RuntimeError, match="could not be unpickled here"):  # an exception that does not rebuild
            await asyncio.wait_for(link.call("call", "a", _raise_needs_two, (), 0, None), 10)
        assert await asyncio.wait_for(link.call("call", "a", _echo, (1,), 0, None), 10) == ((1,), 0, None)
        assert link.broken is None
        link.close()

    asyncio.run(main())


def test_a_broken_link_fails_the_waiting_call_and_every_later_one():
    host = _Host()
    server = LinkServer({"call": host.submit})

    async def main():
        link = await connect(server.address)
        waiting = asyncio.ensure_future(link.call("call", "slow", _echo, (), 0, None))
        await asyncio.sleep(0.2)
        link._writer.transport.abort()  # the connection goes away under the waiting call (as when a worker dies)
        with pytest.raises(EOFError):
            await asyncio.wait_for(waiting, 10)
        with pytest.raises(EOFError):
            await link.call("call", "a", _echo, (), 0, None)

    asyncio.run(main())
    host.gate.set()


def test_a_peer_without_the_authkey_is_refused():
    server = LinkServer({"call": _Host().submit})
    with pytest.raises(Exception):  # noqa: B017 - multiprocessing's AuthenticationError (or the link closing)
        conn = Client(server.address, family="AF_UNIX", authkey=b"not the key")
        conn.send(("x",))
        conn.recv()


def _answer(prompt: str) -> str:
    return f"<answer>{sum(int(c) for c in re.findall(r'[0-9]+', prompt)[-1])}</answer>"


def test_a_server_with_workers_never_runs_a_sessions_operation_on_a_thread_of_its_own(monkeypatch):
    def blocking_call(self, fn, *args):
        raise AssertionError(f"a session's operation ({fn.__name__}) went through a server thread")

    proxied: list[str] = []  # manager calls: a session's own connection to its worker would show here
    real = BaseProxy._callmethod
    monkeypatch.setattr(BaseProxy, "_callmethod",
                        lambda self, name, *a, **k: proxied.append(name) or real(self, name, *a, **k))
    monkeypatch.setattr(WorkerEnvironment, "call", blocking_call)
    app = build_app("DigitSum-v0", max_sessions=4, idle_timeout_s=None, workers=1)
    with serve_app(app, timeout_s=300) as (url, _), httpx.Client(base_url=url, timeout=120) as c:
        sid = c.post("/sessions").json()["session_id"]
        r = c.post(f"/sessions/{sid}/reset", json={"index": 3})
        assert r.status_code == 200, r.text
        prompt = r.json()["observation"]["messages"][-1]["content"]
        r = c.post(f"/sessions/{sid}/step", json={"action": {"content": _answer(prompt)}})
        assert r.status_code == 200 and r.json()["reward"] == 1.0, r.text
        assert c.delete(f"/sessions/{sid}").status_code in (200, 204)
        with ws_connect(url.replace("http", "ws") + "/ws", open_timeout=120) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"index": 3}}))
            obs = json.loads(ws.recv(timeout=120))
            assert obs["type"] == "observation", obs
            ws.send(json.dumps({"type": "step", "data": {"content": _answer(obs["data"]["observation"]["messages"][-1]["content"])}}))
            out = json.loads(ws.recv(timeout=120))
            assert out["type"] == "observation" and out["data"]["reward"] == 1.0, out
        t0 = time.time()
        while c.get("/sessions").json()["active"] and time.time() - t0 < 30:
            time.sleep(0.1)
        assert c.get("/sessions").json()["active"] == 0
    assert not {"open", "call", "close"} & set(proxied), proxied  # opens and closes went over the link too


def _pid(env):
    import os
    return os.getpid()


def test_a_broken_link_to_a_live_worker_is_made_again_by_the_next_call():
    pool = WorkerPool(1)
    pool.start()
    (address,) = pool._addresses

    async def main():
        await pool.call(address, "open", "s1", "DigitSum-v0", {}, None)
        link = await pool.link(address)
        link._writer.transport.abort()
        for _ in range(100):
            if link.broken is not None:
                break
            await asyncio.sleep(0.05)
        assert link.broken is not None
        out, _, _ = await pool.call(address, "call", "s1", _pid, (), 0, None)  # the env lives on in the worker
        assert out == pool.pids[0] and (await pool.link(address)) is not link
        await pool.call(address, "close", "s1")
        pool.close_links()

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
