"""The transport bounds of :mod:`envs.serve`: the ASGI guard in front of every route (``Origin`` / ``Host``,
connections and bodies in flight, body size and time), uvicorn's h11 and WebSocket protocols with header and
send deadlines, and :func:`uvicorn_config` that serves an app with them."""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import os
import re
import sys
from collections.abc import Callable


try:  # the optional extra [serve]
    import h11
    import uvicorn
    from starlette.websockets import WebSocketDisconnect
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.websockets.websockets_sansio_impl import (
        WebSocketsSansIOProtocol,
    )
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("envs.serve needs the [serve] extra: pip install -e '.[serve]' (openenv-core)") from e

from envs.serving.limits import (
    DEFAULT_BACKLOG, DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_INFLIGHT_BODY_BYTES, DEFAULT_SEND_TIMEOUT_S, FD_RESERVE, LINGER_S, LINGER_SLOTS, SMALL_BODY_BYTES,
    TRIM_AFTER_FREED_BYTES,
)
from envs.serving.descriptors import fit_descriptors, install_accept_error_log
from envs.serving.environment import _dumps
from envs.grader_queue import GRADING_CLIENT, peer_key


class _WriteDeadline:
    """A send timeout for an asyncio protocol: once the transport's buffer is full (``pause_writing``), the client has
    ``send_timeout_s`` to take what is pending (``resume_writing`` -- for HTTP, after the reply's last piece) or the
    connection is aborted, which frees its buffer at once (``close`` would wait for it to drain)."""

    send_timeout_s = DEFAULT_SEND_TIMEOUT_S
    _write_timer = None

    def _arm_write(self) -> None:
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.send_timeout_s, self._write_expired)

    def _disarm_write(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_expired(self) -> None:
        self._write_timer = None
        if self.transport is not None:
            self.transport.abort()


class _TimedWSProtocol(_WriteDeadline, WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol with :class:`_WriteDeadline` (one reply is written whole: taken = resumed)."""

    def pause_writing(self) -> None:
        super().pause_writing()
        self._arm_write()

    def resume_writing(self) -> None:
        self._disarm_write()
        super().resume_writing()

    def connection_lost(self, exc) -> None:
        self._disarm_write()
        super().connection_lost(exc)


#: A ``Host`` header (RFC 9110 7.2, RFC 3986 3.2.2), parsed strictly: a bracketed IPv6 literal or a name of ASCII
#: letters, digits, ``.``, ``-``, ``_``, then optionally ``:`` and 1 to 5 ASCII digits; nothing else.
_HOST_RE = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9._-]+)(?::[0-9]{1,5})?", re.ASCII)


def _host_name(value: str) -> str | None:
    """The name of a ``Host`` header, lower-cased, without its port (an IPv6 literal without its brackets:
    ``[::1]:8000`` -> ``::1``); ``None`` when the header is not exactly of that form (``[::1]evil``, ``a:1:2``,
    ``a:8x``, a bare ``::1``, spaces or non-ASCII inside)."""
    m = _HOST_RE.fullmatch(value.strip().lower())
    return None if m is None else m.group(1).strip("[]")


class _Guard:
    """ASGI middleware in front of every route (HTTP and WebSocket).

    * ``Host`` not in ``allowed_hosts`` (unless ``"*"``), or an ``Origin`` header not in
      ``allowed_origins`` -> 403 (a WebSocket handshake is refused with 403 too).
    * HTTP bodies: read whole before the app sees them; over ``max_body_bytes`` -> 413 (by
      Content-Length or while streaming, chunked included), not received within ``body_timeout_s``
      -> 408; both close the connection.
    * Bodies in flight: a body over :data:`SMALL_BODY_BYTES` is counted (``inflight``) from its head -- all of its
      ``Content-Length`` at once, a chunked one as it arrives -- until the app has answered it; one that would bring
      the count over ``max_inflight_body_bytes`` -> 503 (``Retry-After: 1``) naming the cap, before any more of it is
      read; the connection stays open (a client still sending reads the 503, not a reset) and uvicorn drops the rest
      of the body as it arrives, which the client must finish within the header timeout (:class:`_TimedH11Protocol`).
      Small bodies are not counted (the connection cap bounds them).
    """

    def __init__(self, app, *, max_body_bytes: int, body_timeout_s: float, allowed_hosts: list[str],
                 allowed_origins: list[str], max_inflight_body_bytes: int = DEFAULT_MAX_INFLIGHT_BODY_BYTES):
        self.app, self.limit, self.body_timeout_s = app, max_body_bytes, body_timeout_s
        self.allowed_hosts = {h.lower().strip("[]") for h in allowed_hosts}
        self.allowed_origins = {o.rstrip("/").lower() for o in allowed_origins}
        self.max_inflight = max_inflight_body_bytes
        self.inflight = 0  # bytes of counted bodies being received or served (one event loop: no lock)
        self.freed = 0  # bytes of counted bodies freed since the allocator was last trimmed

    def _reserve(self, n: int) -> str | None:
        """Count ``n`` more bytes of bodies in flight; or, when that would go over the cap, count nothing and return
        the 503's message."""
        if self.inflight + n > self.max_inflight:
            return (f"server busy: request bodies being received total {self.inflight} bytes and this one needs {n} "
                    f"more, over max_inflight_body_bytes={self.max_inflight} (across all connections; bodies of at most "
                    f"{SMALL_BODY_BYTES} bytes are not counted); retry later")
        self.inflight += n
        return None

    def _refusal(self, scope) -> str | None:
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        if "*" not in self.allowed_hosts and _host_name(host) not in self.allowed_hosts:
            return (f"Host {host!r:.100} is not served here (allowed: {sorted(self.allowed_hosts)}; DNS-rebinding guard, "
                    "--allow-host adds names)")
        origin = headers.get(b"origin")
        if origin is not None and origin.decode("latin-1").rstrip("/").lower() not in self.allowed_origins:
            return (f"cross-origin request refused: Origin {origin.decode('latin-1')!r:.100} is not in the allow-list "
                    f"{sorted(self.allowed_origins)} (--allow-origin adds one)")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            if scope["type"] == "lifespan":  # the server's loop: running out of descriptors is logged once a minute
                install_accept_error_log(asyncio.get_running_loop())
            return await self.app(scope, receive, send)
        GRADING_CLIENT.set(peer_key(scope))  # graders shared per client (envs.grader_queue); this task's context only
        refusal = self._refusal(scope)
        if scope["type"] == "websocket":
            if refusal is not None:  # closing before accepting: the handshake is answered 403
                await receive()  # websocket.connect
                return await send({"type": "websocket.close", "code": 1008, "reason": refusal[:120]})
            try:  # a socket the client already closed is not an error
                return await self.app(scope, receive, send)
            except WebSocketDisconnect:
                return None
        if refusal is not None:
            return await _reply(send, 403, refusal)
        length = next((int(v) for k, v in scope.get("headers", []) if k == b"content-length" and v.isdigit()), None)
        if length is not None and length > self.limit:
            return await _reply(send, 413, f"request body over the limit of {self.limit} bytes", close=True)
        held = [0]  # bytes this request counts in self.inflight
        try:
            if length is not None and length > SMALL_BODY_BYTES:
                busy = self._reserve(length)
                if busy is not None:  # answered at once; uvicorn drops the rest of the body as it comes
                    return await _reply(send, 503, busy)
                held[0] = length
            body = await self._receive_body(receive, send, held)
            if body is None:  # answered (408, 413, 503) or the client left
                return None
            replayed = False

            async def replay():
                nonlocal replayed, body
                if not replayed:
                    replayed = True
                    msg, body = {"type": "http.request", "body": body, "more_body": False}, b""
                    return msg
                return await receive()

            return await self.app(scope, replay, send)
        finally:
            self._release(held[0])

    def _release(self, n: int) -> None:
        """Uncount ``n`` bytes of a body that is gone; every :data:`TRIM_AFTER_FREED_BYTES` freed, trim the C
        allocator in a worker thread (:func:`_malloc_trim`)."""
        self.inflight -= n
        self.freed += n
        if self.freed >= TRIM_AFTER_FREED_BYTES:
            self.freed = 0
            asyncio.get_running_loop().run_in_executor(None, _malloc_trim)

    async def _receive_body(self, receive, send, held: list[int]) -> bytes | None:
        """The request's whole body, or ``None`` once answered (408 not received within ``body_timeout_s``, 413 over
        ``max_body_bytes``, 503 a chunked body over :data:`SMALL_BODY_BYTES` that would bring the bodies in flight over
        their cap: counted in ``held[0]`` as it arrives) or the client left."""
        chunks, seen, more = [], 0, True
        deadline = asyncio.get_running_loop().time() + self.body_timeout_s
        while more:
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except asyncio.TimeoutError:
                return await _reply(send, 408, f"request body not received within {self.body_timeout_s} s", close=True)
            if msg["type"] == "http.disconnect":
                return None
            piece = msg.get("body", b"")
            seen += len(piece)
            if seen > self.limit:
                return await _reply(send, 413, f"request body over the limit of {self.limit} bytes", close=True)
            if seen > max(held[0], SMALL_BODY_BYTES):  # chunked (or over its Content-Length: h11 refuses that first)
                busy = self._reserve(seen - held[0])
                if busy is not None:
                    return await _reply(send, 503, busy)
                held[0] = seen
            chunks.append(piece)
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        chunks.clear()
        return body


@functools.cache
def _libc_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def _malloc_trim() -> None:
    """Give the C allocator's free memory back to the system (glibc's ``malloc_trim(0)``: every arena, free pages
    anywhere in them); nothing where there is no such call."""
    trim = _libc_malloc_trim()
    if trim is not None:
        trim(0)


async def _reply(send, status: int, detail: str, close: bool = False) -> None:
    """Answer ``status`` with ``{"detail": detail}`` (a 503 with ``Retry-After: 1``; ``close``: and close the
    connection)."""
    body = _dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 503:
        headers.append((b"retry-after", b"1"))
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _drain(transport) -> None:
    """Read and drop what the client has sent so far on ``transport``'s socket (it is non-blocking), so that closing
    it sends a FIN: a close with unread bytes is answered by a reset, which can destroy the reply on its way."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    try:
        while os.read(sock.fileno(), 65536):
            pass
    except OSError:  # BlockingIOError: nothing more for now; anything else: the socket is gone anyway
        pass


class _LingeringTransport:
    """An HTTP connection's asyncio transport as uvicorn sees it: every call goes to the real transport except
    ``close``, which :meth:`_TimedH11Protocol._close` turns into a lingering close while the client is still sending
    its request body."""

    def __init__(self, transport, protocol: "_TimedH11Protocol"):
        self._transport, self._protocol = transport, protocol

    def __getattr__(self, name):
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol._close()


class _TimedH11Protocol(_WriteDeadline, H11Protocol):
    """uvicorn's h11 protocol with a header deadline: a connection that has not sent a complete request head
    within ``header_timeout_s`` of opening (or of its last response) is closed, and so is one still sending the body
    of a request answered before its body was read (a 503) ``header_timeout_s`` after that answer. uvicorn has no such timer
    (its keep-alive timer stops at the first byte), so half-open connections were held forever. And with a send
    deadline (:class:`_WriteDeadline`): a reply must be taken within ``send_timeout_s`` of the connection's buffer
    filling up (the timer runs from the first stall to the reply's last piece leaving the buffer). And with a cap on
    open connections: a connection that finds ``max_connections`` open (uvicorn's count: HTTP and WebSocket) is
    answered 503 naming the cap at once, then -- while fewer than ``linger_slots`` refusals linger -- half-closed and
    aborted after :data:`LINGER_S` (what it sends meanwhile is dropped), otherwise closed at once (what it had sent
    read first): a refusal leaves the cap's count, and only the slots hold descriptors past it (issue 49: uncounted
    lingering refusals took a server to its descriptor limit). And with a lingering close: a connection closed while the client is
    still sending its request body (a 413 or 408 answered with ``connection: close``) is half-closed -- the reply and
    then FIN are sent -- and what the client still sends is read and dropped until it closes or :data:`LINGER_S` have
    passed, then aborted; a close at once would leave unread bytes, which the kernel answers with a reset that can
    destroy the reply before the client reads it."""

    max_connections = DEFAULT_MAX_CONNECTIONS
    linger_slots = LINGER_SLOTS  # refusals that may linger at once; their count is shared: _lingering[0]
    _lingering = [0]
    _refused = False  # answered 503 at the connection cap, or closing with a linger: what the client sends is dropped
    _linger_timer = None
    _holds_slot = False  # a refusal lingering in one of the linger_slots

    def _close(self) -> None:
        """``transport.close()`` as uvicorn calls it: a lingering close (half-close, drop what arrives, abort after
        :data:`LINGER_S`) when the client is still sending a request body, else a plain close."""
        transport = self.transport._transport
        if self._refused:  # half-closed already: the linger timer aborts it
            return
        if self.conn.their_state is h11.SEND_BODY and not transport.is_closing() and transport.can_write_eof():
            self._linger()
        else:
            transport.close()

    def _linger(self) -> None:
        """Half-close (after what is buffered: the client reads the whole reply, then end of stream), drop what the
        client still sends, abort after :data:`LINGER_S`."""
        transport = self.transport._transport
        self._refused = True
        transport.write_eof()
        transport.resume_reading()  # uvicorn paused reading when the body it buffered passed its high-water mark
        self._linger_timer = self.loop.call_later(LINGER_S, transport.abort)

    def _refuse_connection(self) -> None:
        """Answer 503 naming the cap; linger in one of the ``linger_slots`` if one is free, else close at once (what
        the client had sent is read and dropped first, so that the close is a FIN rather than a reset): a descriptor
        is held past this call only within the slots (issue 49)."""
        self.connections.discard(self)
        body = _dumps({"detail": f"server busy: {self.max_connections} connections open, the cap (max_connections); "
                                 "retry later"}).encode()
        self.transport.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nretry-after: 1\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        if self._lingering[0] < self.linger_slots:
            self._lingering[0] += 1
            self._holds_slot = True
            self._linger()
        else:
            self._refused = True
            transport = self.transport._transport
            _drain(transport)
            transport.close()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._arm_write()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.cycle is None or self.cycle.response_complete:
            self._disarm_write()

    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
    _head_timer = None

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_expired)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        answered = self.conn.our_state in (h11.DONE, h11.MUST_CLOSE) and self.conn.their_state is h11.SEND_BODY
        if not self.transport.is_closing() and (self.conn.their_state is h11.IDLE or answered):
            if self.transport.get_write_buffer_size():  # it has not even read our last reply: close() would wait on it
                self.transport.abort()
            else:
                self.transport.close()

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(_LingeringTransport(transport, self))
        if len(self.connections) > self.max_connections:
            self._refuse_connection()
        else:
            self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        self._disarm_write()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        if self._holds_slot:
            self._holds_slot = False
            self._lingering[0] -= 1
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:  # answered 503 already: what it sends is dropped
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the request head is complete
            self._disarm()

    def handle_websocket_upgrade(self, event) -> None:
        """Hand the WebSocket protocol the real transport: through :class:`_LingeringTransport` its close became an HTTP
        lingering close (the upgrade request's h11 state is ``SEND_BODY``), a half-close after which the WebSocket
        could not answer the client's close frame (``Cannot call write() after write_eof()`` on every session at
        shutdown; issue 49)."""
        self._disarm()
        self.transport = self.transport._transport
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.flow.write_paused:
            self._disarm_write()
        if not self.transport.is_closing():
            self._arm()


def uvicorn_config(app, *, host: str = "127.0.0.1", port: int = 8000, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                   header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
                   max_connections: int = DEFAULT_MAX_CONNECTIONS, backlog: int = DEFAULT_BACKLOG,
                   fd_reserve: int = FD_RESERVE, ws_per_message_deflate: bool = False, log_level: str = "warning",
                   **kwargs):
    """The ``uvicorn.Config`` that serves ``app``: WebSocket messages capped at ``max_body_bytes``, the h11
    protocol with a ``header_timeout_s`` head deadline (:class:`_TimedH11Protocol`), HTTP and WebSocket connections
    dropped when a reply is not taken within ``send_timeout_s`` seconds of their send buffer filling up, and at most
    ``max_connections`` open connections (default :data:`DEFAULT_MAX_CONNECTIONS`, 256; one more is answered 503 and
    closed, lingering only within :data:`LINGER_SLOTS`) with a listen ``backlog`` (default :data:`DEFAULT_BACKLOG`).

    WebSocket compression (permessage-deflate, ``ws_per_message_deflate``) is off unless asked for, where uvicorn has
    it on: it compresses every message and decompresses every client's on the event loop -- CPU that delays every
    other connection, ``/health`` included (issue 49: the second most frequent stack of the loop's stalls over 50 ms at
    512 sessions with the adversaries, 36 of 150 samples) -- to save bytes of JSON that crosses loopback or a LAN.
    Turn it on (``--ws-compression``) for clients far away on a slow link.

    Keep-alive: an idle HTTP connection is closed ``header_timeout_s`` after its last response (the head deadline;
    uvicorn's own ``timeout_keep_alive`` is set to the same value, where its default of 5 s equals httpx's pool
    expiry: a client that read the last reply a moment late reused a connection the server was closing, and its next
    request failed with "Server disconnected without sending a response" -- an honest session of the 512-session
    benchmark, issue 49). Keep ``header_timeout_s`` above your clients' pool expiry (httpx: 5 s).

    File descriptors (:func:`envs.serving.descriptors.fit_descriptors`): the process's soft ``RLIMIT_NOFILE`` is raised
    to its hard limit, and where connections, backlog and lingering refusals would still not fit under it with a
    reserve of ``fd_reserve`` (default :data:`FD_RESERVE`, for grader workers and env files; ``python -m envs.serve
    --workers`` adds a socket per session), they are lowered to fit; a line on stderr says so. The event loop logs running out of
    descriptors once a minute, not once per failed ``accept``.

    Raises:
        ValueError: a non-positive timeout, ``max_connections`` or ``backlog`` < 1, or a descriptor limit under which not
            one connection fits.
    """
    for name, v in (("header_timeout_s", header_timeout_s), ("send_timeout_s", send_timeout_s),
                    ("max_connections", max_connections), ("backlog", backlog)):
        if v <= 0:
            raise ValueError(f"{name} must be > 0, got {v}")
    budget = fit_descriptors(int(max_connections), int(backlog), LINGER_SLOTS, reserve=int(fd_reserve))
    if budget.note:
        print(f"envs.serve: {budget.note}", file=sys.stderr, flush=True)
    timers = {"header_timeout_s": float(header_timeout_s), "send_timeout_s": float(send_timeout_s),
              "max_connections": budget.max_connections, "linger_slots": budget.linger_slots, "_lingering": [0]}
    http = type("TimedH11Protocol", (_TimedH11Protocol,), timers)
    ws = type("TimedWSProtocol", (_TimedWSProtocol,), {"send_timeout_s": float(send_timeout_s)})
    kwargs.setdefault("timeout_keep_alive", float(header_timeout_s))
    return uvicorn.Config(app, host=host, port=port, http=http, ws=ws, ws_max_size=max_body_bytes, log_level=log_level,
                          ws_per_message_deflate=ws_per_message_deflate, backlog=budget.backlog, **kwargs)
