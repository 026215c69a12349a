"""``benchmarks/serve_loop_lag.py``'s watchdog samples the loop thread's stack with ``sys._current_frames()``, which
holds the interpreter's thread-list lock while it runs; a garbage collection started inside it ran a finalizer that
handed the GIL to a thread starting another thread (which needs that lock): the server under ``--server-lag`` hung
in a 512-session run. The sample is taken with automatic collection off, and collection is back on afterwards."""
from __future__ import annotations

import gc
import importlib.util
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="serve_loop_lag imports envs.serve (the [serve] extra)")

_spec = importlib.util.spec_from_file_location(
    "serve_loop_lag", Path(__file__).resolve().parents[1] / "benchmarks" / "serve_loop_lag.py")
lag = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lag)


def test_the_stack_sample_runs_with_automatic_gc_off(monkeypatch):
    seen = []
    real = sys._current_frames

    def frames():
        seen.append(gc.isenabled())
        return real()

    monkeypatch.setattr(sys, "_current_frames", frames)
    dog = lag.Watchdog.__new__(lag.Watchdog)  # not started: only its sampling is tested
    dog.loop_thread = threading.get_ident()
    assert gc.isenabled()
    stack = dog._stack()
    assert seen == [False], "sys._current_frames() ran with automatic garbage collection on"
    assert gc.isenabled(), "garbage collection was left off"
    assert "test_serve_loop_lag.py" in stack
    gc.disable()
    try:
        dog._stack()
        assert not gc.isenabled(), "a caller's gc.disable() was undone"
    finally:
        gc.enable()
