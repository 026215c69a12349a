"""Metrics sink: console lines, ``metrics.jsonl`` (one JSON object per step), Weights & Biases, and
``samples.jsonl`` (decoded example episodes per step).

wandb runs ``offline`` by default (no account or network needed; ``wandb sync`` uploads later); ``disabled``
turns it off; ``online`` needs ``WANDB_API_KEY``. A wandb failure is logged and the run goes on with the
other sinks: metrics are never lost because a dashboard is unreachable.
"""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

#: Accepted ``wandb_mode=`` values (config ``stats_logger.wandb.mode``), defined once in the config.
from torchrl_grpo.config.choices import WANDB_MODES

__all__ = ["StatsLogger", "WANDB_MODES"]

log = logging.getLogger(__name__)


def _clean(v: Any) -> Any:
    if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN; None marks "not computed"
    return v


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
