"""GGUF → safetensors conversion: dequantize a GGUF file with transformers and save an HF directory."""
from __future__ import annotations

from pathlib import Path

import torch

from torchrl_grpo.models.tokenizer import _set_pad_ids, prepare_tokenizer

__all__: list[str] = []


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
