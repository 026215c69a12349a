"""tiny-random for the tests that run it inside TRL's GRPOTrainer: saved to a folder TRL can load, and its tokenizer
loaded back with the response template TRL needs to parse Hermes tool calls (TRL knows only the exact templates of
released models; ours is ChatML + Hermes like Qwen's)."""
from __future__ import annotations

from pathlib import Path


def save_tiny_for_trl(out: Path, max_positions: int | None = None) -> Path:
    """Save tiny-random (model + tokenizer, the tokenizer with qwen3's response template) to the folder ``out``;
    return ``out``. ``max_positions`` (tokens, > 0) lifts the model's ``max_position_embeddings`` (RoPE, random
    weights: any length works) when given."""
    from trl.chat_template_utils import qwen3_template

    from torchrl_grpo.model_store import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny-random")
    if max_positions is not None:
        model.config.max_position_embeddings = max_positions
    tok.response_template = qwen3_template
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def trl_tokenizer(path):
    """The tokenizer saved in ``path`` with qwen3's response template set (``save_pretrained`` does not keep it)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_template

    tok = AutoTokenizer.from_pretrained(path)
    tok.response_template = qwen3_template
    return tok
