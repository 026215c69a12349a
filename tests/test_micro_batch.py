"""torchrl_grpo.training.micro_batch: the one "micro-batch has a scored token" predicate the update and its no-grad
recomputes filter micro-batches with."""
from __future__ import annotations

import torch
from tensordict import TensorDict

from torchrl_grpo.training.micro_batch import has_scored_token


def _mb(response_mask, attention_mask):
    rm, am = torch.tensor(response_mask, dtype=torch.bool), torch.tensor(attention_mask, dtype=torch.bool)
    return TensorDict(response_mask=rm, attention_mask=am, batch_size=[rm.shape[0]])


def test_a_response_token_among_the_real_tokens_is_scored():
    assert has_scored_token(_mb([[0, 0, 1, 0]], [[1, 1, 1, 0]]))
    assert has_scored_token(_mb([[0, 0, 0, 0], [0, 1, 0, 0]], [[1, 1, 0, 0], [1, 1, 1, 1]]))


def test_prompt_only_episodes_and_masked_response_columns_are_not():
    assert not has_scored_token(_mb([[0, 0, 0, 0], [0, 0, 0, 0]], [[1, 1, 1, 1], [1, 1, 0, 0]]))  # prompt only
    assert not has_scored_token(_mb([[0, 0, 0, 1]], [[1, 1, 1, 0]]))  # a response column that is padding
    assert not has_scored_token(_mb(torch.zeros(0, 3).tolist(), torch.zeros(0, 3).tolist()))  # an empty shard


# ------------------------------------------------------------------ issue 35 item 2: the plan and the auto budget
import pytest  # noqa: E402
from transformers import LlamaConfig  # noqa: E402

from torchrl_grpo.training.micro_batch import (  # noqa: E402
    CPU_ACTIVATION_BYTES, UNKNOWN_MODEL_BYTES_PER_TOKEN, activation_bytes_per_token, auto_token_budget,
    decoder_positions, plan_micro_batches)


def test_sorting_by_length_is_kept_when_it_computes_less_padding():
    lengths = [50, 10, 50, 10]  # long, short, long, short; two per micro-batch
    assert decoder_positions([[0, 1], [2, 3]], lengths) == 200
    plan = plan_micro_batches(lengths, 2)
    assert plan == [[0, 2], [1, 3]] and decoder_positions(plan, lengths) == 120
    # everything fits one micro-batch: batch order, one pass (no count limit, no budget)
    assert plan_micro_batches(lengths, 0) == [[0, 1, 2, 3]]
    assert plan_micro_batches(lengths, 0, max_tokens=200) == [[0, 1, 2, 3]]
    # a token budget: sorted rows pack tighter (100 padded tokens: [50, 50] and [10, 10])
    assert plan_micro_batches(lengths, 0, max_tokens=100) == [[0, 2], [1, 3]]
    assert sorted(sum(plan_micro_batches([7, 3, 9, 1, 4], 2, 12), [])) == [0, 1, 2, 3, 4]


def test_batch_order_is_kept_when_groups_share_their_prompts():
    """Two groups of two whose rows share a 40-token prompt: sorting by length splits the groups and loses the
    per-micro-batch prompt sharing, which saves more than the padding it adds."""
    lengths, key, cols = [60, 45, 58, 44], [0, 0, 1, 1], [40, 40, 40, 40]
    consecutive = decoder_positions([[0, 1], [2, 3]], lengths, key, cols)
    assert consecutive == 2 * 60 - 40 + 2 * 58 - 40
    assert decoder_positions([[0, 2], [1, 3]], lengths, key, cols) > consecutive
    assert plan_micro_batches(lengths, 2, 0, key, cols) == [[0, 1], [2, 3]]
    assert plan_micro_batches(lengths, 2) == [[0, 2], [1, 3]]  # without the sharing, sorting wins


def test_plan_refuses_negative_limits():
    with pytest.raises(ValueError, match="max_count"):
        plan_micro_batches([1], -1)
    with pytest.raises(ValueError, match="max_tokens"):
        plan_micro_batches([1, 2], 1, -1)


class _Model(torch.nn.Module):
    def __init__(self, **dims):
        super().__init__()
        self.config = LlamaConfig(**dims)


def test_activation_estimate_matches_the_measured_qwen_slope_and_sets_the_cpu_budget():
    qwen = _Model(num_hidden_layers=24, hidden_size=896, intermediate_size=4864, num_attention_heads=14)
    per_token = activation_bytes_per_token(qwen)
    # benchmarks/results/microbatch_memory_fp32_nogc.md: 2.93 GB per 1k padded tokens measured
    assert 2.8e9 <= per_token * 1000 <= 3.2e9
    smol = _Model(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, num_attention_heads=9)
    assert auto_token_budget(smol, torch.device("cpu"), 400) == CPU_ACTIVATION_BYTES // activation_bytes_per_token(smol)
    assert 2500 <= auto_token_budget(smol, torch.device("cpu"), 400) <= 3200
    # an episode longer than the budget still gets its own micro-batch; a model without dimensions: the fallback
    assert auto_token_budget(qwen, torch.device("cpu"), 10**6) == 10**6
    assert activation_bytes_per_token(torch.nn.Linear(2, 2)) == UNKNOWN_MODEL_BYTES_PER_TOKEN
