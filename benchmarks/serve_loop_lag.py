"""``python -m envs.serve`` with its event loop watched: how late the loop runs what it is handed, and what it was doing.

Usage (what ``benchmarks/openenv_serve_load.py --server-lag`` starts in place of ``python -m envs.serve``)::

    python benchmarks/serve_loop_lag.py OUT.json ENV_ID [python -m envs.serve's arguments]

Once the server's sockets are bound, a watchdog thread hands the event loop a callback every :data:`TICK_S` and
measures how long it took to run (``ack``: the wait for the GIL plus whatever the loop was running; what a ``/health``
request waits before the loop reads it). While a callback is late by more than :data:`STALL_S`, the thread samples the
loop thread's stack every :data:`TICK_S` (its innermost :data:`FRAMES` frames, ``file:function:line``): a stack inside
the selector means the loop was idle and waiting for the GIL or a CPU; anything else is what the loop itself ran.
Every few seconds and at exit, ``OUT.json`` is rewritten: ``{"acks": [[unix time, seconds], ...], "stalls": [[unix
time, stack], ...], "cpu": [[unix time, loop thread CPU s, process CPU s], ...], "threads": n}`` (CPU time from
``/proc``, once a second: the loop thread's and the whole server process's, not its workers').

Sampling needs the GIL too, so a stack is where the loop thread was when the watchdog got it: a measure of where the
loop's time goes, not an exact profile.
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import envs.serve as serve  # the package is installed (README's set-up): no sys.path edit (tests/test_no_sys_path_edits.py)

#: Seconds between the watchdog's callbacks (and between its stack samples during a stall).
TICK_S = 0.01
#: A callback later than this is a stall: the loop thread's stack is sampled.
STALL_S = 0.05
#: Innermost frames kept per stack sample.
FRAMES = 4
#: Most samples kept (about 10 minutes of acks at :data:`TICK_S`).
MAX_SAMPLES = 60_000


def _cpu_s(path: str) -> float:
    """utime + stime of a ``/proc/.../stat`` file, in seconds."""
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Watchdog:
    """The watchdog thread of one event loop (see the module docstring); :meth:`dump` writes what it saw."""

    def __init__(self, loop, out: Path):
        self.loop, self.out = loop, out
        self.loop_thread = threading.get_ident()
        self.loop_native = threading.get_native_id()
        self.acks: list[list[float]] = []
        self.stalls: list[list] = []
        self.cpu: list[list[float]] = []  # [unix time, loop thread CPU s, process CPU s], once a second
        threading.Thread(target=self._run, name="loop-watchdog", daemon=True).start()

    def _stack(self) -> str:
        # sys._current_frames() holds the interpreter's thread-list lock while it builds its dict; a garbage collection
        # started there ran a finalizer (an unclosed transport's __del__), which handed the GIL to a thread that then
        # waited for that lock to start a thread, and the whole server hung (CPython 3.11.7, a 512-session run of
        # openenv_serve_load.py, 2026-12-06). So no automatic collection while it runs.
        enabled = gc.isenabled()
        gc.disable()
        try:
            frame = sys._current_frames().get(self.loop_thread)
        finally:
            if enabled:
                gc.enable()
        if frame is None:
            return "?"
        return " < ".join(f"{Path(f.filename).name}:{f.name}:{f.lineno}"
                          for f in reversed(traceback.extract_stack(frame)[-FRAMES:]))

    def _cpu(self) -> list[float]:
        pid = os.getpid()
        return [time.time(), _cpu_s(f"/proc/{pid}/task/{self.loop_native}/stat"), _cpu_s(f"/proc/{pid}/stat")]

    def _run(self) -> None:
        last_dump = last_cpu = time.monotonic()
        while True:
            if time.monotonic() - last_cpu >= 1 and len(self.cpu) < MAX_SAMPLES:
                self.cpu.append(self._cpu())
                last_cpu = time.monotonic()
            done = threading.Event()
            t0 = time.perf_counter()
            self.loop.call_soon_threadsafe(done.set)
            while not done.wait(TICK_S):
                if time.perf_counter() - t0 > STALL_S and len(self.stalls) < MAX_SAMPLES:
                    self.stalls.append([time.time(), self._stack()])
            if len(self.acks) < MAX_SAMPLES:
                self.acks.append([time.time(), time.perf_counter() - t0])
            if time.monotonic() - last_dump > 5:
                self.dump()
                last_dump = time.monotonic()
            time.sleep(TICK_S)

    def dump(self) -> None:
        rep = {"acks": list(self.acks), "stalls": list(self.stalls), "cpu": list(self.cpu) + [self._cpu()],
               "threads": threading.active_count()}
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(rep))
        tmp.replace(self.out)


def main(argv: list[str]) -> None:
    out, args = Path(argv[0]), argv[1:]
    startup = serve._Server.startup
    watchdog: list[Watchdog] = []

    async def watched_startup(self, sockets=None) -> None:
        await startup(self, sockets=sockets)
        watchdog.append(Watchdog(asyncio.get_running_loop(), out))

    serve._Server.startup = watched_startup
    try:
        serve.main(args)
    finally:
        if watchdog:
            watchdog[0].dump()


if __name__ == "__main__":
    main(sys.argv[1:])
