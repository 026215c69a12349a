"""Switch for tau2's loguru output.

tau2 logs through loguru at DEBUG/INFO level on every tool call (about 35 KB of text per
environment step with the default sink), which costs time and floods the console. The
environments of this package call :func:`set_tau2_logging` with ``enabled=False`` before tau2 is
imported, unless the environment variable ``TAU2_LOG`` is set to ``1``/``true``/``yes``.

Loguru filters by module name prefix, so disabling ``"tau2"`` silences every ``tau2.*`` module
without touching other loguru users.
"""
from __future__ import annotations

import os

from loguru import logger

__all__ = ["set_tau2_logging", "tau2_logging_default"]


def tau2_logging_default() -> bool:
    """Whether tau2 logging is on by default: ``True`` iff ``$TAU2_LOG`` is ``1``/``true``/``yes``."""
    return os.environ.get("TAU2_LOG", "").strip().lower() in {"1", "true", "yes", "on"}


def set_tau2_logging(enabled: bool) -> None:
    """Enable or disable loguru records emitted by the ``tau2`` package (process-wide).

    Args:
        enabled: ``True`` to let tau2's records through to loguru's sinks, ``False`` to drop them.
    """
    if enabled:
        logger.enable("tau2")
    else:
        logger.disable("tau2")
