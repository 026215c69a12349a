"""Cross-turn KV reuse of the transformers backend (``turn_cache_mb``; torchrl_grpo/backends/turn_kv_cache.py).

Multi-turn conversations on a tiny random Llama: each turn's prompt is the last prompt + the sampled tokens + an
"env reply". With the cache on, turns after the first prefill only the reply; tokens and behaviour log-probs must
be those of the plain path (cache off), and the stats must count exactly the kept tokens not prefilled again.
"""
from __future__ import annotations

import logging

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from torchrl_grpo.backends.base import SamplingConfig
from torchrl_grpo.backends.factory import make_backend
from torchrl_grpo.backends.kv_cache import assemble_cache
from torchrl_grpo.backends.transformers_backend import TransformersBackend
from torchrl_grpo.config.schema import RolloutConfig

SYS = torch.randint(5, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist()  # shared by every prompt
STARTS = [SYS + [11, 12, 13], SYS + [20, 21], SYS + [30], SYS + [40, 41, 42, 43]]
STOP = list(range(0, 300, 13))


def reply(turn: int, row: int) -> list[int]:
    """The env's reply after turn ``turn`` of conversation ``row`` (lengths differ by row)."""
    return [50 + turn, 60 + row] + [70 + (turn * 7 + row * 3 + i) % 200 for i in range(row + 1)]


def converse(be, starts, turns, sampling, extra=None):
    """``turns`` generate calls; call t > 0 gets each previous prompt + its tokens + its reply, then ``extra[t]``
    (more prompts, not continuations). Returns (per call: prompts, generations)."""
    prompts, calls = list(starts), []
    for t in range(turns):
        batch = prompts + list((extra or {}).get(t, []))
        gens = be.generate(batch, sampling)
        calls.append((batch, gens))
        prompts = [p + g.token_ids + reply(t, i) for i, (p, g) in enumerate(zip(prompts, gens[: len(prompts)]))]
    return calls


def assert_same(calls_a, calls_b):
    for (pa, ga), (pb, gb) in zip(calls_a, calls_b, strict=True):
        assert pa == pb
        assert [g.token_ids for g in ga] == [g.token_ids for g in gb]
        for x, y in zip(ga, gb):
            assert x.finish_reason == y.finish_reason
            assert (torch.tensor(x.logprobs) - torch.tensor(y.logprobs)).abs().max().item() < 1e-4


def kept_tokens(calls, lp: int) -> int:
    """Tokens a turn cache keeps and reuses: for each distinct prompt of call t > 0, the longest of call t - 1's
    rows (prompt + its tokens but the last, whose keys/values were never computed) it strictly extends, after the
    shared prefix of ``lp`` tokens."""
    n = 0
    for (prev_p, prev_g), (p, _g) in zip(calls, calls[1:]):
        held = [q + g.token_ids[:-1] for q, g in zip(prev_p, prev_g)]
        for x in {tuple(x) for x in p}:
            best = max((len(h) for h in held if len(x) > len(h) and list(x[: len(h)]) == h), default=None)
            n += best - lp if best is not None else 0
    return n


@pytest.mark.parametrize(("decode", "prefix_min", "temperature", "turns"), [
    ("eager", 16, 0.0, 2), ("eager", 16, 0.0, 3), ("eager", 0, 0.0, 3), ("eager", 16, 1.0, 3), ("static", 16, 0.0, 3),
    ("static", 0, 1.0, 3)])
def test_reuse_gives_the_plain_paths_tokens_and_log_probs(tiny_llama, decode, prefix_min, temperature, turns):
    model = tiny_llama()
    s = SamplingConfig(max_new_tokens=8, temperature=temperature, stop_token_ids=STOP, seed=5)
    off = TransformersBackend(model, pad_token_id=0, decode=decode, prefix_cache_min_tokens=prefix_min)
    on = TransformersBackend(model, pad_token_id=0, decode=decode, prefix_cache_min_tokens=prefix_min,
                             turn_cache_mb=64)
    ref, got = converse(off, STARTS, turns, s), converse(on, STARTS, turns, s)
    assert_same(ref, got)
    assert on.stats["turn_cache_hits"] == len(STARTS) * (turns - 1)
    saved = kept_tokens(got, len(SYS) if prefix_min else 0)
    assert on.stats["reused_tokens"] == saved > 0
    assert on.stats["prefilled_tokens"] == off.stats["prefilled_tokens"] - saved
    assert "turn_cache_hits" not in off.stats


def test_group_samples_and_a_mixed_batch(tiny_llama):
    """Samples of one prompt (the fan-out), then a call where one prompt continues nothing (a new episode after
    the shared prefix) and one shares not even the prefix (the plain path for that call)."""
    model = tiny_llama()
    s = SamplingConfig(max_new_tokens=6, temperature=1.0, stop_token_ids=STOP, seed=2)
    starts = [STARTS[0]] * 3 + [STARTS[1]] * 2
    extra = {1: [SYS + [99, 98, 97, 96, 95, 94, 93, 92, 91, 90]], 2: [[7, 8, 9]]}
    off = TransformersBackend(model, pad_token_id=0, prefix_cache_min_tokens=16)
    on = TransformersBackend(model, pad_token_id=0, prefix_cache_min_tokens=16, turn_cache_mb=64)
    ref, got = converse(off, starts, 3, s, extra), converse(on, starts, 3, s, extra)
    assert_same(ref, got)
    # call 2: every continuation hit (the new prompt only reused the shared prefix); call 3: the prompt without
    # the shared prefix sent the whole call down the plain path
    distinct = len({tuple(p) for p in got[1][0][: len(starts)]})
    assert on.stats["turn_cache_hits"] == distinct
    assert on.stats["reused_tokens"] == kept_tokens(got[:2], len(SYS))


def test_new_weights_or_another_forward_state_drop_the_kept_keys(tiny_llama):
    model = tiny_llama()
    s = SamplingConfig(max_new_tokens=6, temperature=0.0, stop_token_ids=STOP)
    off = TransformersBackend(model, pad_token_id=0, prefix_cache_min_tokens=16)
    on = TransformersBackend(model, pad_token_id=0, prefix_cache_min_tokens=16, turn_cache_mb=64)
    first = [on.generate(STARTS, s), off.generate(STARTS, s)]
    assert [g.token_ids for g in first[0]] == [g.token_ids for g in first[1]]
    nxt = [p + g.token_ids + reply(0, i) for i, (p, g) in enumerate(zip(STARTS, first[0]))]
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    on.load_weights(None)  # the trainer's sync: the kept keys/values are the old weights'
    off.load_weights(None)
    assert_same([(nxt, off.generate(nxt, s))], [(nxt, on.generate(nxt, s))])
    assert on.stats["turn_cache_hits"] == 0

    nxt2 = [p + g.token_ids + reply(1, i) for i, (p, g) in enumerate(zip(nxt, on.generate(nxt, s)))]
    model.config._attn_implementation = "eager"  # part of forward_state, like peft's active adapter
    try:
        assert_same([(nxt2, off.generate(nxt2, s))], [(nxt2, on.generate(nxt2, s))])
    finally:
        model.config._attn_implementation = "sdpa"
    assert on.stats["turn_cache_hits"] == 0


def test_a_call_over_the_cap_keeps_nothing(tiny_llama):
    model = tiny_llama()
    s = SamplingConfig(max_new_tokens=6, temperature=0.0, stop_token_ids=STOP)
    # one token of the tiny Llama: 2 layers x (keys + values) x 2 KV heads x 16 dims x 4 bytes = 512 bytes
    on = TransformersBackend(model, pad_token_id=0, prefix_cache_min_tokens=16, turn_cache_mb=10 * 512 / 2**20)
    off = TransformersBackend(model, pad_token_id=0, prefix_cache_min_tokens=16)
    assert_same(converse(off, STARTS, 2, s), converse(on, STARTS, 2, s))
    assert on.stats["turn_cache_hits"] == 0 and on.stats["reused_tokens"] == 0
    assert on.stats["turn_cache_overflows"] == 2
    # one row fits: a call of one episode reuses its keys/values
    one = converse(on, [SYS + [11]], 2, s)
    assert on.stats["turn_cache_hits"] == 1 and on.stats["reused_tokens"] == kept_tokens(one, len(SYS))


def test_refused_where_padding_after_kept_keys_is_not_exact(caplog):
    """A sliding window counts cache columns: padding between kept keys and new tokens would shift it."""
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=8, max_position_embeddings=512)
    model = MistralForCausalLM(cfg).eval()
    on = TransformersBackend(model, pad_token_id=0, turn_cache_mb=64)
    with caplog.at_level(logging.WARNING):
        converse(on, [[11, 12, 13], [20, 21]], 2, SamplingConfig(max_new_tokens=4, temperature=0.0))
    assert on.stats["turn_cache_hits"] == 0
    assert "cross-turn KV cache" in caplog.text


