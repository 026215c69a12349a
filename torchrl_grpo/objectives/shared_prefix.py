r"""One prefix forward/backward for every episode of a minibatch that starts with the same tokens.

A tau2 telecom episode is a ~9.9k-token prefix (policy, 44 tool schemas, ticket) and a few hundred generated and
tool tokens; the G episodes of a GRPO group (and, up to the ticket, every task of a domain) share that prefix. The
plain update runs it once per episode: 351 s of bf16 + gradient-checkpointing forward/backward per episode on 2 cores
(``benchmarks/results/tau2_telecom_run.md``). Here it runs once per minibatch, exactly (same log-probs and gradients
up to float rounding), with or without gradient checkpointing, across micro-batches:

1. **Prefix pass** (:func:`build_shared_prefix`): the decoder runs over the prefix ``tokens[0, :P]`` with a
   *capture* cache as ``past_key_values``; each attention layer hands it its keys/values ``[1, kv_heads, P, d]``.
   The cache is write-once per layer, so the backward replay of non-reentrant gradient checkpointing (which re-runs
   the layer, cache update included) neither appends twice nor changes what the layer sees.
2. **Leaves**: the captured K/V are detached into leaf tensors (``requires_grad`` when gradients are on). Every
   micro-batch's remainders ``tokens[:, P:]`` (responses, tool and user tokens between turns) run against a
   *read-only* cache view over the leaves (:meth:`SharedPrefix.cache`: ``update`` returns
   ``cat(prefix, new)`` and stores nothing, so a checkpoint replay sees the same keys), with position ids
   continuing from ``P`` and the 2-D attention mask covering prefix + remainder. Each micro-batch's backward
   accumulates ``.grad`` on the leaves (and on the parameters, for the remainder's own computation).
3. **Prefix backward** (:meth:`SharedPrefix.backward`): after the last micro-batch,
   ``torch.autograd.backward(captured_kv, grad_tensors=leaf_grads)`` pushes the summed remainder gradients through
   the one prefix pass. By the chain rule this is the gradient of the plain per-episode forward: the prefix
   activations are the same function of the parameters in every episode (causal attention: a prefix position never
   sees the remainder), so d(loss)/d(theta) = sum over episodes of (d loss / d K/V_prefix) (d K/V_prefix / d theta).

No-grad recomputes (reference, PPO anchor) use a no-grad prefix the same way (step 1 without a graph).

Gradient checkpointing: HF's ``GradientCheckpointingLayer`` drops ``past_key_values`` under checkpointing unless
the layer sets ``_can_checkpoint_with_cache`` (transformers ``modeling_layers.py``: "writers must leave it False,
otherwise the cache is updated a second time on the backward replay"). Both caches here are replay-safe (write-once
capture, read-only view), so :func:`cache_under_checkpointing` sets the instance attribute for the duration of a
forward. Only non-reentrant checkpointing is supported: with ``use_reentrant=True`` no gradient reaches tensors the
layer reads from a closure (the leaves), so :func:`supports_shared_prefix` says no and the plain path runs.

Where it does not apply, the caller uses the plain path: attention layouts
:func:`torchrl_grpo.exact_paths.shared_prefix_refusal` refuses (neither full nor sliding-window), models
whose logits are not ``lm_head(decoder(...))`` or
whose decoder takes no ``past_key_values`` (the capture cache stays empty), rows with no common real-token prefix
before the first scored column (left padding, a single row).
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from torchrl_grpo.exact_paths import note_fallback, shared_prefix_refusal

__all__ = ["SharedPrefix", "shared_prefix_length", "build_shared_prefix", "cache_under_checkpointing",
           "supports_shared_prefix", "sharing_pays", "CUDA_MIN_SAVED_TOKEN_PARAMS"]

#: On CUDA a prefix pass is one more decoder forward (and backward) per update or micro-batch, and at the batch sizes of
#: small-model GRPO a pass is bound by kernel launches, not arithmetic: one pass of our update dispatched 14.4k aten ops
#: with prompt sharing vs 7.1k without (SmolLM2-135M shape, 4 rows; counted with a dispatch mode on CPU), and on an H100
#: a 4-row pass took 0.28 s (16 passes 4.51 s; benchmarks/results/gpu_h100_first), ~20 us per op. So the extra
#: ~7k-op pass costs ~0.14 s, what ~2.8e13 FLOP take at an effective 200 TFLOP/s bf16, i.e. 6 x tokens x params
#: for tokens x params ~ 4.7e12. Sharing pays on CUDA only when the tokens it saves times the parameter count exceed
#: this (a tau2 prompt of 10k tokens x 63 episodes x 135M params: 8.5e13, shared; a GSM8K prompt of 80 tokens x 63
#: episodes: 6.8e11, not). On CPU every saved token is arithmetic saved, so any saving pays.
CUDA_MIN_SAVED_TOKEN_PARAMS = 4e12


def _num_params(model: torch.nn.Module) -> int:
    n = getattr(model, "_torchrl_grpo_num_params", None)
    if n is None:
        n = sum(p.numel() for p in model.parameters())
        try:
            model._torchrl_grpo_num_params = n
        except (AttributeError, TypeError):
            pass
    return n


def sharing_pays(saved_tokens: int, model: torch.nn.Module, device: torch.device | str) -> bool:
    """Whether running a shared prefix once (one extra decoder pass) beats running its ``saved_tokens`` in every row:
    any saving on CPU; on CUDA ``saved_tokens x parameters >= CUDA_MIN_SAVED_TOKEN_PARAMS`` (launch-bound passes)."""
    if saved_tokens <= 0:
        return False
    if torch.device(device).type != "cuda":
        return True
    return saved_tokens * _num_params(model) >= CUDA_MIN_SAVED_TOKEN_PARAMS


def shared_prefix_length(tokens: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor) -> int:
    """Length ``P`` of the longest token prefix common to all rows, made of real tokens only, and ending at least one
    column before the first scored column (the output at column ``s-1`` predicts the first response token ``s``, so
    it must be computed in the remainder pass).

    Args:
        tokens: long [B, T]; attention_mask: [B, T], 1 for real tokens; response_mask: bool [B, T], scored tokens.

    Returns:
        ``P`` in ``[0, T)``; 0 when ``B < 2`` (nothing to share) or the rows differ at column 0.
    """
    B, T = tokens.shape
    if B < 2:
        return 0
    am = attention_mask.bool()
    same = (tokens == tokens[:1]).all(0) & am.all(0)  # [T]: column identical and real in every row
    P = int(same.long().cumprod(0).sum())
    cols = response_mask.bool().any(0).nonzero()
    if cols.numel():
        P = min(P, int(cols[0]) - 1)
    return max(P, 0)


def _checkpointing_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if hasattr(m, "_can_checkpoint_with_cache")]


def _uses_reentrant_checkpointing(model: torch.nn.Module) -> bool:
    for m in _checkpointing_layers(model):
        if getattr(m, "gradient_checkpointing", False):
            fn = getattr(m, "_gradient_checkpointing_func", None)
            kw = getattr(fn, "keywords", None) or {}
            return kw.get("use_reentrant", True) is not False
    return False


def supports_shared_prefix(model: torch.nn.Module, decoder: torch.nn.Module) -> bool:
    """Whether ``decoder`` takes ``past_key_values``, gradients can reach the prefix leaves (no reentrant
    gradient checkpointing) and its attention layout is one the prefix caches are exact for
    (:func:`~torchrl_grpo.exact_paths.shared_prefix_refusal`; a refusal is logged once)."""
    reason = shared_prefix_refusal(model)
    if reason is not None:
        note_fallback(model, "shared-prefix update", reason)
        return False
    try:
        params = inspect.signature(decoder.forward).parameters
    except (TypeError, ValueError):
        return False
    return "past_key_values" in params and not _uses_reentrant_checkpointing(model)


@contextmanager
def cache_under_checkpointing(model: torch.nn.Module):
    """Let HF checkpointed layers keep ``past_key_values`` (``layer._can_checkpoint_with_cache = True`` as an
    instance attribute) for the duration; only for the replay-safe caches of this module."""
    layers = _checkpointing_layers(model)
    had = [("_can_checkpoint_with_cache" in vars(m), vars(m).get("_can_checkpoint_with_cache")) for m in layers]
    for m in layers:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m, (own, val) in zip(layers, had):
            if own:
                m._can_checkpoint_with_cache = val
            else:
                del m._can_checkpoint_with_cache


def _layer_classes():
    from transformers.cache_utils import DynamicLayer

    class CaptureLayer(DynamicLayer):
        """Keeps the first keys/values it is given (write-once: a checkpoint replay does not append) and returns
        the given ones, as an empty cache would."""

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self.keys, self.values = key_states, value_states
            return key_states, value_states

    class PrefixViewLayer(DynamicLayer):
        """Read-only view over prefix keys/values [1, h, P, d]: ``update`` returns ``cat(prefix, new)`` per row and
        stores nothing."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor):
            super().__init__()
            self.lazy_initialization(keys, values)
            self.keys, self.values = keys, values

        def update(self, key_states, value_states, *args, **kwargs):
            b = key_states.shape[0]
            k = self.keys.to(key_states.dtype).expand(b, -1, -1, -1)
            v = self.values.to(value_states.dtype).expand(b, -1, -1, -1)
            return torch.cat([k, key_states], dim=-2), torch.cat([v, value_states], dim=-2)

    return CaptureLayer, PrefixViewLayer


