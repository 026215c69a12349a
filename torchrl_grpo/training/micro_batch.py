"""Split a minibatch of episodes into micro-batches (gradient accumulation) by sequence count and token budget.

Memory of a forward/backward grows with the *padded* size of a micro-batch, ``rows x longest row`` (activations,
KV, attention), so a fixed ``micro_batch_size`` either wastes throughput on short GSM8K answers or is OOM-killed on
10k-token tau2 episodes. With ``max_tokens`` the split packs episodes while the padded size stays within the
budget — AReaL's ``mb_spec.max_tokens_per_mb`` (Fu et al., 2025, arXiv:2505.24298, the released ``MicroBatchSpec``);
an episode longer than the budget gets a micro-batch of its own (it cannot be split: its tokens attend to each
other).

Padding is computed too: a micro-batch runs ``rows x longest row`` positions, so :func:`plan_micro_batches` also
tries the episodes sorted by length (longest first; equal lengths keep their order), each micro-batch then holding
rows of similar length, and keeps that plan when it computes fewer decoder positions (:func:`decoder_positions`).
Batch order is kept otherwise: it keeps a GRPO group's episodes together, and a micro-batch's rows with the same
prompt run that prompt once (:mod:`torchrl_grpo.objectives.log_probs`), which a sorted plan may split.
Sums of per-token terms do not depend on which micro-batch a row lands in, so any plan gives the same gradient up to
float addition order (tests/test_micro_batch.py, tests/test_update_syncs.py).

The auto budget (``train.max_tokens_per_mb: auto``, :func:`auto_token_budget`): an activation-memory allowance
divided by an estimate of the activation bytes one padded token keeps for the backward pass.
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["split_micro_batches", "plan_micro_batches", "decoder_positions", "has_scored_token",
           "activation_bytes_per_token", "auto_token_budget", "CPU_ACTIVATION_BYTES", "CUDA_ACTIVATION_FRACTION",
           "UNKNOWN_MODEL_BYTES_PER_TOKEN"]

#: Activation memory (bytes) the ``auto`` token budget may fill on CPU: a fixed 4 GiB, not "all free memory": a CPU
#: run shares its RAM with the rollout backend, the KV cache, a reference copy and AdamW's state (SmolLM2-135M fp32
#: weights + gradient + 2 moments = 2.2 GB), on 16-24 GiB laptops and CI runners; and past a few hundred rows a
#: bigger CPU matmul is not faster, so one pass per step gains nothing there. SmolLM2-135M at GSM8K lengths (~400
#: tokens): ~2.9k padded tokens per micro-batch (a default GSM8K step: 1-2 passes); Qwen2.5-0.5B: ~1.4k.
CPU_ACTIVATION_BYTES = 4 * 2**30

#: Share of the accelerator's free memory (driver-free plus the caching allocator's unused reserve) the ``auto``
#: token budget may fill with activations on CUDA; the rest is headroom for the LM-head chunks, the optimizer step
#: and fragmentation. One H100 (~78 GB free beside SmolLM2-135M): ~26k padded tokens, so a GSM8K step of 64
#: episodes is one forward/backward pass. Measured (issue 35; random SmolLM2-135M-shaped model, fp32 + bf16
#: autocast, 64 episodes, 9.0k real / 13.8k padded tokens): one pass 0.32 s, peak 13.6 GB, vs 4.2 s in 16
#: passes of 4 episodes before this change.
CUDA_ACTIVATION_FRACTION = 0.5

#: Bytes per padded token assumed for a model whose dimensions :func:`activation_bytes_per_token` cannot read (not
#: an HF config): SmolLM2-135M's estimate (1.47 MB), rounded up.
UNKNOWN_MODEL_BYTES_PER_TOKEN = 2 * 2**20


def has_scored_token(mb) -> bool:
    """Whether the micro-batch ``mb`` (a TensorDict [b] with ``response_mask`` and ``attention_mask`` [b, T]) holds
    a token the loss scores: a sampled (response) token that is a real token. A micro-batch without one (e.g. only
    episodes whose prompt reached ``rollout.max_context_tokens`` and were collected with 0 response tokens) is not
    run, neither by the update nor by a no-grad recompute (:class:`~torchrl_grpo.training.update.GRPOUpdate`): its
    loss and log-probs are 0 by definition. For a collector batch this is exactly "its loss normaliser is > 0", for
    every ``loss.aggregation`` (``response_tokens`` is the row sum of ``response_mask``, inside ``attention_mask``).
    A host read (a device sync); the update decides it from per-row counts it reads once per minibatch instead."""
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


def decoder_positions(plan: Sequence[Sequence[int]], lengths: Sequence[int],
                      prompt_key: Sequence[int] | None = None, prompt_cols: Sequence[int] | None = None) -> int:
    """Decoder positions the micro-batches of ``plan`` run: each ``rows x longest row``, less, with ``prompt_key``,
    the prompt columns its rows share (rows with the same key run their first ``min(prompt_cols[rows])`` columns
    once: the per-micro-batch prompt sharing of :mod:`torchrl_grpo.objectives.log_probs`).

    Args:
        plan: lists of row indices (:func:`split_micro_batches`).
        lengths: tokens of each row (the micro-batch is cut to its longest).
        prompt_key: per row, an id equal for rows whose shareable columns hold the same tokens (None: no sharing).
        prompt_cols: per row, its shareable columns (the columns before the output predicting its first scored
            token), >= 0.

    Returns:
        The count, an int >= 0.
    """
    total = 0
    for rows in plan:
        if not rows:
            continue
        longest = max(int(lengths[r]) for r in rows)
        total += len(rows) * longest
        if prompt_key is not None and prompt_cols is not None and len(rows) > 1:
            shared = max(0, min(min(int(prompt_cols[r]) for r in rows), longest))
            total -= (len(rows) - len({prompt_key[r] for r in rows})) * shared
    return total


def plan_micro_batches(lengths: Sequence[int], max_count: int, max_tokens: int = 0,
                       prompt_key: Sequence[int] | None = None,
                       prompt_cols: Sequence[int] | None = None) -> list[list[int]]:
    """Micro-batches of rows ``0..len(lengths)-1`` within ``max_count`` rows and ``max_tokens`` padded tokens each:
    of the consecutive split (:func:`split_micro_batches`) and the same split of the rows sorted by length (longest
    first, a stable sort), the one running fewer decoder positions (:func:`decoder_positions` with ``prompt_key`` /
    ``prompt_cols``; a tie keeps the consecutive one). One micro-batch when everything fits.

    Args:
        lengths, max_tokens: as :func:`split_micro_batches`.
        max_count: at most this many rows per micro-batch; 0: no count limit (the token budget alone).
        prompt_key / prompt_cols: as :func:`decoder_positions`.

    Returns:
        Lists of row indices covering every row exactly once (within a micro-batch, in plan order).

    Raises:
        ValueError: ``max_count < 0`` or ``max_tokens < 0``.
    """
    if max_count < 0:
        raise ValueError(f"max_count must be >= 0 (0: no count limit), got {max_count}")
    n = len(lengths)
    count = max_count or max(1, n)
    consecutive = split_micro_batches(lengths, count, max_tokens)
    if len(consecutive) <= 1:
        return consecutive
    order = sorted(range(n), key=lambda i: -int(lengths[i]))
    by_length = [[order[j] for j in mb] for mb in split_micro_batches([lengths[i] for i in order], count, max_tokens)]
    cost = lambda plan: decoder_positions(plan, lengths, prompt_key, prompt_cols)  # noqa: E731
    return by_length if cost(by_length) < cost(consecutive) else consecutive


def activation_bytes_per_token(model: torch.nn.Module) -> int:
    """Estimated bytes one padded token of a micro-batch keeps for the backward pass of ``model`` (an HF decoder:
    ``config.num_hidden_layers`` L, ``hidden_size`` H, ``intermediate_size`` I), fp32 activations:
    ``L x (8 H + 5 I) x 4`` (per layer: norm inputs, q/k/v, attention output, o_proj input, gate, up, activation,
    product, down input; after Korthikanti et al., 2022, arXiv:2205.05198, Sec. 4.1, with a gated MLP and an
    attention kernel that keeps no score matrix, as PyTorch's SDPA). Checked against
    ``benchmarks/results/microbatch_memory_fp32_nogc.md`` (Qwen2.5-0.5B fp32 + LoRA, no checkpointing: measured
    2.93 GB per 1k padded tokens, 1 x 2048 and 2 x 1024 alike, so nothing quadratic; this estimate: 3.02 GB).
    Gradient checkpointing keeps less (tau2 telecom, ~10k-token rows: 0.99 GB per 1k measured,
    ``configs/grpo_tau2.yaml``); the estimate ignores it, erring on the safe side. bf16 autocast keeps about half.
    SmolLM2-135M: 1.47 MB per token.

    Returns:
        Bytes per padded token, > 0; :data:`UNKNOWN_MODEL_BYTES_PER_TOKEN` when the dimensions cannot be read.
    """
    cfg = getattr(model, "config", None)
    dims = [getattr(cfg, k, None) for k in ("num_hidden_layers", "hidden_size", "intermediate_size")]
    if not all(isinstance(d, int) and d > 0 for d in dims):
        return UNKNOWN_MODEL_BYTES_PER_TOKEN
    n_layers, hidden, inter = dims
    return n_layers * (8 * hidden + 5 * inter) * 4


def auto_token_budget(model: torch.nn.Module, device: torch.device, longest: int) -> int:
    """The ``auto`` padded-token budget per micro-batch: an activation-memory allowance divided by
    :func:`activation_bytes_per_token` ``(model)``; ``longest``: the longest row of the minibatch (tokens). The
    allowance: on CUDA :data:`CUDA_ACTIVATION_FRACTION` of the device's free memory now (``torch.cuda.mem_get_info`` plus what the caching allocator holds unused; read
    once per minibatch, no stream sync); elsewhere :data:`CPU_ACTIVATION_BYTES`.

    Returns:
        Tokens, >= ``longest`` (one episode always gets its micro-batch) and >= 1.
    """
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        allowance = CUDA_ACTIVATION_FRACTION * (free + max(0, cached))
    else:
        allowance = CPU_ACTIVATION_BYTES
    return max(1, int(longest), int(allowance // activation_bytes_per_token(model)))
