"""The bounds of :mod:`envs.serve`: every default (bytes, seconds, counts) and :func:`_check_bounds`, in
one place that every protocol module reads (see :mod:`envs.serve`, "Bounds")."""
from __future__ import annotations

#: Default limit on a request body / WebSocket message (bytes).
DEFAULT_MAX_BODY_BYTES = 1 << 20


#: Default cap on the bytes of request bodies being received or served at once, across all connections (a body over
#: :data:`SMALL_BODY_BYTES` is counted from its head -- its ``Content-Length``, or as it arrives when chunked -- until
#: the app has answered it; one that would go over the cap is refused, 503, before a byte of it is read).
DEFAULT_MAX_INFLIGHT_BODY_BYTES = 64 << 20


#: Bodies of at most this many bytes are not counted against ``max_inflight_body_bytes``: uvicorn buffers this much per
#: connection before it stops reading anyway, and the connection cap bounds their total, so held large bodies never
#: refuse an honest step (whose body is a few kB).
SMALL_BODY_BYTES = 64 * 1024


#: After this many bytes of counted bodies have been freed, the C allocator is asked to give its free memory back to the
#: system (glibc's ``malloc_trim``, in a worker thread; elsewhere nothing): glibc keeps freed body buffers in its
#: arenas, and 64 held 1 MiB bodies left the server +70 MB above its baseline after they closed (+3 MB with the trim).
TRIM_AFTER_FREED_BYTES = 32 << 20


#: Default cap on open connections (HTTP and WebSocket, counted by uvicorn); one more is answered 503 and closed.
DEFAULT_MAX_CONNECTIONS = 256


#: Seconds a connection closed while its client may still be sending stays half-closed (its reply sent, then FIN;
#: what it sends read and dropped) before it is aborted -- a lingering close, as nginx's ``lingering_time``: one
#: refused at the connection cap (503), one answered 413 over ``max_body_bytes`` or 408 with its body still on the
#: way. Closing at once leaves unread bytes in the socket, which the kernel answers with a reset that can destroy the
#: reply before the client reads it.
LINGER_S = 2.0


#: Most connections refused at the connection cap that linger at once (answered 503, then half-closed for
#: :data:`LINGER_S`); a refusal past them is answered 503 and closed at once (what the client had sent read and dropped
#: first, so the close is a FIN, not a reset). Each lingering one holds a descriptor (issue 49: uncounted, they took a
#: server to its descriptor limit).
LINGER_SLOTS = 32


#: Default listen backlog: connections the kernel queues before the server accepts them, and the most asyncio accepts
#: in one wake-up -- each a descriptor before its protocol runs (uvicorn's own default, 2048, is two 1024 limits).
DEFAULT_BACKLOG = 128


#: Descriptors kept free for what the server opens besides connections: grader workers' pipes, env data files, logs
#: (:func:`envs.serving.descriptors.fit_descriptors`).
FD_RESERVE = 64


#: Default limit on one session's conversation (UTF-8 JSON bytes of its messages and actions).
DEFAULT_MAX_SESSION_BYTES = 8 << 20


#: Default seconds a client has to send a request's headers / its body.
DEFAULT_HEADER_TIMEOUT_S = 10.0


DEFAULT_BODY_TIMEOUT_S = 30.0


#: Default seconds a reply may take to reach the client once the connection's send buffer is full (then the connection
#: is dropped: a client that does not read holds nothing past this).
DEFAULT_SEND_TIMEOUT_S = 30.0


#: Deepest nesting of ``[``/``{`` a request body / WebSocket message may hold (checked before parsing, in linear time).
MAX_JSON_NESTING = 100


#: Most arrays + objects a request body / WebSocket message may hold (counted by the same linear scan as the nesting,
#: before parsing): 1 MiB of ``[{},{},...]`` under every other limit was ~24 MiB of Python objects once parsed; this
#: many empty objects are ~7 MB (the client's ``ClientBounds.max_json_containers`` is the same number).
MAX_JSON_CONTAINERS = 100_000


#: Most digits an integer literal in a request body / WebSocket message may have.
MAX_JSON_INT_DIGITS = 100


#: An HTTP reply is handed to the connection in pieces of this many bytes, so that an unread reply waits in the app
#: (where it is counted against its session) rather than in the transport's buffer.
REPLY_CHUNK_BYTES = 256 * 1024


#: Threads of the pool where request bodies are parsed and replies encoded off the event loop
#: (:func:`envs.serving.offload.off_loop`): few, so that the event loop shares the GIL with few busy threads.
PARSE_THREADS = 2


#: Niceness the sessions' work runs at above the server's event loop (``python -m envs.serve --session-nice``): each
#: session's thread and each worker process (:mod:`envs.serving.session_threads`, :mod:`envs.serving.workers`), so
#: that ``/health`` and admission are answered first when the cores are busy (issue 49's load target).
DEFAULT_SESSION_NICE = 10


#: Longest ``episode_id`` accepted by ``reset``.
MAX_EPISODE_ID_CHARS = 256


#: ``Host`` names always served (loopback).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _check_bounds(max_sessions: int, idle_timeout_s: float | None, max_body_bytes: int, body_timeout_s: float,
                  max_session_bytes: int | None) -> None:
    """:func:`build_app`'s bounds checked before anything is built.

    Raises:
        ValueError: ``max_sessions`` < 1, or a non-positive ``idle_timeout_s`` (``None`` allowed: never),
            ``max_body_bytes``, ``body_timeout_s`` or ``max_session_bytes`` (``None`` allowed: none); the message names
            the argument.
    """
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
    if idle_timeout_s is not None and idle_timeout_s <= 0:
        raise ValueError(f"idle_timeout_s must be > 0 or None, got {idle_timeout_s}")
    for name, v in (("max_body_bytes", max_body_bytes), ("body_timeout_s", body_timeout_s),
                    ("max_session_bytes", 1 if max_session_bytes is None else max_session_bytes)):
        if v <= 0:
            raise ValueError(f"{name} must be > 0, got {v}")
