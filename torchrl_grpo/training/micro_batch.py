"""Split a minibatch of episodes into micro-batches (gradient accumulation) by sequence count and token budget.

Memory of a forward/backward grows with the *padded* size of a micro-batch, ``rows x longest row`` (activations,
KV, attention), so a fixed ``micro_batch_size`` either wastes throughput on short GSM8K answers or is OOM-killed on
10k-token tau2 episodes. With ``max_tokens`` the split packs consecutive episodes while the padded size stays
within the budget — AReaL's ``mb_spec.max_tokens_per_mb`` (Fu et al., 2025, arXiv:2505.24298, the released
``MicroBatchSpec``); an episode longer than the budget gets a micro-batch of its own (it cannot be split: its
tokens attend to each other). Episodes keep their order, so a GRPO group's episodes stay together and share one
prompt forward (:mod:`torchrl_grpo.objectives.log_probs`).
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["split_micro_batches", "has_scored_token"]


def has_scored_token(mb) -> bool:
    """Whether the micro-batch ``mb`` (a TensorDict [b] with ``response_mask`` and ``attention_mask`` [b, T]) holds
    a token the loss scores: a sampled (response) token that is a real token. A micro-batch without one (e.g. only
    episodes whose prompt reached ``rollout.max_context_tokens`` and were collected with 0 response tokens) is not
    run, neither by the update nor by a no-grad recompute (:class:`~torchrl_grpo.training.update.GRPOUpdate`): its
    loss and log-probs are 0 by definition. For a collector batch this is exactly "its loss normaliser is > 0", for
    every ``loss.aggregation`` (``response_tokens`` is the row sum of ``response_mask``, inside ``attention_mask``)."""
    return bool((mb["response_mask"].bool() & mb["attention_mask"].bool()).any())


def split_micro_batches(lengths: Sequence[int], max_count: int, max_tokens: int = 0) -> list[list[int]]:
    """Group row indices ``0..len(lengths)-1`` into consecutive micro-batches.

    Args:
        lengths: real (unpadded) token count of each episode.
        max_count: at most this many episodes per micro-batch (``train.micro_batch_size``), >= 1.
        max_tokens: padded-token budget per micro-batch, ``len(mb) * max(lengths[mb]) <= max_tokens``
            (``train.max_tokens_per_mb``); 0 disables the budget.

    Returns:
        Lists of row indices, in order, covering every row exactly once.

    Raises:
        ValueError: ``max_count < 1`` or ``max_tokens < 0``.
    """
    if max_count < 1:
        raise ValueError(f"max_count must be >= 1, got {max_count}")
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        n = int(n)
        grown = max(longest, n)
        if cur and (len(cur) >= max_count or (max_tokens and (len(cur) + 1) * grown > max_tokens)):
            out.append(cur)
            cur, grown = [], n
        cur.append(i)
        longest = grown
    if cur:
        out.append(cur)
    return out
