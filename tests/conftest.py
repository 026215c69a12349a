"""Shared fixtures: real GSM8K data location, a tiny random model, a temporary model cache."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.gsm8k_data import DATA_DIR

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    """``$GSM8K_DATA_DIR`` if it holds both splits, else the packaged copy (never skips)."""
    return DATA_DIR


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer():
    from torchrl_grpo.models import load_model_and_tokenizer

    return load_model_and_tokenizer("tiny-random")


@pytest.fixture(scope="session")
def tok(tiny_model_and_tokenizer):
    """The tiny random model's tokenizer (ChatML template with tools)."""
    return tiny_model_and_tokenizer[1]


@pytest.fixture(scope="session")
def tiny_llama():
    """Factory ``tiny_llama(max_position_embeddings=512)``: a seeded (``torch.manual_seed(0)``) random 2-layer Llama
    with grouped-query attention (vocab 300, hidden 64, 4 query / 2 KV heads), eval mode, SDPA attention. Built in
    memory, no files; for backend/loss tests that need a real HF architecture."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    def make(max_position_embeddings: int = 512):
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=max_position_embeddings)
        m = LlamaForCausalLM(cfg).eval()
        m.config._attn_implementation = "sdpa"
        return m

    return make
