"""Shared fixtures: real GSM8K data location, a tiny random model, a temporary model cache."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.gsm8k_data import SHARED_GSM8K

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
if "GSM8K_DATA_DIR" not in os.environ and SHARED_GSM8K.is_dir():
    os.environ["GSM8K_DATA_DIR"] = str(SHARED_GSM8K)


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    d = Path(os.environ.get("GSM8K_DATA_DIR", SHARED_GSM8K))
    if not (d / "train.jsonl").is_file():
        pytest.skip(f"GSM8K data not found at {d} (set GSM8K_DATA_DIR)")
    return d


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer():
    from torchrl_grpo.models import load_model_and_tokenizer

    return load_model_and_tokenizer("tiny-random")
