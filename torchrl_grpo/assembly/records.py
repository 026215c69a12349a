"""Phase 2 of :func:`torchrl_grpo.assembly.build`: the run directory and what it records before any model loads.

:func:`prepare_run`: this rank's run dir, ``plan.json`` (rank 0), the seeds (``seed``), and the data checked
(:func:`torchrl_grpo.assembly.environments.check_data`) with its sources in ``data_sources.json``. ``model_source.json`` is
written when the model loads (:func:`torchrl_grpo.assembly.policy.build_policy`).
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from torchrl_grpo.assembly.devices import Devices
from torchrl_grpo.assembly.environments import check_data
from torchrl_grpo.distributed.data_parallel import DataParallel
from torchrl_grpo.seeding import seed_everything

__all__ = ["prepare_run", "rank_run_dir", "write_plan"]


def rank_run_dir(dp: DataParallel, run_dir: str | Path) -> Path:
    """Rank 0's run dir on rank 0; a throwaway dir on other ranks (whatever they would write, e.g. the data and
    model sources, stays out of the run's files; their checkpoints and metrics are not written at all). Created."""
    out = Path(run_dir) if dp.is_main else Path(tempfile.mkdtemp(prefix=f"grpo-rank{dp.rank}-"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_plan(run_dir: Path, devices: Devices) -> None:
    """``plan.json``: the resolved device plan and this process's applied placement (rank 0 only)."""
    if devices.dp.is_main:
        (run_dir / "plan.json").write_text(json.dumps({**devices.plan.to_dict(),
                                                       "applied": devices.placement.to_dict()}, indent=1) + "\n")


def prepare_run(cfg, run_dir: str | Path, devices: Devices) -> Path:
    """The run dir (:func:`rank_run_dir`) with ``plan.json``; then the seeds (before the model loads, so its init
    and everything after is reproducible); then the data checked (before the model loads: a bad path fails in a
    second) and its sources written to ``data_sources.json`` (``.hydra/config.yaml`` keeps the unresolved path: null
    means ``$GSM8K_DATA_DIR``, else the packaged copy). Returns this rank's run dir.

    Raises:
        FileNotFoundError / ValueError: missing or malformed data (:func:`torchrl_grpo.assembly.environments.check_data`).
    """
    run_dir = rank_run_dir(devices.dp, run_dir)
    write_plan(run_dir, devices)
    seed_everything(cfg.seed)
    sources = check_data(cfg)
    if sources:
        (run_dir / "data_sources.json").write_text(json.dumps(sources, indent=1) + "\n")
    return run_dir
