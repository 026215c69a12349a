"""The rollout-backend interface: what the collector needs from an inference engine.

A backend turns token-id prompts into sampled continuations with the behaviour log-probs of every
sampled token, and accepts new weights from the trainer after each optimizer step.
Implementations: :mod:`torchrl_grpo.backends.transformers_backend` (embedded default) and
:mod:`torchrl_grpo.backends.vllm_backend` (optional extra ``[vllm]``).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch

__all__ = ["SamplingConfig", "Generation", "RolloutBackend"]


@dataclass
class SamplingConfig:
    """Sampling settings for one ``generate`` call.

    Attributes:
        max_new_tokens: upper bound on generated tokens per prompt (tokens).
        temperature: softmax temperature; ``0`` means greedy decoding.
        top_p: nucleus sampling mass in (0, 1].
        top_k: sample among the ``top_k`` most likely tokens only (ties at the k-th logit kept); 0 disables it.
            Temperature, top-k and top-p are applied in that order, as defined in :mod:`torchrl_grpo.objectives.sampling`;
            with ``temperature == 0`` (greedy) neither truncation applies.
        stop_token_ids: generation ends after any of these tokens (it is included in the output).
        seed: optional seed for reproducible sampling.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")


@dataclass
class Generation:
    """One sampled continuation.

    Attributes:
        token_ids: sampled token ids, length L (L <= max_new_tokens), including a final stop token if hit.
        logprobs: behaviour log-probs (nats) of each sampled token under the sampling policy, length L.
            These are log-softmax of the processed logits (temperature, top-k, top-p:
            :func:`torchrl_grpo.objectives.sampling.processed_logits`) — the distribution actually sampled.
        finish_reason: ``"stop"`` (a stop token was produced) or ``"length"`` (hit max_new_tokens).
        versions: ``policy_version`` of the weights that sampled each token, length L; ``None`` when the backend
            does not record it (then every token is of the version the backend held when ``generate`` returned).
            Tokens of one generation carry two or more versions only with partial rollouts
            (:attr:`RolloutBackend.weight_update_hook`).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    versions: list[int] | None = None


class RolloutBackend(abc.ABC):
    """Abstract rollout engine.

    ``policy_version`` counts weight syncs: 0 for the initial weights, +1 per :meth:`load_weights` /
    :meth:`sync_from`. The trainer only calls :meth:`sync_from`; what a sync costs (nothing for a shared module, an
    export and a copy otherwise) is the backend's business.
    """

    policy_version: int = 0

    #: Partial rollouts — AReaL (Fu et al., 2025, arXiv:2505.24298) Sec. 5.1 "interruptible rollout", APRIL (2025):
    #: when set (with ``partial_rollout_chunk > 0``), a backend that supports them calls ``weight_update_hook()``
    #: after every ``partial_rollout_chunk`` sampled tokens of a ``generate`` call; if the hook loaded new weights
    #: (``policy_version`` moved), the unfinished sequences continue under the new weights (their context is
    #: re-encoded with them), and each token's :attr:`Generation.versions` entry records the version that sampled it.
    #: A backend without support ignores both (whole generations with one version).
    weight_update_hook: Callable[[], None] | None = None
    partial_rollout_chunk: int = 0

    @abc.abstractmethod
    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[Generation]:
        """Sample one continuation per prompt.

        Args:
            prompts: B token-id lists (unpadded, may differ in length). Repeat a prompt n times for a group.
            sampling: sampling settings.

        Returns:
            B :class:`Generation` objects, in prompt order.

        Raises:
            ValueError: an empty prompt list or an empty prompt.
        """

    @abc.abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | dict[str, torch.Tensor]) -> None:
        """Receive new policy weights (HF parameter names, full merged weights) and bump ``policy_version``."""

    def sync_from(self, model: torch.nn.Module, *, probe: list[int] | None = None) -> None:
        """Bring the engine to the trainer's current policy and bump ``policy_version``.

        The default exports the full weights under HF names, LoRA merged
        (:func:`torchrl_grpo.backends.weight_sync.export_hf_weights`), and hands them to :meth:`load_weights`; an engine
        that samples from the trainer's own module overrides this with a version bump only.

        Args:
            model: the trainer's policy (HF causal LM or peft model).
            probe: optional token ids of one collected episode; a backend that checks its sync (vLLM with
                ``check_sync_every``) scores it under both models. Others ignore it.

        Afterwards :attr:`last_sync_stats` holds the sync's diagnostics as a flat ``{metric: float}`` dict
        (empty when nothing was measured), for the trainer to log.
        """
        from torchrl_grpo.backends.weight_sync import export_hf_weights

        self.load_weights(export_hf_weights(model))
        self.last_sync_stats = {}

    last_sync_stats: dict[str, float] = {}

    @property
    def exact_log_probs(self) -> bool:
        """Whether the behaviour log-probs this backend returns are the trainer's own numerics (same module, same
        precision, no autocast of its own), so that they can serve as the PPO ratio anchor as they are. False (the
        default) makes the trainer recompute the anchor with a no-grad pass (see :mod:`torchrl_grpo.objectives.loss`)."""
        return False

    @property
    def decode_path(self) -> str:
        """The decode path of this backend's last ``generate`` (before any, the one it would take), a short name the
        trainers log every step as ``rollout/decode`` (docs/metrics.md) beside ``rollout/logp_diff_*``, the gap
        between its behaviour log-probs and the trainer's recompute: a fast path that is not exact for the model
        shows up there. ``"default"`` (this default) for a backend with one path; the transformers backend says
        ``"eager"`` | ``"static"`` | ``"graph"`` (``rollout.decode`` resolved for the model and device), vLLM ``"vllm"``."""
        return "default"

    def close(self) -> None:  # noqa: B027 (optional hook: a backend without engine resources keeps this no-op)
        """Release engine resources (a no-op unless the backend holds an engine)."""


def iter_named_weights(weights: Iterable[tuple[str, torch.Tensor]] | dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Normalise a state dict or an iterator of (name, tensor) pairs into an iterator of pairs."""
    if isinstance(weights, dict):
        return iter(weights.items())
    return iter(weights)
