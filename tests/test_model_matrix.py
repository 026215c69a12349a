"""The model matrix (issue 43): tiny random configs of the architectures users bring, each through every decode path
of the transformers backend and both update paths; a fast path either is exact for the model or refuses it (the rule:
torchrl_grpo/exact_paths.py) and the plain path runs.

Per model and ``rollout.decode`` (eager, static; graph only where CUDA is present): greedy tokens equal
``model.generate``'s (per prompt, unpadded), sampled behaviour log-probs (T=0.7, top-p 0.9, top-k 20) equal the
trainer's recompute within 1e-4, and ``decode_path`` says which loop ran. Per model: the shared-prefix update's
log-probs and gradients equal the plain per-episode ones, or ``build_shared_prefix`` refuses the model. With peft
adapters: switching or disabling an adapter changes what the next decode uses, and the CUDA-graph fingerprint sees it.

Prompts are longer than the sliding windows (4 columns; one Mistral row has a window of 64 that the calls never
exceed, so its fixed-shape decode runs) and share a 6-token prefix, so windows, left padding, the
backend's prompt-prefix cache and the group fan-out all bite.

Position schemes (issue 49): RoPE whose frequencies follow the sequence length (Llama ``dynamic``, Phi-3
``longrope``: the fixed-shape decode and the shared-prefix update refused, behaviour log-probs reported inexact; here
within their original length, where every path is exact: across it no path is, tests/test_exact_paths_positions.py),
YaRN and linear scaling (not length dependent: their fixed-shape decode runs past an original length of 8) and
ALiBi: MPT counts its biases on key columns (the prompt-prefix cache refused), Bloom and Falcon count real tokens of
the attention mask (the cache runs and is exact).
"""
from __future__ import annotations

import copy

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

from torchrl_grpo.backends.base import SamplingConfig
from torchrl_grpo.backends.graph_decode import parameter_fingerprint
from torchrl_grpo.backends.transformers_backend import TransformersBackend
from torchrl_grpo.backends.kv_cache import supports_preallocation
from torchrl_grpo.exact_paths import exact_log_probs_refusal, fixed_shape_decode_refusal, prefix_cache_refusal, \
    shared_prefix_refusal
from torchrl_grpo.objectives.log_probs import _decoder_and_head, token_log_probs
from torchrl_grpo.objectives.shared_prefix import build_shared_prefix, shared_prefix_length
from tests.test_shared_prefix_update import _assert_grads_close, _multi_turn_rows, _plain, _shared

VOCAB = 256
WINDOW = 4
_SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, pad_token_id=0,
              bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
_WINDOWED = dict(sliding_window=WINDOW, head_dim=8)
_TWO_KINDS = dict(layer_types=["sliding_attention", "full_attention"])
#: Phi-3's longrope: one short / long factor per rotary frequency (head_dim 8: 4), switched at 64 positions
_LONGROPE = dict(rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [2.0, 3.0, 5.0, 8.0]},
                 original_max_position_embeddings=64)

#: name -> (config class name, attention implementation, extra config, the decode loop ``decode=static`` runs)
MATRIX = {
    "llama_sdpa": ("LlamaConfig", "sdpa", {}, "static"),
    "llama_eager": ("LlamaConfig", "eager", {}, "eager"),
    "qwen2": ("Qwen2Config", "sdpa", {}, "static"),
    "qwen3": ("Qwen3Config", "sdpa", {"head_dim": 8}, "static"),
    "mistral_window": ("MistralConfig", "sdpa", _WINDOWED, "eager"),
    "mistral_wide_window": ("MistralConfig", "sdpa", {**_WINDOWED, "sliding_window": 64}, "static"),  # never bites
    "gemma2": ("Gemma2Config", "eager", {**_WINDOWED, **_TWO_KINDS, "query_pre_attn_scalar": 8}, "eager"),
    "gemma3": ("Gemma3TextConfig", "sdpa", {**_WINDOWED, **_TWO_KINDS, "query_pre_attn_scalar": 8,
                                            "attn_logit_softcapping": 20.0, "final_logit_softcapping": 15.0},
               "eager"),
    "phi3": ("Phi3Config", "sdpa", {}, "static"),
    "llama_dynamic": ("LlamaConfig", "sdpa", {"rope_parameters": {"rope_type": "dynamic", "factor": 4.0}}, "eager"),
    "phi3_longrope": ("Phi3Config", "sdpa", _LONGROPE, "eager"),
    "llama_yarn": ("LlamaConfig", "sdpa", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                                               "original_max_position_embeddings": 8},
                                           "max_position_embeddings": 32}, "static"),
    "llama_linear": ("LlamaConfig", "sdpa", {"rope_parameters": {"rope_type": "linear", "factor": 4.0},
                                             "max_position_embeddings": 8}, "static"),  # computed once: exact
    "mpt": ("MptConfig", "eager", {}, "eager"),  # ALiBi on key columns
    "bloom": ("BloomConfig", "eager", {}, "eager"),  # ALiBi on the attention mask's count of real tokens
    "falcon_alibi": ("FalconConfig", "eager", {"alibi": True, "new_decoder_architecture": False, "multi_query": False},
                     "eager"),
    "gpt_oss": ("GptOssConfig", "eager", {**_WINDOWED, **_TWO_KINDS, "num_local_experts": 4,
                                          "num_experts_per_tok": 2}, "eager"),
}
MATRIX = {k: v for k, v in MATRIX.items() if hasattr(transformers, v[0])}  # gpt-oss: transformers >= 4.55
#: rows whose RoPE frequencies follow the sequence length: no behaviour log-prob is claimed exact
LENGTH_DEPENDENT = {"llama_dynamic", "phi3_longrope"}
#: rows the backend's prompt-prefix cache refuses: sliding windows, ALiBi on key columns
NO_PREFIX_CACHE = {k for k, v in MATRIX.items() if "sliding_window" in v[2]} | {"mpt"}

