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
