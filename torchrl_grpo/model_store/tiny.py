"""``tiny-random``: a tiny random Llama with a byte-level BPE tokenizer, built with no network at all.

The tokenizer is trained on a fixed built-in corpus (GSM8K-like math, tau2-like support dialogue,
ChatML and tool-call snippets); the weights are drawn from a seeded private generator, so every
build is bit-identical. The cached copy is keyed by the sha256 of the whole recipe
(:func:`_tiny_recipe_sha`) and rebuilt when the recipe changes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from torchrl_grpo.model_store.cache import _file_lock, _is_cached, _publish, alias_cache_dir
from torchrl_grpo.model_store.tokenizer import CHATML_TOOLS_TEMPLATE

__all__ = ["TINY_RANDOM_ALIAS", "build_tiny_random"]

TINY_RANDOM_ALIAS = "tiny-random"

_TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TINY_ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                      "<tools>", "</tools>")
_TINY_VOCAB_SIZE = 768
_TINY_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,  # head size 32: loadable by vLLM CPU attention too
    num_key_value_heads=1,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)
_TINY_INIT_STD = 0.02
_TINY_RECIPE_VERSION = 1

_NAMES = ("Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Mark", "Ken", "Alexis",
          "Tina", "Randy", "Joy", "Janet", "Carla", "Greg", "Sam", "Maria", "John", "Lisa")
_ITEMS = ("apples", "clips", "eggs", "dollars", "cookies", "books", "pages", "marbles",
          "candies", "pencils", "tickets", "flowers", "cupcakes", "minutes", "hours", "miles",
          "shirts", "bottles", "boxes", "students", "chickens", "cars", "friends", "points")
_VERBS = ("sold", "bought", "has", "gave", "earns", "reads", "makes", "buys", "spent", "ate",
          "collected", "needs", "wants", "saved", "found", "lost", "baked", "paid")
_SENTENCES = (
    "How many {item} does {name} have in total?",
    "{name} {verb} {a} {item} in April and half as many in May.",
    "{name} {verb} {a} {item}. Then {name2} {verb2} {b} more {item}.",
    "If each box holds {a} {item}, how many boxes are needed for {b} {item}?",
    "{name} earns ${a} an hour for babysitting. Yesterday, she did {b} minutes of work.",
    "What is {a} + {b}? The answer is {c}.",
    "What is {a} times {b}? Let's think step by step. {a} * {b} = {d}. #### {d}",
    "There are {a} {item} and {b} {item}, so there are {a} + {b} = {c} {item} altogether.",
    "The price of {a} {item} is ${b}.50, and the total cost is ${c}.",
    "{name} has {a} {item}. {name} gives {b} to {name2}. How many {item} are left? #### {e}",
    "Please provide your user id and the reservation number so I can help you.",
    "I would like to cancel my flight and get a refund for the order.",
    "Thank you for your patience. Your booking has been updated successfully.",
    "The user wants to change the delivery address of order #W{a}{b}.",
)
_TOOL_SNIPPETS = (
    '<tool_call>\n{{"name": "get_user_details", "arguments": {{"user_id": "{name}_{a}"}}}}\n'
    "</tool_call>",
    '<tool_call>\n{{"name": "calculate", "arguments": {{"expression": "{a} + {b}"}}}}\n</tool_call>',
    '<tool_response>\n{{"result": {c}, "status": "ok"}}\n</tool_response>',
    '<tools>\n{{"type": "function", "function": {{"name": "search_flights", "description": '
    '"Search direct flights", "parameters": {{"type": "object", "properties": {{"origin": '
    '{{"type": "string"}}}}, "required": ["origin"]}}}}}}\n</tools>',
)


def _tiny_corpus() -> list[str]:
    """A fixed, deterministic training corpus: GSM8K-ish math, tau2-ish support, ChatML, tools."""
    import random

    rng = random.Random(1234)
    lines: list[str] = []
    for i in range(1500):
        a, b = rng.randint(1, 120), rng.randint(1, 60)
        fields = dict(
            name=rng.choice(_NAMES), name2=rng.choice(_NAMES), item=rng.choice(_ITEMS),
            verb=rng.choice(_VERBS), verb2=rng.choice(_VERBS), a=a, b=b, c=a + b, d=a * b,
            e=max(a - b, 0),
        )
        sentence = rng.choice(_SENTENCES).format(**fields)
        if i % 5 == 0:
            sentence = rng.choice(_TOOL_SNIPPETS).format(**fields)
        if i % 3 == 0:
            sentence = (
                f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                f"<|im_start|>user\n{sentence}<|im_end|>\n<|im_start|>assistant\n"
                f"The answer is {fields['c']}.<|im_end|>\n"
            )
        lines.append(sentence)
    lines.append("0 1 2 3 4 5 6 7 8 9 + - * / = % $ # . , ; : ! ? ( ) [ ] { } < > \" ' _ \n")
    return lines


def _train_tiny_tokenizer():
    """Train the byte-level BPE of ``tiny-random`` and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TINY_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(_TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    tok.add_tokens(list(_TINY_ADDED_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        model_max_length=_TINY_CONFIG["max_position_embeddings"],
        padding_side="left",
    )
    fast.chat_template = CHATML_TOOLS_TEMPLATE
    return fast


def build_tiny_random(out_dir: str | os.PathLike, seed: int = 0):
    """Build the ``tiny-random`` model + tokenizer (no network) and save them to ``out_dir``.

    The model is a ``LlamaForCausalLM`` (hidden 64, 2 layers, 4 heads / 2 KV heads, MLP 128, tied
    embeddings, vocab ~770). Weights are drawn from N(0, 0.02²) with a private generator seeded
    with ``seed`` (norm weights are ones), so every build with the same seed is bit-identical.

    Returns:
        ``(model, tokenizer)``, the model in float32 and eval mode.
    """
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tiny_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        **_TINY_CONFIG,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * _TINY_INIT_STD)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None, do_sample=False
    )
    model.eval()
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return model, tokenizer


def _tiny_recipe_sha(seed: int = 0) -> str:
    recipe = json.dumps(
        {"v": _TINY_RECIPE_VERSION, "config": _TINY_CONFIG, "vocab": _TINY_VOCAB_SIZE,
         "special": _TINY_SPECIAL_TOKENS, "added": _TINY_ADDED_TOKENS, "seed": seed,
         "std": _TINY_INIT_STD, "corpus": hashlib.sha256("\x00".join(_tiny_corpus()).encode()).hexdigest(),
         "template": CHATML_TOOLS_TEMPLATE},
        sort_keys=True,
    )
    return hashlib.sha256(recipe.encode()).hexdigest()


def _ensure_tiny_random(force: bool = False) -> Path:
    final = alias_cache_dir(TINY_RANDOM_ALIAS)
    sha = _tiny_recipe_sha(0)
    if not force and _is_cached(final, sha):
        return final
    with _file_lock(final.parent / f".{TINY_RANDOM_ALIAS}.lock"):
        if not force and _is_cached(final, sha):
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{TINY_RANDOM_ALIAS}-", dir=final.parent))
        try:
            out = tmp / "model"
            build_tiny_random(out, seed=0)
            _publish(out, final, {"alias": TINY_RANDOM_ALIAS, "sha256": sha, "seed": 0,
                                  "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