@dataclass
class SharedPrefix:
    """K/V of one token prefix, computed once and read by every remainder of a minibatch.

    Attributes:
        tokens: long [P], the prefix.
        keys / values: per attention layer, [1, kv_heads, P, head_dim] leaf tensors (``requires_grad`` when built with
            gradients on); their ``.grad`` accumulates over the micro-batches' backward passes.
        captured: per layer, the prefix pass's own (graph-attached) keys and values; empty without gradients.
    """

    tokens: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    captured: list[torch.Tensor] = field(default_factory=list)

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])

    def cache(self):
        """A fresh read-only ``transformers`` cache over the prefix (one per forward; it holds no state)."""
        from transformers.cache_utils import Cache

        _, view = _layer_classes()
        return Cache(layers=[view(k, v) for k, v in zip(self.keys, self.values)])

    def matches(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> bool:
        """Whether every row of ``tokens`` [b, T] starts with the prefix, all real tokens (a host read)."""
        return tokens.shape[1] > self.length and bool(self.matches_on_device(tokens, attention_mask))

    def matches_on_device(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """:meth:`matches` as a bool 0-d tensor on ``tokens``' device, read by nobody (no sync); rows of at most
        ``length`` tokens give False."""
        P = self.length
        if tokens.shape[1] <= P:
            return torch.zeros((), dtype=torch.bool, device=tokens.device)
        same = (tokens[:, :P] == self.tokens.to(tokens.device, non_blocking=True)).all()
        return same & attention_mask[:, :P].bool().all()

    def backward(self) -> None:
        """Push the leaves' accumulated gradients through the prefix pass (once, after the last micro-batch that
        reads the prefix), then free the graph. A no-op without gradients or when no remainder reached the leaves."""
        pairs = [(c, leaf.grad) for c, leaf in zip(self.captured, self.keys + self.values)
                 if leaf.grad is not None and c.requires_grad]
        self.captured = []
        if pairs:
            torch.autograd.backward([c for c, _ in pairs], grad_tensors=[g for _, g in pairs])
        for leaf in self.keys + self.values:
            leaf.grad = None


def build_shared_prefix(model: torch.nn.Module, decoder: torch.nn.Module, prefix: torch.Tensor) -> SharedPrefix | None:
    """Run ``decoder`` over ``prefix`` (long [P]) once and capture every attention layer's keys/values.

    Gradients follow ``torch.is_grad_enabled()``: with them on, the result's leaves take the remainders' gradients and
    :meth:`SharedPrefix.backward` must be called after the last remainder backward. Works under non-reentrant
    gradient checkpointing (:func:`cache_under_checkpointing`).

    Returns:
        The :class:`SharedPrefix`, or None when the decoder does not support it (see :func:`supports_shared_prefix`)
        or hands no keys/values to its cache.
    """
    from transformers.cache_utils import Cache

    if prefix.ndim != 1 or prefix.numel() == 0 or not supports_shared_prefix(model, decoder):
        return None
    capture, _ = _layer_classes()
    cache = Cache(layer_class_to_replicate=capture)
    P = prefix.shape[0]
    ids = prefix[None]
    with cache_under_checkpointing(model):
        decoder(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(P, device=ids.device)[None],
                past_key_values=cache, use_cache=True)
    layers = list(cache.layers)
    if not layers or not all(getattr(layer, "is_initialized", False) and layer.keys is not None for layer in layers):
        return None
    cap_k, cap_v = [layer.keys for layer in layers], [layer.values for layer in layers]
    grad = torch.is_grad_enabled()

    def leaf(t: torch.Tensor) -> torch.Tensor:
        return t.detach().requires_grad_(grad and t.requires_grad)

    return SharedPrefix(tokens=prefix.detach(), keys=[leaf(t) for t in cap_k], values=[leaf(t) for t in cap_v],
                        captured=(cap_k + cap_v) if grad else [])
