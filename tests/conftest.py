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
