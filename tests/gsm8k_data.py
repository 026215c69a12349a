"""Where the tests find GSM8K data: ``$GSM8K_DATA_DIR`` when it holds both splits, else the copy shipped in the
package (``envs/gsm8k/data``), so no test skips for missing data in a fresh clone."""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from envs.gsm8k.data import PACKAGED_DATA_DIR

SHARED_GSM8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"


def _has_split(path: Path, split: str) -> bool:
    return (path / f"{split}.jsonl").is_file() or (path / f"{split}.jsonl.gz").is_file()


def _data_dir() -> Path:
    env = os.environ.get("GSM8K_DATA_DIR")
    if env and all(_has_split(Path(env), s) for s in ("train", "test")):
        return Path(env)
    return PACKAGED_DATA_DIR


def open_split(split: str):
    """The text lines of ``DATA_DIR``'s ``{split}.jsonl`` (or ``.jsonl.gz``), as an open text file."""
    plain = DATA_DIR / f"{split}.jsonl"
    if plain.is_file():
        return open(plain, encoding="utf-8")
    return gzip.open(DATA_DIR / f"{split}.jsonl.gz", "rt", encoding="utf-8")


DATA_DIR = _data_dir()
#: Kept for the tests that use it: with the packaged copy the data is always there, so this never skips.
needs_data = pytest.mark.skipif(not all(_has_split(DATA_DIR, s) for s in ("train", "test")),
                                reason="GSM8K data missing (the packaged envs/gsm8k/data was removed?)")
