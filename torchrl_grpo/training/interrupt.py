r"""Clean stop on SIGINT (Ctrl-C) and SIGTERM (``kill``, job schedulers): signals become :class:`TrainingInterrupted`.

A training step changes the weights, the optimizer and scheduler states and the step counter one after the other;
stopped in between, they disagree and no checkpoint can describe them. So, inside :func:`finish_step` (one
iteration of :meth:`~torchrl_grpo.training.grpo_trainer.GRPOTrainer.fit`):

==================  =============================================================================================
first signal        recorded; the step runs to its end (update, log, periodic checkpoint), then
                    ``TrainingInterrupted(mid_step=False)`` is raised: the state is that of a completed step, and
                    ``fit`` saves it (``checkpoint.on_interrupt``)
second signal       raised at once, ``mid_step=True``: the step in flight is abandoned and not saved
==================  =============================================================================================

Outside a step (model loading, evaluation, closing) a signal is raised at once (``mid_step=False``). Code that may
wait long at a point where a step has not touched the model yet (the async trainer waiting for a batch) calls
:func:`check` to stop there at once. Entry points exit with ``128 + signal number`` (130 for SIGINT, 143 for SIGTERM,
the shell's convention), see :func:`exit_code`.

Handlers are installed by :func:`handle_signals` in the main thread only (Python delivers signals there); the
rollout thread of the async trainer never sees the exception, it is stopped and joined by ``close()``.
"""
from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["TrainingInterrupted", "check", "exit_code", "finish_step", "handle_signals"]

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_requested: int | None = None  # signal received inside finish_step, raised when the step ends
_step_depth = 0  # > 0 while inside finish_step


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on a signal (a ``KeyboardInterrupt``, so ``except Exception`` does not swallow it).

    Attributes:
        signum: the signal number (``signal.SIGINT`` = 2, ``signal.SIGTERM`` = 15).
        mid_step: True when raised inside a training step (a second signal): the weights may be half-updated.
        exit_code: ``128 + signum``, the process exit status the entry points use.
    """

    def __init__(self, signum: int, *, mid_step: bool) -> None:
        self.signum = int(signum)
        self.mid_step = mid_step
        self.exit_code = 128 + self.signum
        super().__init__(f"training interrupted by {signal.Signals(self.signum).name}"
                         + (" in the middle of a step" if mid_step else ""))


def _handler(signum: int, frame) -> None:
    global _requested
    if _step_depth and _requested is None:
        _requested = signum
        log.warning("%s received: stopping after the current step (send it again to stop at once, without saving "
                    "the step in flight)", signal.Signals(signum).name)
        return
    raise TrainingInterrupted(signum, mid_step=bool(_step_depth))


@contextmanager
def handle_signals() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into :class:`TrainingInterrupted` while the block runs, then restore the previous
    handlers. A no-op outside the main thread and when already active (nested use keeps the outer one)."""
    global _requested
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is _handler:
        yield
        return
    _requested = None
    previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _requested = None


@contextmanager
def finish_step() -> Iterator[None]:
    """Mark one training step: a first signal inside it is held until the block ends, then raised.

    Raises:
        TrainingInterrupted: at the end of the block (``mid_step=False``) if a signal arrived during it; at once
            (``mid_step=True``) on a second signal.
    """
    global _step_depth
    _step_depth += 1
    try:
        yield
    finally:
        _step_depth -= 1
    check()


def check() -> None:
    """Raise a held signal now (``mid_step=False``: call it only where the model is in a completed step's state).

    Raises:
        TrainingInterrupted: a signal was received inside :func:`finish_step` and not raised yet.
    """
    global _requested
    signum, _requested = _requested, None
    if signum is not None:
        raise TrainingInterrupted(signum, mid_step=False)


def exit_code(main: Callable[[], object]) -> int:
    """Run a command-line ``main``; returns 0, or ``128 + signum`` when training was interrupted by a signal."""
    try:
        main()
    except TrainingInterrupted as e:
        log.warning("%s: exiting with status %d", e, e.exit_code)
        return e.exit_code
    return 0
