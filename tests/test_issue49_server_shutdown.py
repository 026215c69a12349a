"""Issue 49, seen in the load runs: ``python -m envs.serve`` stopped with SIGTERM while WebSocket sessions were open
printed ``Fatal error: protocol.data_received() call failed ... Cannot call write() after write_eof()`` once per
session. The cause: the WebSocket protocol was handed the h11 protocol's lingering transport, so its close became
an HTTP lingering close (half-close, abort 2 s later) and the client's close reply could not be answered. Checked
here, with the server in-process (workers 0) and with two worker processes: on SIGTERM every open session's client
gets the close frame of a server going away (1012, uvicorn's "service restart"), the server exits within seconds,
and it prints no traceback.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("openenv", reason="envs.serve needs the optional extra [serve] (pip install -e '.[serve]': openenv-core)")

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from tests.served import REPO

SESSIONS = 6


def _start(*args: str) -> tuple[subprocess.Popen, list[str], str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p))
    p = subprocess.Popen([sys.executable, "-m", "envs.serve", "DigitSum-v0", "--port", "0", *args], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(iter(p.stdout.readline, "")), daemon=True).start()
    t0 = time.time()
    while not any("listening on" in ln for ln in out):
        assert time.time() - t0 < 300 and p.poll() is None, "".join(out)
        time.sleep(0.1)
    url = next(ln for ln in out if "listening on" in ln).split("listening on ", 1)[1].split()[0]
    return p, out, url


@pytest.mark.parametrize("workers", ["0", "2"])
def test_sigterm_with_websocket_sessions_open_closes_each_with_1012_and_exits_without_a_traceback(workers):
    p, out, url = _start("--workers", workers)
    clients = []
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: p.poll() is None and (p.kill(), p.wait()))
        for _ in range(SESSIONS):
            c = stack.enter_context(ws_connect(url.replace("http://", "ws://") + "/ws", open_timeout=60))
            c.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(c.recv(timeout=120))["type"] == "observation"
            clients.append(c)
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        codes = []
        for c in clients:
            with pytest.raises(ConnectionClosed) as e:
                c.recv(timeout=30)
            codes.append(e.value.rcvd.code if e.value.rcvd is not None else None)
        rc = p.wait(30)
        waited = time.time() - t0
    time.sleep(0.3)  # the reader thread's last lines
    text = "".join(out)
    assert codes == [1012] * SESSIONS, (codes, text[-3000:])
    assert "Traceback" not in text and "Fatal error" not in text, text[-3000:]
    assert rc in (0, -signal.SIGTERM), (rc, text[-3000:])  # uvicorn re-raises the signal it caught once it has stopped
    assert waited < 20, waited