SYS = [7, 8, 9, 10, 11, 12]
PROMPTS = [SYS + [20, 21, 22, 23, 24], SYS + [20, 21, 22, 23, 24], SYS + [30, 31], SYS + [40, 41, 42, 43]]
NEW = 8
GREEDY = SamplingConfig(max_new_tokens=NEW, temperature=0.0)
SAMPLED = SamplingConfig(max_new_tokens=NEW, temperature=0.7, top_p=0.9, top_k=20, seed=5)
DECODES = ["eager", "static"] + (["graph"] if torch.cuda.is_available() else [])


def make_model(name: str) -> torch.nn.Module:
    """The seeded tiny random model of one matrix row (float32, eval mode, CPU)."""
    cls, impl, extra, _ = MATRIX[name]
    cfg = getattr(transformers, cls)(**{**_SHAPE, **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).float().eval()
    model.generation_config.eos_token_id = None  # no stop: every call decodes NEW tokens
    model.generation_config.pad_token_id = 0
    return model


def on_device_for(decode: str, model: torch.nn.Module) -> torch.nn.Module:
    """``model`` itself, or for the CUDA-graph rows a copy on CUDA."""
    return copy.deepcopy(model).cuda() if decode == "graph" else model


def generate_greedy(model, prompts):
    """``model.generate``'s greedy continuations, one unpadded call per distinct prompt."""
    dev = next(model.parameters()).device
    done = {}
    for p in map(tuple, prompts):
        if p not in done:
            ids = torch.tensor([p], device=dev)
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                                 min_new_tokens=NEW)
            done[p] = seq[0, len(p):].tolist()
    return [done[tuple(p)] for p in prompts]


@pytest.fixture(scope="module", params=list(MATRIX))
def row(request):
    """``(name, model, generate's greedy tokens for PROMPTS)``."""
    model = make_model(request.param)
    return request.param, model, generate_greedy(model, PROMPTS)


def behaviour_vs_recompute(model, prompts, gens, s: SamplingConfig) -> float:
    """max |behaviour - recompute| (nats) over the generated tokens; the recompute is the trainer's
    ``token_log_probs`` on right-padded prompt + generation rows."""
    seqs = [torch.tensor(p + g.token_ids) for p, g in zip(prompts, gens)]
    ids = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True).to(next(model.parameters()).device)
    am = torch.nn.utils.rnn.pad_sequence([torch.ones_like(q) for q in seqs], batch_first=True).to(ids.device)
    with torch.no_grad():
        lp, _ = token_log_probs(model, ids, am, temperature=s.temperature or 1.0, top_p=s.top_p, top_k=s.top_k)
    return max(float((lp[i, len(p): len(p) + len(g.token_ids)].cpu() - torch.tensor(g.logprobs)).abs().max())
               for i, (p, g) in enumerate(zip(prompts, gens)))


@pytest.mark.parametrize("decode", DECODES)
def test_every_decode_path_is_exact_or_falls_back(row, decode):
    name, model, want = row
    if decode == "graph":
        model = on_device_for(decode, model)
        want = generate_greedy(model, PROMPTS)
    be = TransformersBackend(model, pad_token_id=0, decode=decode, prefix_cache_min_tokens=4)
    gens = be.generate(PROMPTS, GREEDY)
    assert be.decode_path == (decode if MATRIX[name][3] == "static" else "eager")
    assert [g.token_ids for g in gens] == want
    assert behaviour_vs_recompute(model, PROMPTS, gens, GREEDY) < 1e-4
    sampled = be.generate(PROMPTS, SAMPLED)
    assert behaviour_vs_recompute(model, PROMPTS, sampled, SAMPLED) < 1e-4
    assert (be.stats["prefix_builds"] > 0) == (name not in NO_PREFIX_CACHE)  # where it ran, it was exact
    # within their original length the length-dependent rows are exact too; across it no path is (not claimed)
    assert be.exact_log_probs == (name not in LENGTH_DEPENDENT)


