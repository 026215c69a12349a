"""Metrics sink: console lines, ``metrics.jsonl`` (one JSON object per step), Weights & Biases, and
``samples.jsonl`` / ``eval_episodes.jsonl`` (decoded episodes per step).

Resuming into the same run dir (:meth:`StatsLogger.rewind`): the rows a checkpoint does not cover (``step`` after
the checkpoint's) are cut from each log first, atomically (:func:`truncate_jsonl`), so the resumed run's rows follow
the checkpoint's without duplicates (a curve plotted x = 1, 2, 3, 3, 4 before).

wandb runs ``offline`` by default (no account or network needed; ``wandb sync`` uploads later); ``disabled``
turns it off; ``online`` needs ``WANDB_API_KEY``. A wandb failure is logged and the run goes on with the
other sinks: metrics are never lost because a dashboard is unreachable.
"""
from __future__ import annotations

import json
import logging
import math
import os
import uuid
from pathlib import Path
from typing import Any

#: Accepted ``wandb_mode=`` values (config ``stats_logger.wandb.mode``), defined once in the config.
from torchrl_grpo.config.choices import WANDB_MODES

__all__ = ["StatsLogger", "WANDB_MODES", "RUN_LOGS", "truncate_jsonl"]

#: the step-indexed logs a run dir holds (each row has ``step``); what :meth:`StatsLogger.rewind` cuts
RUN_LOGS = ("metrics.jsonl", "samples.jsonl", "eval_episodes.jsonl")

log = logging.getLogger(__name__)


def _clean(v: Any) -> Any:
    if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN; None marks "not computed"
    return v


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover  (a platform that cannot open directories)
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


def truncate_jsonl(path: str | os.PathLike, step: int) -> int:
    """Keep the rows of the JSON-lines log ``path`` whose ``step`` is ``<= step``, atomically: the kept rows are
    written to a temporary file in the same directory, fsynced and renamed over ``path``, so a crash leaves either
    the old or the new file, never a half-written one. Rows are kept in their order and byte for byte. A row that is
    not a JSON object with an integer ``step`` (a line torn by a killed write) is dropped. Nothing is written when
    every row is kept or ``path`` does not exist.

    Args:
        path: a ``*.jsonl`` log (``metrics.jsonl``, ``samples.jsonl``, ``eval_episodes.jsonl``).
        step: the last step kept (a checkpoint's step, >= 0).

    Returns:
        The number of rows dropped.

    Raises:
        OSError: the file could not be read or replaced (it is then unchanged).
    """
    path = Path(path)
    if not path.is_file():
        return 0
    kept: list[bytes] = []
    dropped = 0
    with open(path, "rb") as fh:
        for line in fh:
            try:
                row_step = json.loads(line).get("step")
            except (ValueError, AttributeError):  # torn or foreign line
                row_step = None
            if isinstance(row_step, int) and not isinstance(row_step, bool) and row_step <= step:
                kept.append(line if line.endswith(b"\n") else line + b"\n")
            else:
                dropped += 1
    if not dropped:
        return 0
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.writelines(kept)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return dropped


class StatsLogger:
    """Writes metrics dicts to console, ``<run_dir>/metrics.jsonl`` and wandb.

    Args:
        run_dir: run output directory (created if missing).
        config: resolved config as a plain dict (sent to wandb).
        wandb_mode: one of :data:`WANDB_MODES`: ``online`` | ``offline`` | ``disabled``.
        console: print one compact line per step.

    Raises:
        ValueError: ``wandb_mode`` not in :data:`WANDB_MODES`.
    """

    def __init__(self, run_dir: str | os.PathLike, config: dict | None = None, *, wandb_mode: str = "offline",
                 project: str = "torchrl-grpo", entity: str | None = None, name: str | None = None,
                 console: bool = True, resume: bool = False) -> None:
        if wandb_mode not in WANDB_MODES:
            raise ValueError(f"wandb_mode must be one of {WANDB_MODES}, got {wandb_mode!r}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._fh = open(self.path, "a", encoding="utf-8")
        self.console = console
        self._wandb = None
        if wandb_mode != "disabled":
            try:
                import wandb

                os.environ.setdefault("WANDB_SILENT", "true")
                self._wandb = wandb.init(
                    project=project, entity=entity, name=name, config=config, mode=wandb_mode,
                    dir=str(self.run_dir), resume="allow" if resume else None, reinit="finish_previous",
                )
            except Exception as exc:  # dashboards are optional; metrics.jsonl still has everything
                log.warning("wandb disabled: %s: %s", type(exc).__name__, exc)
                self._wandb = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(row, default=str) + "\n")
        self._fh.flush()
        if self._wandb is not None:
            try:
                self._wandb.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=step)
            except Exception as exc:
                log.warning("wandb.log failed: %s", exc)
        if self.console:
            keys = [k for k in ("reward/mean", "eval/accuracy", "loss/total", "ess", "clip_fraction", "kl_ref",
                                "entropy", "rollout/tokens_per_s", "time/step_s") if row.get(k) is not None]
            log.info("step %d | %s", step, " ".join(f"{k}={row[k]:.4g}" for k in keys))

    def rewind(self, step: int) -> dict[str, int]:
        """Resuming from a checkpoint of ``step`` into this run dir: cut the rows after ``step`` from each of
        :data:`RUN_LOGS` (:func:`truncate_jsonl`, atomic), so the resumed run's rows follow the checkpoint's instead
        of repeating steps. Call it before the resumed run logs anything. Returns the rows dropped per file (files
        with none left out); logs a warning naming them."""
        self._fh.close()
        try:
            dropped = {name: n for name in RUN_LOGS if (n := truncate_jsonl(self.run_dir / name, step))}
        finally:
            self._fh = open(self.path, "a", encoding="utf-8")
        if dropped:
            log.warning("resumed at step %d: dropped the rows after it from %s", step,
                        ", ".join(f"{k} ({v})" for k, v in dropped.items()))
        return dropped

    def log_images(self, images: dict[str, str | os.PathLike], step: int) -> None:
        """Send image files (PNG plots) to wandb under the given keys; nothing without wandb, and a failure is logged,
        never raised."""
        if self._wandb is None or not images:
            return
        try:
            import wandb

            self._wandb.log({k: wandb.Image(str(p)) for k, p in images.items()}, step=step)
        except Exception as exc:
            log.warning("wandb image upload failed: %s", exc)

    def log_samples(self, samples: list[dict[str, Any]], step: int, name: str = "samples.jsonl") -> None:
        """Append episodes (decoded text and reward; evaluation rows: ``name="eval_episodes.jsonl"``) to
        ``<run_dir>/<name>``, one JSON object per episode with ``step``."""
        if not samples:
            return
        with open(self.run_dir / name, "a", encoding="utf-8") as fh:
            for s in samples:
                fh.write(json.dumps({"step": step, **{k: _clean(v) for k, v in s.items()}}, default=str) + "\n")

    def close(self) -> None:
        self._fh.close()
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception:  # pragma: no cover
                pass
