"""Loading GSM8K problems (Cobbe et al., 2021, arXiv:2110.14168).

Sources, first match wins (:func:`resolve_data_dir`):

1. ``data_dir=`` (the trainer's ``train_dataset.path``): a local directory or a hub id, below;
2. ``$GSM8K_DATA_DIR``: the same;
3. the copy shipped inside this package (:data:`PACKAGED_DATA_DIR`, ``envs/gsm8k/data/``:
   ``train.jsonl.gz`` / ``test.jsonl.gz`` from ``openai/grade-school-math``, MIT License, see the
   ``LICENSE`` and ``README.md`` there), so no download or setting is needed.

A local directory holds ``train.jsonl`` and ``test.jsonl`` (or gzipped ``*.jsonl.gz``), one JSON
object per line with the dataset's fields ``question`` and ``answer`` (the reference solution,
ending in ``#### N``); this is the layout of the official repository ``openai/grade-school-math``
(its ``grade_school_math/data`` folder). A Hugging Face ``datasets`` id such as ``"openai/gsm8k"``
(config ``"main"``) is used when the location is not an existing directory and looks like a hub id
(needs the optional ``datasets`` package and network or a local HF cache).

Every row is validated at load (a JSON object; ``question`` and ``answer`` strings; a ``#### N``
gold line): a bad row raises ``ValueError`` naming ``file:line``.

Each problem becomes ``{"question": str, "answer": str, "solution": str}`` where ``answer`` is the
gold final number normalized by :func:`envs.gsm8k.grading.parse_gold` (``"#### 1,200"`` →
``"1200"``) and ``solution`` is the full reference text.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..jsonl import iter_jsonl
from ..task_list_cache import cached_task_list
from .grading import parse_gold

__all__ = ["load_gsm8k", "resolve_data_dir", "data_source", "SPLITS", "DATA_DIR_ENV", "PACKAGED_DATA_DIR"]

#: Environment variable naming the default data directory (or HF dataset id).
DATA_DIR_ENV = "GSM8K_DATA_DIR"
#: The splits GSM8K ships with.
SPLITS = ("train", "test")
#: The GSM8K copy shipped in the package (``{split}.jsonl.gz`` + ``LICENSE``): the default source.
PACKAGED_DATA_DIR = Path(__file__).resolve().parent / "data"

_HF_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> str:
    """The data location to use: ``data_dir`` if given (not ``None``/empty), else
    ``$GSM8K_DATA_DIR`` if set (non-empty), else the packaged copy :data:`PACKAGED_DATA_DIR`.

    Returns:
        A directory path or a hub id, as given (not checked here; :func:`load_gsm8k` checks).
    """
    if data_dir is None or os.fspath(data_dir) == "":
        data_dir = os.environ.get(DATA_DIR_ENV) or PACKAGED_DATA_DIR
    return os.fspath(data_dir)


def _split_file(directory: Path, split: str) -> Path | None:
    for name in (f"{split}.jsonl", f"{split}.jsonl.gz"):
        if (directory / name).is_file():
            return (directory / name).resolve()
    return None


def data_source(split: str = "train", data_dir: str | os.PathLike | None = None) -> str:
    """Where :func:`load_gsm8k` reads ``split`` from: the absolute path of the split's file, or
    ``"hf:<id>"`` for a hub id (for run records; nothing is loaded).

    Raises:
        ValueError: unknown split.
        FileNotFoundError: a directory without ``{split}.jsonl[.gz]``, or a path that does not exist.
    """
    if split not in SPLITS:
        raise ValueError(f"GSM8K split must be one of {SPLITS}, got {split!r}")
    source = resolve_data_dir(data_dir)
    local = Path(source).expanduser()
    if local.is_dir():
        path = _split_file(local, split)
        if path is None:
            raise FileNotFoundError(
                f"GSM8K file {local.resolve() / (split + '.jsonl')} not found: the data directory {local} "
                f"must contain {split}.jsonl or {split}.jsonl.gz (set {DATA_DIR_ENV} or pass data_dir; "
                f"unset both to use the packaged copy)."
            )
        return str(path)
    if local.exists() or source.startswith((".", "/", "~")) or not _HF_ID_RE.match(source):
        raise FileNotFoundError(
            f"GSM8K data directory {source!r} does not exist or is not a directory: set "
            f"{DATA_DIR_ENV} or pass data_dir=<folder with train.jsonl and test.jsonl> "
            "(or unset both to use the packaged copy)."
        )
    return f"hf:{source}"


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
    problems = [_row_to_problem(row, where) for where, row in iter_jsonl(path)]
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
        data_dir: folder holding ``{split}.jsonl`` (or ``{split}.jsonl.gz``), or a Hugging Face
            dataset id (``"openai/gsm8k"``); defaults to ``$GSM8K_DATA_DIR``, then to the
            packaged copy (:func:`resolve_data_dir`).
        hf_config: dataset config when loading from the hub (GSM8K's are ``"main"`` and
            ``"socratic"``).

    Returns:
        A new list of problem dicts ``{"question", "answer", "solution"}`` in file order. The
        dicts are shared with an in-process cache keyed by (resolved path or id, split)
        (:mod:`envs.task_list_cache`, a bounded LRU): treat them as read-only.

    Raises:
        ValueError: unknown split; a malformed line (bad JSON, missing field, no ``####``
            number), reported as ``path:line``.
        FileNotFoundError: the directory lacks ``{split}.jsonl[.gz]``, or the path neither exists
            nor loads as a hub dataset.
        ImportError: a hub id was given but ``datasets`` is not installed.
    """
    where = data_source(split, data_dir)  # ValueError / FileNotFoundError for a bad split / location
    if not where.startswith("hf:"):
        return list(cached_task_list(("gsm8k", where, split), lambda: _load_jsonl(Path(where))))
    source = where[3:]
    return list(cached_task_list(("gsm8k", f"hf:{source}:{hf_config}", split),
                                 lambda: _load_hf(source, split, hf_config)))
