"""``envs.serve`` for the tests that drive it over the network, two ways: :func:`serve_process` runs
``python -m envs.serve`` as a subprocess (start it, wait for the ``listening on http://HOST:PORT ...`` line it prints,
stop it); :func:`serve_app` runs a built app in-process (uvicorn in a thread on a loopback socket). :class:`ToyChatEnv`
is the never-ending toy chat the server tests register their envs from; :func:`hold_bodies` is the held-bodies
adversary (connections that send all but the last byte of a large body and wait)."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym

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



class ToyChatEnv(gym.Env):
    """Never-ending toy chat (fast, no data): ``reset`` opens with one user message (:attr:`opening`); each action
    (a string, or a message dict whose ``content`` is read) is appended as the assistant's message, then
    :meth:`reply`'s new messages; reward 0.0. ``info`` carries ``messages`` (the whole conversation), ``task_id``
    ``"0"``, ``index`` 0 and :attr:`tools`."""

    opening = "go"
    tools: list[dict] = []

    def __init__(self):
        self.observation_space = gym.spaces.Text(100)
        self.action_space = gym.spaces.Text(100)
        self.conv: list[dict] = []

    def _info(self):
        return {"messages": list(self.conv), "task_id": "0", "index": 0, "tools": list(self.tools)}

    def reply(self, text: str) -> tuple[list[dict], bool]:
        """The messages that answer ``text`` and whether the episode ends: here one user message echoing it, never."""
        return [{"role": "user", "content": "you said: " + text}], False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.conv = [{"role": "user", "content": self.opening}]
        return list(self.conv), self._info()

    def step(self, action):
        text = action if isinstance(action, str) else (action.get("content") or "")
        new, terminated = self.reply(text)
        self.conv += [{"role": "assistant", "content": text}] + new
        return new, 0.0, terminated, False, self._info()

def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound, read, released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_app(app, *, sndbuf: int | None = None, timeout_s: float = 20.0, **config: Any) -> Iterator[tuple[str, Any]]:
    """Serve the ASGI ``app`` (from :func:`envs.serve.build_app`) in a daemon thread on a loopback socket bound here;
    yield ``(url, server)`` (``http://127.0.0.1:PORT`` and the ``uvicorn.Server``).

    ``config`` goes to :func:`envs.serve.uvicorn_config` (``max_body_bytes``, ``header_timeout_s``,
    ``send_timeout_s``, ...; ``log_level`` defaults to ``"error"``). ``sndbuf`` (bytes) shrinks the kernel send
    buffer of every accepted connection (Linux: accepted sockets inherit it from the listener), so that a reply of a
    few hundred kB stalls on a client that does not read. Raises ``AssertionError`` when the server has not started
    within ``timeout_s`` seconds (or its thread died), or has not shut down within ``timeout_s`` seconds on exit.
    """
    import uvicorn

    from envs import serve

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sndbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(serve.uvicorn_config(app, host="127.0.0.1", port=port, **{"log_level": "error", **config}))
    th = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    try:
        t0 = time.time()
        while not srv.started:
            assert th.is_alive() and time.time() - t0 < timeout_s, "server did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}", srv
    finally:
        srv.should_exit = True
        th.join(timeout_s)
        sock.close()
        assert not th.is_alive(), "server did not shut down"


def post_head(port: int, n: int, path: str = "/sessions") -> socket.socket:
    """A connection that sent the head of a ``POST path`` announcing an ``n``-byte body, and nothing more yet."""
    s = socket.socket()
    s.connect(("127.0.0.1", port))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              f"Content-Length: {n}\r\n\r\n".encode())
    return s


def answered(socks: list[socket.socket], wait_s: float) -> list[bytes | None]:
    """The first bytes each socket has been answered with within ``wait_s`` seconds (``None``: nothing yet)."""
    time.sleep(wait_s)
    out = []
    for s in socks:
        s.setblocking(False)
        try:
            out.append(s.recv(4096) or b"EOF")
        except BlockingIOError:
            out.append(None)
        except OSError as e:
            out.append(repr(e).encode())
        s.setblocking(True)
    return out


def hold_bodies(port: int, n_conns: int, body: int, path: str = "/sessions") -> tuple[list, list]:
    """``n_conns`` connections announcing a ``body``-byte body; those the server did not refuse at once send all but
    its last byte and hold. Returns ``(held sockets, refusals)`` (the refused ones' first reply bytes; closed)."""
    socks = [post_head(port, body, path) for _ in range(n_conns)]
    replies = answered(socks, 1.0)
    held = [s for s, r in zip(socks, replies) if r is None]
    for s in held:
        s.settimeout(30)
        s.sendall(b"x" * (body - 1))
    for s, r in zip(socks, replies):
        if r is not None:
            s.close()
    return held, [r for r in replies if r is not None]
