"""Where the tests find real GSM8K data: ``$GSM8K_DATA_DIR``, else ``../shared/data/gsm8k`` beside the repo."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_GSM8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"


def _data_dir() -> Path | None:
    env = os.environ.get("GSM8K_DATA_DIR")
    path = Path(env) if env else SHARED_GSM8K
    return path if (path / "train.jsonl").is_file() and (path / "test.jsonl").is_file() else None


DATA_DIR = _data_dir()
needs_data = pytest.mark.skipif(DATA_DIR is None, reason="GSM8K data not found (GSM8K_DATA_DIR)")
