"""The server's event loop talking to a session worker without a thread per call (issue 49, the load target).

With ``--workers N`` each session's operation used to go from the event loop to the session's own thread of the
server, which made a blocking :mod:`multiprocessing.managers` call to the worker and handed the reply back. At 512
sessions those 512 forwarding threads were the loop's rivals for the GIL: the loop drops the GIL at every socket
syscall and had to win it back against whichever session threads were waking to pickle a call or a reply; the
stalls of a few hundred milliseconds that kept ``/health``'s p99 over 100 ms were there
(``benchmarks/results/openenv_serve_load_issue49.md``). Here the loop itself sends each operation to the worker over
one connection per worker (per event loop) and awaits the reply: no thread of the server runs for it.

Wire: :mod:`multiprocessing.connection`'s own -- a :class:`~multiprocessing.connection.Listener` on a Unix socket
in the worker, opened by :func:`connect` with the same authentication handshake as the manager's (the process's
``authkey``; a blocking handshake, done once per worker and loop on a thread), then messages framed as
``Connection.send_bytes`` frames them (a 4-byte big-endian signed length, or ``-1`` and an 8-byte length), each a
pickle: a request ``(id, op, args)``, a reply ``(id, ok, value)`` (``value`` the result, or what it raised), with
``args`` and ``value`` pickled again inside, so that one that does not unpickle at the other end (a function the
worker cannot import, an exception class whose constructor needs other arguments) fails that call only, as it does
over a manager's connection of its own, instead of the link of every session of the worker. In the
worker (:class:`LinkServer`) one thread per connection reads requests and hands each to its handler (``op``: a
session's ``open``, ``call`` or ``close``), which puts it on the session's own thread there, in the order they came,
so a session's operations still run one at a time and sessions run concurrently; replies are written as they finish,
in any order. A session's open and close come over the link too (from the session's thread of the server,
:meth:`~envs.serving.workers.WorkerEnvironment.__init__`, ``close``): no session makes a connection of its own to its worker.

A connection that breaks fails every call waiting on it with ``EOFError`` (:class:`~envs.serving.workers.
WorkerEnvironment` then says whether the worker has ended); a cancelled call's reply is dropped when it comes.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import os
import pickle
import socket
import struct
import threading
from collections.abc import Callable
from multiprocessing import current_process
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

__all__ = ["Link", "LinkServer", "connect"]

_HEAD = struct.Struct("!i")
_LONG = struct.Struct("!Q")


def _frame(data: bytes) -> list[bytes]:
    """``data`` framed as :meth:`multiprocessing.connection.Connection.send_bytes` frames it."""
    n = len(data)
    return [_HEAD.pack(n), data] if n <= 0x7FFFFFFF else [_HEAD.pack(-1), _LONG.pack(n), data]


def _authkey() -> bytes:
    return bytes(current_process().authkey)


class LinkServer:
    """In a worker: a listener for the server's links. ``handlers[op](*args)`` puts a request on the session's own
    thread and returns its ``concurrent.futures.Future``, or raises (e.g. the session is not here)."""

    def __init__(self, handlers: dict[str, Callable[..., concurrent.futures.Future]]):
        self._handlers = handlers
        self._listener = Listener(family="AF_UNIX", authkey=_authkey())
        self.address = self._listener.address
        threading.Thread(target=self._accept_forever, name="envs-worker-link-accept", daemon=True).start()

    def _accept_forever(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except OSError:  # closed
                return
            except Exception:  # noqa: BLE001, S112 - a peer that failed the handshake: wait for the next
                continue
            threading.Thread(target=self._serve, args=(conn,), name="envs-worker-link", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        write = threading.Lock()

        def reply(rid: int, future) -> None:
            try:
                ok, value = True, future.result()
            except BaseException as e:  # noqa: BLE001 - handed to the caller, as a manager does
                ok, value = False, e
            try:
                inner = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
            except Exception as e:  # noqa: BLE001 - the result or error does not pickle: say so
                ok, inner = False, pickle.dumps(RuntimeError(f"the worker's reply could not be pickled: {e!r}"))
            del value
            data = pickle.dumps((rid, ok, inner), pickle.HIGHEST_PROTOCOL)
            with write:
                try:
                    conn.send_bytes(data)
                except OSError:  # the server went away
                    pass

        while True:
            try:
                rid, op, inner = conn.recv()
            except (EOFError, OSError):
                conn.close()
                return
            try:
                future = self._handlers[op](*pickle.loads(inner))
            except BaseException as e:  # noqa: BLE001 - e.g. the session is closed: its reply is the error
                future = _failed(e)
            future.add_done_callback(functools.partial(reply, rid))


def _failed(e: BaseException) -> concurrent.futures.Future:
    f: concurrent.futures.Future = concurrent.futures.Future()
    f.set_exception(e)
    return f


class Link:
    """The server's side of one connection to a worker's :class:`LinkServer`, on the event loop that made it
    (:func:`connect`): :meth:`call` sends a request and awaits its reply."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader, self._writer = reader, writer
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self.broken: BaseException | None = None
        self._task = asyncio.get_running_loop().create_task(self._read_replies())

    async def _read_replies(self) -> None:
        try:
            while True:
                (n,) = _HEAD.unpack(await self._reader.readexactly(4))
                if n == -1:
                    (n,) = _LONG.unpack(await self._reader.readexactly(8))
                rid, ok, inner = pickle.loads(await self._reader.readexactly(n))
                future = self._pending.pop(rid, None)
                if future is None or future.done():  # its caller was cancelled
                    continue
                try:
                    value = pickle.loads(inner)
                except Exception as e:  # noqa: BLE001 - that reply only
                    ok, value = False, RuntimeError(f"the worker's reply could not be unpickled here: {e!r}")
                del inner
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
                del value
        except BaseException as e:  # noqa: BLE001 - EOF, a reset, cancellation: every waiting call fails
            self._break(EOFError(f"the link to the session worker broke: {type(e).__name__}: {e}"))
            if isinstance(e, asyncio.CancelledError):
                raise

    def _break(self, e: BaseException) -> None:
        self.broken = e
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(e)
        self._writer.close()

    async def call(self, op: str, *args: Any) -> Any:
        """What the worker's handler ``op`` gave for ``args``. Raises: what it raised there; ``EOFError`` when the
        link is (or breaks while) waiting."""
        if self.broken is not None:
            raise EOFError(str(self.broken))
        rid = next(self._ids)
        data = pickle.dumps((rid, op, pickle.dumps(args, pickle.HIGHEST_PROTOCOL)), pickle.HIGHEST_PROTOCOL)
        future = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            self._writer.writelines(_frame(data))
            del data
            await self._writer.drain()
            return await future
        finally:
            self._pending.pop(rid, None)

    def close(self) -> None:
        self._task.cancel()
        self._writer.close()


def _handshake(address: Any) -> socket.socket:
    """A connected, authenticated socket to the listener at ``address`` (blocking: run it off the loop)."""
    conn = Client(address, family="AF_UNIX", authkey=_authkey())
    try:
        return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(conn.fileno()))
    finally:
        conn.close()


async def connect(address: Any) -> Link:
    """A :class:`Link` on the running loop to the worker listening at ``address``. Raises: ``OSError`` /
    ``multiprocessing.AuthenticationError`` from the handshake."""
    sock = await asyncio.get_running_loop().run_in_executor(None, _handshake, address)
    reader, writer = await asyncio.open_connection(sock=sock, limit=2 ** 16)
    return Link(reader, writer)
