"""Loading GSM8K problems (Cobbe et al., 2021, arXiv:2110.14168).

Two sources:

* a local directory holding ``train.jsonl`` and ``test.jsonl``, one JSON object per line with the
  dataset's fields ``question`` and ``answer`` (the reference solution, ending in ``#### N``);
  this is the layout of the official repository ``openai/grade-school-math`` (its
  ``grade_school_math/data`` folder), the usual value of ``$GSM8K_DATA_DIR``;
* a Hugging Face ``datasets`` id such as ``"openai/gsm8k"`` (config ``"main"``), used when
  ``data_dir`` is not an existing directory and looks like a hub id (needs the optional
  ``datasets`` package and network or a local HF cache).

Each problem becomes ``{"question": str, "answer": str, "solution": str}`` where ``answer`` is the
gold final number normalized by :func:`envs.gsm8k.grading.parse_gold` (``"#### 1,200"`` →
``"1200"``) and ``solution`` is the full reference text.
"""
from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

from .grading import parse_gold

__all__ = ["load_gsm8k", "resolve_data_dir", "SPLITS", "DATA_DIR_ENV"]

#: Environment variable naming the default data directory (or HF dataset id).
DATA_DIR_ENV = "GSM8K_DATA_DIR"
#: The splits GSM8K ships with.
SPLITS = ("train", "test")

_CACHE: dict[tuple[str, str], tuple[dict, ...]] = {}
_LOCK = threading.Lock()
_HF_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> str:
    """The data source to use: ``data_dir`` if given, else ``$GSM8K_DATA_DIR``.

    Raises:
        FileNotFoundError: neither is set.
    """
    if data_dir is None:
        data_dir = os.environ.get(DATA_DIR_ENV)
        if not data_dir:
            raise FileNotFoundError(
                "No GSM8K data location: pass data_dir=<folder with train.jsonl/test.jsonl> "
                f"(or an HF dataset id such as 'openai/gsm8k'), or set {DATA_DIR_ENV}."
            )
    return os.fspath(data_dir)


def _row_to_problem(row: dict, where: str) -> dict:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [k for k in ("question", "answer") if not isinstance(row.get(k), str)]
    if missing:
        raise ValueError(f"{where}: missing or non-string field(s) {missing}")
    try:
        gold = parse_gold(row["answer"])
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return {"question": row["question"], "answer": gold, "solution": row["answer"]}


def _load_jsonl(path: Path) -> tuple[dict, ...]:
    problems = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: malformed JSON line ({err.msg})") from None
            problems.append(_row_to_problem(row, f"{path}:{lineno}"))
    if not problems:
        raise ValueError(f"{path}: no problems in file")
    return tuple(problems)


def _load_hf(dataset_id: str, split: str, config: str) -> tuple[dict, ...]:
    try:
        import datasets  # lazy: optional dependency (extra "hf")
    except ImportError as err:
        raise ImportError(
            f"data_dir={dataset_id!r} is not a local directory, so it was taken as a Hugging Face "
            "dataset id, which needs the 'datasets' package (pip install 'torchrl-grpo[hf]'). "
            f"Or point data_dir / {DATA_DIR_ENV} at a folder with train.jsonl and test.jsonl."
        ) from err
    try:
        ds = datasets.load_dataset(dataset_id, config, split=split)
    except Exception as err:  # datasets raises many types (network, config, hub errors)
        raise FileNotFoundError(
            f"Could not load GSM8K split {split!r}: {dataset_id!r} is not a local directory and "
            f"datasets.load_dataset({dataset_id!r}, {config!r}) failed ({type(err).__name__}: "
            f"{err}). Point data_dir / {DATA_DIR_ENV} at a folder with {split}.jsonl."
        ) from err
    return tuple(
        _row_to_problem(dict(row), f"{dataset_id}[{split}][{i}]") for i, row in enumerate(ds)
    )


def load_gsm8k(
    split: str = "train",
    data_dir: str | os.PathLike | None = None,
    *,
    hf_config: str = "main",
) -> list[dict]:
    """Load one GSM8K split.

    Args:
        split: ``"train"`` (7473 problems) or ``"test"`` (1319 problems).
        data_dir: folder holding ``{split}.jsonl``, or a Hugging Face dataset id
            (``"openai/gsm8k"``); defaults to ``$GSM8K_DATA_DIR``.
        hf_config: dataset config when loading from the hub (GSM8K's are ``"main"`` and
            ``"socratic"``).

    Returns:
        A new list of problem dicts ``{"question", "answer", "solution"}`` in file order. The
        dicts are shared with an in-process cache keyed by (resolved path or id, split):
        treat them as read-only.

    Raises:
        ValueError: unknown split; a malformed line (bad JSON, missing field, no ``####``
            number), reported as ``path:line``.
        FileNotFoundError: no data location given, the directory lacks ``{split}.jsonl``, or
            the path neither exists nor loads as a hub dataset.
        ImportError: a hub id was given but ``datasets`` is not installed.
    """
    if split not in SPLITS:
        raise ValueError(f"GSM8K split must be one of {SPLITS}, got {split!r}")
    source = resolve_data_dir(data_dir)
    local = Path(source).expanduser()
    if local.is_dir():
        path = (local / f"{split}.jsonl").resolve()
        key = (str(path), split)
        if key not in _CACHE:
            if not path.is_file():
                raise FileNotFoundError(
                    f"GSM8K file {path} not found: the data directory {local} must contain "
                    f"{split}.jsonl (set {DATA_DIR_ENV} or pass data_dir)."
                )
            with _LOCK:
                if key not in _CACHE:
                    _CACHE[key] = _load_jsonl(path)
        return list(_CACHE[key])
    if local.exists() or source.startswith((".", "/", "~")) or not _HF_ID_RE.match(source):
        raise FileNotFoundError(
            f"GSM8K data directory {source!r} does not exist or is not a directory: set "
            f"{DATA_DIR_ENV} or pass data_dir=<folder with train.jsonl and test.jsonl>."
        )
    key = (f"hf:{source}:{hf_config}", split)
    if key not in _CACHE:
        with _LOCK:
            if key not in _CACHE:
                _CACHE[key] = _load_hf(source, split, hf_config)
    return list(_CACHE[key])
