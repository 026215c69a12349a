"""The server's file descriptors (issue 49): a budget that the connection cap fits in, the soft ``RLIMIT_NOFILE``
raised at start-up where the hard limit allows, and one log line (not thousands) when the process runs out anyway.

What holds a descriptor: every open connection (HTTP and WebSocket: ``max_connections``), every connection refused at
the cap while it lingers (:data:`~envs.serving.limits.LINGER_SLOTS` at most; the others are closed at once), every
socket accepted in one burst before its protocol runs (at most the listen ``backlog``: asyncio accepts up to that many
per wake-up), and what the process holds besides (the listening socket, the event loops, grader workers' pipes, env
data files: what is open at start-up plus :data:`~envs.serving.limits.FD_RESERVE`). :func:`fit_descriptors` makes the
sum fit under the soft limit; before issue 49 refused connections were not counted while they lingered (2 s each), one
local client reached the common 1024 limit, the server logged "Too many open files" 3,424 times and ``/health`` timed
out.
"""
from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import sys
import time

try:
    import resource
except ImportError:  # pragma: no cover - not Unix: no limit to read or raise
    resource = None

from envs.serving.limits import FD_RESERVE

__all__ = ["DescriptorBudget", "fit_descriptors", "install_accept_error_log", "open_descriptors"]

#: asyncio's message when ``accept()`` fails for want of a resource (``EMFILE``, ``ENFILE``, ``ENOBUFS``, ``ENOMEM``).
_ACCEPT_MESSAGE = "socket.accept() out of system resource"
#: Seconds between two log lines about descriptors running out (the first is logged at once).
_LOG_EVERY_S = 60.0


@dataclasses.dataclass(frozen=True)
class DescriptorBudget:
    """What :func:`fit_descriptors` settled on: the connection cap, the listen backlog and the lingering refusals that
    fit under ``soft_limit`` (the soft ``RLIMIT_NOFILE`` after raising it; ``None``: no limit known), and ``note``: why
    anything was lowered (empty when nothing was)."""

    max_connections: int
    backlog: int
    linger_slots: int
    soft_limit: int | None
    note: str = ""


def open_descriptors() -> int:
    """How many descriptors this process holds now (``/proc/self/fd``; 32 where that cannot be read)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # the listing's own
    except OSError:
        return 32


def _raise_soft_limit() -> int | None:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (to 2**20, else 2**16, when the hard one is unlimited) where
    allowed; the soft limit after (``None``: no limit, or not Unix)."""
    if resource is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    for target in ([hard] if hard != resource.RLIM_INFINITY else [1 << 20, 1 << 16]):  # nr_open may be below 2**20
        if target <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fit_descriptors(max_connections: int, backlog: int, linger_slots: int, *, reserve: int = FD_RESERVE,
                    raise_limit: bool = True) -> DescriptorBudget:
    """Fit the connection cap under this process's descriptor limit.

    The soft ``RLIMIT_NOFILE`` is first raised to the hard limit (``raise_limit``). Then, when what is open now plus
    ``reserve`` plus ``max_connections + backlog + linger_slots`` is over the soft limit, the backlog and the lingering
    refusals are cut to an eighth of the room each (at least 16 and 0), and the connection cap to what is left.

    Args:
        max_connections: the cap asked for (open HTTP and WebSocket connections).
        backlog: the listen backlog asked for (sockets accepted in one burst).
        linger_slots: refused connections that may linger at once (:data:`~envs.serving.limits.LINGER_SLOTS`).
        reserve: descriptors kept for everything else the process opens later (grader workers, env files).

    Returns:
        A :class:`DescriptorBudget`; its ``note`` says what was lowered and why.

    Raises:
        ValueError: not even one connection fits (the message names the limit and what is open).
    """
    if raise_limit:
        soft = _raise_soft_limit()
    else:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if resource is not None else None
        soft = None if resource is not None and soft == resource.RLIM_INFINITY else soft
    if soft is None:
        return DescriptorBudget(max_connections, backlog, linger_slots, None)
    held = open_descriptors()
    room = soft - held - reserve
    if room >= max_connections + backlog + linger_slots:
        return DescriptorBudget(max_connections, backlog, linger_slots, soft)
    backlog2 = min(backlog, max(16, room // 8))
    linger2 = min(linger_slots, max(0, room // 8))
    conns = min(max_connections, room - backlog2 - linger2)
    if conns < 1:
        raise ValueError(f"not one connection fits in the file descriptor limit: RLIMIT_NOFILE soft {soft} (hard limit "
                         f"reached), {held} open, {reserve} kept for grader workers and env files; raise the hard limit "
                         "(ulimit -Hn)")
    note = (f"max_connections {max_connections} -> {conns}, backlog {backlog} -> {backlog2}, lingering refusals "
            f"{linger_slots} -> {linger2}: RLIMIT_NOFILE is {soft} (the hard limit), {held} descriptors are open and "
            f"{reserve} are kept for grader workers and env files; raise the hard limit (ulimit -Hn) to serve more")
    return DescriptorBudget(conns, backlog2, linger2, soft, note)


def install_accept_error_log(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop`` log running out of descriptors in ``accept()`` once a minute (with a count) instead of once per
    failed ``accept`` -- asyncio tries up to ``backlog`` accepts per wake-up and logs each failure, 3,424 lines in the
    issue's run; every other error goes to the handler that was there."""
    previous = loop.get_exception_handler()
    state = {"count": 0, "last": -_LOG_EVERY_S}

    def handler(lp: asyncio.AbstractEventLoop, context: dict) -> None:
        exc = context.get("exception")
        if context.get("message") == _ACCEPT_MESSAGE and isinstance(exc, OSError) and \
                exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            state["count"] += 1
            now = time.monotonic()
            if now - state["last"] >= _LOG_EVERY_S:
                state["last"] = now
                print(f"envs.serve: accept() failed: {exc.strerror} ({state['count']} time(s) so far; logged at most "
                      f"once a minute); new connections wait in the listen queue meanwhile", file=sys.stderr, flush=True)
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)
