"""Fixed-shape decode (torchrl_grpo/backends/graph_decode.py): same greedy tokens as the eager loop, behaviour
log-probs equal to the trainer's recompute, and no host-device synchronisation inside a decode step (what lets a
CUDA graph capture it and the CPU run ahead of the GPU). CUDA graph capture itself runs only on a GPU."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchrl_grpo.backends.base import SamplingConfig
from torchrl_grpo.backends.graph_decode import CAPACITY_ROUND, StaticDecoder
from torchrl_grpo.backends.transformers_backend import TransformersBackend
from tests.test_transformers_backend import PROMPTS, STOP, model, recompute_max_diff  # noqa: F401 (fixture)


# aten ops that make the host wait for the device (a value read back, or an output size that depends on data)
SYNCING = {"_local_scalar_dense", "is_nonzero", "nonzero", "equal", "masked_select", "unique", "_unique2",
           "item", "allclose"}


class SyncCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SYNCING:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("prefix_min", [0, 16])
def test_greedy_tokens_equal_the_eager_loop(model, prefix_min):
    s = SamplingConfig(max_new_tokens=20, temperature=0.0, stop_token_ids=STOP)
    eager = TransformersBackend(model, pad_token_id=0, decode="eager", prefix_cache_min_tokens=prefix_min)
    static = TransformersBackend(model, pad_token_id=0, decode="static", prefix_cache_min_tokens=prefix_min)
    a, b = eager.generate(PROMPTS, s), static.generate(PROMPTS, s)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.finish_reason for g in a] == [g.finish_reason for g in b]
    for g, h in zip(a, b):
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(h.logprobs), atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_equal_the_trainer_recompute(model, temperature):
    be = TransformersBackend(model, pad_token_id=0, decode="static")
    gens = be.generate(PROMPTS, SamplingConfig(max_new_tokens=12, temperature=temperature, stop_token_ids=STOP,
                                               seed=3))
    for g in gens:
        assert 1 <= len(g.token_ids) == len(g.logprobs) == len(g.versions) <= 12
        assert g.finish_reason == ("stop" if g.token_ids[-1] in STOP else "length")
        assert all(t not in STOP for t in g.token_ids[:-1])
    assert recompute_max_diff(model, PROMPTS, gens, temperature) < 1e-4


@pytest.mark.slow  # 16.5 s of the unit stage at load ~4 (issue 45)
def test_a_decode_step_never_synchronises(model):
    """The step a CUDA graph captures (model forward over the static cache) and the eager work around it (sampling,
    index updates) read nothing back to the host; the whole generation reads once per STOP_CHECK_EVERY steps plus
    the prefill's and the final read."""
    be = TransformersBackend(model, pad_token_id=0, decode="static")
    s = SamplingConfig(max_new_tokens=40, temperature=1.0, seed=0)  # no stop tokens: all 40 steps run
    be.generate(PROMPTS, s)  # warm: slot allocated
    logits, cache, am, next_pos, _prefix = be._prefill(PROMPTS, 0)
    dec = be._static
    slot = dec.start(cache, am, next_pos, 8)
    tok = logits.argmax(-1)
    with SyncCounter() as c, torch.no_grad():
        for _ in range(4):
            logits = dec.step(slot, tok)
            tok = logits.argmax(-1)
    assert c.ops == []
    with SyncCounter() as c:
        be.generate(PROMPTS, s)
    few = len(c.ops)
    with SyncCounter() as c:
        be.generate(PROMPTS, SamplingConfig(max_new_tokens=80, temperature=1.0, seed=0))
    assert len(c.ops) == few  # independent of the number of decode steps (no stop tokens: no stop checks)


def test_slots_are_reused_across_prompt_lengths_in_one_capacity_bucket(model):
    be = TransformersBackend(model, pad_token_id=0, decode="static", prefix_cache_min_tokens=0)
    s = SamplingConfig(max_new_tokens=4, temperature=0.0)
    be.generate([[5, 6, 7]] * 4, s)
    be.generate([[5, 6, 7, 8, 9]] * 4, s)
    assert len(be._static._slots) == 1
    assert StaticDecoder.capacity(CAPACITY_ROUND + 1) == 2 * CAPACITY_ROUND


def test_decode_mode_resolution(model):
    assert TransformersBackend(model, pad_token_id=0).decode_mode() == "eager"  # auto on CPU
    assert TransformersBackend(model, pad_token_id=0, decode="graph").decode_mode() == "static"  # no CUDA here
    be = TransformersBackend(model, pad_token_id=0, decode="static")
    be.weight_update_hook, be.partial_rollout_chunk = (lambda: None), 4
    assert be.decode_mode() == "eager"  # partial rollouts re-prefill under new weights: the row-dropping loop
    with pytest.raises(ValueError, match="decode must be one of"):
        TransformersBackend(model, pad_token_id=0, decode="fast")


def test_decode_mode_refuses_the_fixed_shape_loop_where_it_is_not_exact(model, caplog):
    """Eager attention adds the boolean mask to the scores (masks nothing): decode=static|graph runs the eager loop
    instead, says so once, and decode_path tells which loop ran (tests/test_model_matrix.py: every architecture)."""
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    be = TransformersBackend(eager, pad_token_id=0, decode="graph")
    with caplog.at_level("WARNING"):
        assert be.decode_mode() == "eager"
        be.generate(PROMPTS[:2], SamplingConfig(max_new_tokens=3, temperature=0.0))
    assert be.decode_path == "eager" and caplog.text.count("attention 'eager', not sdpa") == 1
    assert be._static is None  # the fixed-shape decoder never ran
    ok = TransformersBackend(model, pad_token_id=0, decode="static")
    ok.generate(PROMPTS[:2], SamplingConfig(max_new_tokens=3, temperature=0.0))
    assert ok.decode_path == "static" and ok._static.stats["eager_steps"] == 2


def test_the_graph_fingerprint_sees_python_level_forward_state(model):
    """A captured graph replays the branches taken at capture: the fingerprint covers the attention implementation
    and peft's active / disabled adapters (tests/test_model_matrix.py decodes under each), not only storage."""
    from peft import LoraConfig, get_peft_model

    from torchrl_grpo.backends.graph_decode import parameter_fingerprint

    pm = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["q_proj"]))
    pm.add_adapter("b", LoraConfig(r=2, target_modules=["q_proj"]))
    dec = StaticDecoder(pm, use_graphs=True)
    fp = dec.fingerprint()
    assert fp == parameter_fingerprint(pm)
    pm.set_adapter("b")
    fp_b = dec.fingerprint()
    assert fp_b != fp
    with pm.disable_adapter():
        assert dec.fingerprint() not in (fp, fp_b)
    pm.base_model.model.config._attn_implementation = "eager"
    assert dec.fingerprint() != fp_b
    pm.base_model.model.config._attn_implementation = "sdpa"
    assert dec.fingerprint() == fp_b