def test_the_rule_matches_the_matrix(row):
    """The table in exact_paths' docstring, on the matrix: which rows take the fixed-shape decode, the preallocated
    KV cache, the backend's prompt-prefix cache and the shared-prefix update (the decode test shows each exact)."""
    name, model, _ = row
    assert (fixed_shape_decode_refusal(model, columns=len(PROMPTS[0]) + NEW) is None) == (MATRIX[name][3] == "static")
    # full and sliding-window layers: exact (the next test); length-dependent RoPE: the prefix alone runs at another
    # length than the whole row (0.52 / 3.3 nats across the original length, tests/test_exact_paths_positions.py)
    assert (shared_prefix_refusal(model) is None) == (name not in LENGTH_DEPENDENT)
    assert (exact_log_probs_refusal(model) is None) == (name not in LENGTH_DEPENDENT)
    assert supports_preallocation(model)
    # prompt-prefix cache: full attention only, no ALiBi on key columns; with a window it gave 1.4 nats (Mistral,
    # window 4) and 47 (gemma2, gpt-oss) from the recompute on PROMPTS (prefix + left-padded suffixes: padding between
    # real tokens), MPT 0.059 greedy / 0.156 sampled
    assert (prefix_cache_refusal(model) is None) == (name not in NO_PREFIX_CACHE)


def test_shared_prefix_update_equals_the_plain_one_or_refuses(row):
    name, model, _ = row
    model.train()  # no dropout in these configs; gradients as in the update
    tokens, am, rm = _multi_turn_rows(prefix_len=9, n=3, vocab=VOCAB)
    ref_lp, ref_g = _plain(model, tokens, am, rm)
    P = shared_prefix_length(tokens, am, rm)
    dec_head = _decoder_and_head(model)
    if dec_head is None:  # logit soft-capping (gemma2, gemma3 here): the update runs the model's own forward
        assert model.config.final_logit_softcapping is not None
    elif name in LENGTH_DEPENDENT:  # refused: the update runs whole episodes
        assert build_shared_prefix(model, dec_head[0], tokens[0, :P]) is None
    else:
        assert build_shared_prefix(model, dec_head[0], tokens[0, :P]) is not None
        lp, g = _shared(model, tokens, am, rm, [[0, 1], [2]])
        torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
        _assert_grads_close(g, ref_g)
    # the in-pass sharing of token_log_probs (share_prefix=True: one prefix pass per distinct prefix in the batch)
    model.zero_grad(set_to_none=True)
    lp, _ = token_log_probs(model, tokens, am, response_mask=rm, share_prefix=True)
    (lp * torch.linspace(0.5, 1.5, tokens.numel()).reshape(tokens.shape)).sum().backward()
    torch.testing.assert_close(lp.detach(), ref_lp, atol=1e-5, rtol=0)
    _assert_grads_close({n: p.grad for n, p in model.named_parameters() if p.grad is not None}, ref_g)
    model.eval()


def _two_adapters():
    from peft import LoraConfig, get_peft_model

    base = make_model("llama_sdpa")
    torch.manual_seed(1)
    lora = dict(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    model = get_peft_model(base, LoraConfig(**lora))
    model.add_adapter("other", LoraConfig(**lora))
    return model.eval()


@pytest.mark.parametrize("decode", DECODES)
def test_switching_or_disabling_an_adapter_changes_the_next_decode(decode):
    model = on_device_for(decode, _two_adapters())
    be = TransformersBackend(model, pad_token_id=0, decode=decode, prefix_cache_min_tokens=4)
    seen = {}
    for state in ("default", "other", "disabled", "default"):
        if state == "disabled":
            with model.disable_adapter():
                fp = parameter_fingerprint(model)
                got, want = [g.token_ids for g in be.generate(PROMPTS, GREEDY)], generate_greedy(model, PROMPTS)
        else:
            model.set_adapter(state)
            fp = parameter_fingerprint(model)
            got, want = [g.token_ids for g in be.generate(PROMPTS, GREEDY)], generate_greedy(model, PROMPTS)
        assert got == want, state
        assert be.decode_path == ("static" if decode == "static" else decode)
        seen.setdefault(state, (got, fp))
        assert seen[state] == (got, fp)  # back on the first adapter: its tokens and fingerprint again
    assert len({tuple(map(tuple, g)) for g, _ in seen.values()}) == 3  # each adapter state decodes differently
    assert len({fp for _, fp in seen.values()}) == 3  # and a captured graph would be recaptured for each
    if decode == "graph":  # CUDA only: one capture per adapter state (4 switches)
        assert be._static.stats["graph_captures"] >= 4, be._static.stats
