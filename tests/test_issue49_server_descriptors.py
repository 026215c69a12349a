"""Issue 49, hole 5: the connection cap did not bound file descriptors. A connection refused at the cap left uvicorn's
count but stayed open for its 2 s linger, and asyncio accepts up to the listen backlog (uvicorn: 2048) per wake-up;
under the common 1024-descriptor limit one local client took the server to 1024 descriptors, it logged "Too many
open files" 3,424 times and ``/health`` timed out.

Now the descriptors are budgeted (:mod:`envs.serving.descriptors`): the soft ``RLIMIT_NOFILE`` is raised to the hard
limit at start-up, the connection cap, the backlog and the lingering refusals are fitted under it with a reserve for
grader workers, a refusal past the lingering slots is closed at once, and running out is logged once. Against
``python -m envs.serve`` started with a low limit (soft = hard = 256: nothing to raise), flooded by one client.
"""
from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]': openenv-core)")

import httpx

from tests.served import REPO

LIMIT = 256
FLOOD = 1200  # connections the client opens, about 5x the server's whole limit


def _start(soft: int, hard: int, lines: list[str]) -> tuple[subprocess.Popen, str]:
    """``python -m envs.serve DigitSum-v0 --port 0`` started with ``RLIMIT_NOFILE`` (``soft``, ``hard``), everything
    it prints appended to ``lines``; ``(process, its URL)``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p))

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    p = subprocess.Popen([sys.executable, "-m", "envs.serve", "DigitSum-v0", "--port", "0"], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=low_limit)
    threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True).start()
    t0 = time.time()
    while not any("listening on" in ln for ln in lines):
        if time.time() - t0 > 900 or p.poll() is not None:
            _stop(p)
            raise AssertionError("the server did not start: " + "".join(lines))
        time.sleep(0.1)
    return p, next(ln for ln in lines if "listening on" in ln).split("listening on ", 1)[1].split()[0]


def _stop(p: subprocess.Popen) -> None:
    p.terminate()
    try:
        p.wait(15)
    except subprocess.TimeoutExpired:  # pragma: no cover
        p.kill()
        p.wait()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _own_limit_at_least(n: int) -> int:
    """Raise this process's soft descriptor limit towards ``n`` (the flood's sockets live here); what it is after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts the server's descriptors in /proc")
def test_a_connection_flood_never_takes_the_server_to_its_descriptor_limit():
    flood = min(FLOOD, _own_limit_at_least(FLOOD + 200) - 200)
    assert flood > 2 * LIMIT, "this process cannot open enough sockets to flood the server"
    lines: list[str] = []
    p, url = _start(LIMIT, LIMIT, lines)
    port = int(url.rsplit(":", 1)[1])
    socks, peak, health = [], [0], []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], _fds(p.pid))
            except OSError:
                pass
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for i in range(flood):  # as fast as one client can; every other one sends a request head, then holds
            s = socket.socket()
            s.setblocking(True)
            s.settimeout(10)
            try:
                s.connect(("127.0.0.1", port))
                if i % 2:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            except OSError:
                s.close()
                continue
            socks.append(s)
            if i % 100 == 99:  # /health still answers while the flood holds its connections (503 at the cap is an answer)
                t0 = time.perf_counter()
                r = httpx.get(url + "/health", timeout=15)
                health.append((r.status_code, time.perf_counter() - t0))
        time.sleep(3.0)  # the lingering refusals time out meanwhile
        r = httpx.get(url + "/health", timeout=15)
        health.append((r.status_code, 0.0))
    finally:
        for s in socks:
            s.close()
        time.sleep(0.5)
    try:
        t0 = time.time()
        while (r := httpx.get(url + "/health", timeout=15)).status_code != 200:  # the room comes back
            assert time.time() - t0 < 20, r.text
            time.sleep(0.2)
        stop.set()
        watcher.join(5)
    finally:
        _stop(p)
    out = "".join(lines)
    print(f"flood of {flood} connections: the server's peak {peak[0]} descriptors (limit {LIMIT}), "
          f"{out.count('Too many open files')} 'Too many open files' lines, /health during it: {health}")
    assert peak[0] < LIMIT, f"the server held {peak[0]} descriptors, its limit is {LIMIT}"
    assert out.count("Too many open files") <= 1, out[-3000:]
    assert all(code in (200, 503) for code, _ in health), health
    assert "max_connections" in out, out[-2000:]  # the server said it lowered its cap to fit the limit


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one_at_start_up():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= LIMIT:
        pytest.skip(f"the hard limit here is {hard}")
    target = min(hard, 4096) if hard != resource.RLIM_INFINITY else 4096
    lines: list[str] = []
    p, _ = _start(LIMIT, target, lines)
    try:
        assert resource.prlimit(p.pid, resource.RLIMIT_NOFILE) == (target, target)
        assert "max_connections" not in "".join(lines)  # nothing had to be lowered
    finally:
        _stop(p)
