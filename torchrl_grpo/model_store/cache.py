"""The on-disk model cache: layout, marker file, inter-process lock and atomic publication.

An alias is cached as a Hugging Face directory ``$TORCHRL_GRPO_CACHE/models/<alias>/`` (default
root ``~/.cache/torchrl_grpo``). A directory is trusted only when its marker file
(:data:`MARKER_FILE`) records the expected sha256 and ``config.json`` exists. Builders write into a
temporary directory, then :func:`_publish` writes the marker and renames it into place (atomic on
one file system), under :func:`_file_lock` so concurrent processes do not build an alias twice.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Iterator

__all__ = ["CACHE_ENV_VAR", "MARKER_FILE", "cache_root", "alias_cache_dir"]

CACHE_ENV_VAR = "TORCHRL_GRPO_CACHE"
MARKER_FILE = ".torchrl_grpo_model.json"


def cache_root() -> Path:
    """Root of the torchrl_grpo cache: ``$TORCHRL_GRPO_CACHE`` or ``~/.cache/torchrl_grpo``."""
    env = os.environ.get(CACHE_ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "torchrl_grpo"


def alias_cache_dir(alias: str) -> Path:
    """Directory holding the converted HF model of ``alias`` (it may not exist yet)."""
    return cache_root() / "models" / alias


def _read_marker(directory: Path) -> dict | None:
    try:
        return json.loads((directory / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None


def _is_cached(directory: Path, expected_sha: str) -> bool:
    marker = _read_marker(directory)
    return (
        marker is not None
        and marker.get("sha256") == expected_sha
        and (directory / "config.json").is_file()
    )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock so concurrent processes do not build the same alias twice."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _publish(tmp_dir: Path, final_dir: Path, marker: dict) -> None:
    """Write the marker into ``tmp_dir`` then atomically rename it to ``final_dir``."""
    (tmp_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True))
    for path in (tmp_dir, *tmp_dir.rglob("*")):  # the cache is shared: make it world-readable
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    if final_dir.exists():  # stale or forced rebuild: move aside, then delete
        trash = final_dir.with_name(f".trash-{final_dir.name}-{os.getpid()}-{time.time_ns()}")
        os.rename(final_dir, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(tmp_dir, final_dir)
