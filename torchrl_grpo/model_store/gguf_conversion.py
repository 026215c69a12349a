"""GGUF → safetensors conversion: dequantize a GGUF file with transformers and save an HF directory.

:func:`convert_gguf_cached` converts a user's ``.gguf`` file once into the model cache, keyed by its sha256 (the
packaged aliases are converted the same way by :func:`torchrl_grpo.model_store.packaged.fetch_alias`).
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from pathlib import Path

import torch

from torchrl_grpo.model_store.cache import _file_lock, _is_cached, _publish, alias_cache_dir
from torchrl_grpo.model_store.errors import ModelResolutionError
from torchrl_grpo.model_store.tokenizer import _set_pad_ids, prepare_tokenizer

__all__ = ["convert_gguf_cached", "gguf_cache_dir"]


def _convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF with transformers and save it as a float32 safetensors HF directory.

    ``save_pretrained`` refuses GGUF-loaded models, so the weights are moved into a fresh model
    built from the same config (without ``quantization_config``). The tokenizer (with the chat
    template fix of :func:`prepare_tokenizer`) is saved alongside.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = dict(gguf_file=gguf_path.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = loaded.state_dict()
    fresh.load_state_dict(state, strict=True, assign=True)
    fresh.tie_weights()
    fresh.generation_config = loaded.generation_config
    del loaded, state
    _set_pad_ids(fresh, prepare_tokenizer(tokenizer))
    fresh.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def gguf_cache_dir(sha256: str) -> Path:
    """Cache directory of the HF conversion of the GGUF file whose content has sha256 ``sha256`` (hex):
    ``$TORCHRL_GRPO_CACHE/models/gguf-<first 16 hex digits>`` (it may not exist yet)."""
    return alias_cache_dir(f"gguf-{sha256[:16]}")


def convert_gguf_cached(gguf_path: str | Path, force: bool = False) -> Path:
    """The float32 safetensors HF directory of a ``.gguf`` file, converted once and cached (as a packaged alias is).

    Keyed by the file's content (sha256), so the same file under another name or path is converted once, and an
    edited file gets a new directory. The directory is published atomically under an inter-process lock
    (:mod:`torchrl_grpo.model_store.cache`): concurrent callers convert once and every later call, in any process,
    returns the cached directory after hashing the file (~0.3 s per 100 MB). Trainers that refuse a model loaded
    from a GGUF file (TRL: "purely quantized") load this directory instead, so two systems compared on one GGUF
    load the same weights.

    Args:
        gguf_path: an existing ``.gguf`` file.
        force: convert again even when a valid cached directory exists.

    Returns:
        The cache directory (``config.json``, ``model.safetensors``, tokenizer files, marker).

    Raises:
        ModelResolutionError: ``gguf_path`` is not an existing ``.gguf`` file.
    """
    path = Path(gguf_path).expanduser()
    if not path.is_file() or path.suffix.lower() != ".gguf":
        raise ModelResolutionError(f"{gguf_path} is not an existing .gguf file")
    path = path.resolve()
    sha = _sha256(path)
    final = gguf_cache_dir(sha)
    if not force and _is_cached(final, sha):
        return final
    with _file_lock(final.parent / f".{final.name}.lock"):
        if not force and _is_cached(final, sha):
            return final  # another process converted it while we waited
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
        try:
            out = tmp / "model"
            t0 = time.perf_counter()
            _convert_gguf_to_hf(path, out)
            _publish(out, final, {"sha256": sha, "gguf_file": path.name, "source": str(path),
                                  "convert_s": round(time.perf_counter() - t0, 2),
                                  "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
