"""``python -m envs.serve`` as a subprocess for the tests that drive it over the network: one way to start it, wait
for the ``listening on http://HOST:PORT ...`` line it prints, and stop it."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def serve_process(env_id: str, *args: str, timeout_s: float = 120.0,
                  lines: list[str] | None = None) -> Iterator[str]:
    """Run ``python -m envs.serve <env_id> --port 0 <args...>`` from the repository and yield its URL.

    ``PYTHONPATH`` is the repository, then the caller's own (a stage may put a library there). ``lines`` (if given)
    receives everything the server prints. Raises ``AssertionError`` when no listening line comes within
    ``timeout_s`` seconds or the process exits first; the server is terminated (then killed) on exit.
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p))
    p = subprocess.Popen([sys.executable, "-m", "envs.serve", env_id, "--port", "0", *args], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = lines if lines is not None else []
    threading.Thread(target=lambda: out.extend(iter(p.stdout.readline, "")), daemon=True).start()
    try:
        t0 = time.time()
        while not any("listening on" in ln for ln in out):
            assert time.time() - t0 < timeout_s and p.poll() is None, "".join(out)
            time.sleep(0.1)
        line = next(ln for ln in out if "listening on" in ln)
        yield line.split("listening on ", 1)[1].split()[0]
    finally:
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:  # pragma: no cover
            p.kill()
            p.wait()