def test_the_config_key_reaches_the_backend(tiny_llama, tok):
    assert RolloutConfig().turn_cache_mb == 0.0  # off unless asked for
    model = tiny_llama()
    assert make_backend("transformers", model, tok, own_copy=False)._turn is None
    on = make_backend("transformers", model, tok, own_copy=False, turn_cache_mb=256)
    assert on._turn is not None and on._turn.max_bytes == 256 * 2**20
    with pytest.raises(ValueError, match="turn_cache_mb"):
        TransformersBackend(model, pad_token_id=0, turn_cache_mb=-1)


def test_assemble_cache_places_rows_right_aligned_after_the_prefix():
    pre_k, pre_v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    from transformers import DynamicCache

    prefix = DynamicCache(ddp_cache_data=[(pre_k, pre_v)])
    row = ((torch.randn(2, 2, 4),), (torch.randn(2, 2, 4),))
    for capacity in (None, 12):
        cache = assemble_cache(prefix, [row, None], 5, capacity=capacity)
        k = cache.layers[0].keys
        assert k.shape == (2, 2, 8, 4)
        assert torch.equal(k[:, :, :3], pre_k.expand(2, -1, -1, -1))
        assert torch.equal(k[0, :, 6:], row[0][0]) and not k[0, :, 3:6].any() and not k[1, :, 3:].any()
    with pytest.raises(ValueError, match="width"):
        assemble_cache(prefix, [row], 1)
    with pytest.raises(ValueError, match="prefix or at least one row"):
        assemble_cache(None, [None], 3)
