"""Reading the JSON-lines data files of the envs (plain ``.jsonl`` or gzipped ``.jsonl.gz``), with errors that name
the line."""
from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["iter_jsonl"]


def iter_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield ``("<path>:<line>", decoded row)`` for each non-blank line of ``path`` (gzip when it ends in ``.gz``).

    Raises:
        ValueError: a line that is not valid JSON, naming ``<path>:<line>``.
        OSError: the file cannot be read.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: malformed JSON line ({err.msg})") from None
            yield f"{path}:{lineno}", row
