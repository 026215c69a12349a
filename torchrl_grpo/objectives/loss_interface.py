"""The interface between a policy loss and the update that runs it
(:class:`torchrl_grpo.training.update.GRPOUpdate`), and the penalties the update adds to it.

A loss declares, and the update reads, nothing else:

* ``temperature`` / ``top_p`` / ``top_k``: the distribution its log-probs are taken under (the sampling settings;
  :func:`torchrl_grpo.objectives.sampling.processed_logits`). The update's no-grad passes (``ref_log_probs``, the
  recomputed ``old_log_probs``) and continual EWC's Fisher score under the same one.
* ``normaliser``: what its aggregation divides by, so that micro-batch gradients sum to the minibatch's (each
  micro-batch's loss is weighted by its share of the minibatch's normaliser): ``"token"`` (response tokens; a
  token mean) or ``"episode"`` (episodes with a response token; a mean over sequences). One of :data:`NORMALISERS`.
* ``loss(td, *, prefix=None, anchor=None)`` -> TensorDict of scalars: the ``loss_*`` entries (summed and
  backpropagated by :func:`torchrl_grpo.objectives.loss.total_loss`) and metrics, each reduced over micro-batches as
  :data:`torchrl_grpo.objectives.loss.REDUCTIONS` declares. ``prefix``: a shared-prefix pass
  (:mod:`torchrl_grpo.objectives.shared_prefix`) every row starts with; ``anchor``: where this call's PPO anchor
  π_old comes from (:data:`ANCHOR_SOURCES`; per call, never a flag on the loss).

:class:`PolicyLossModule` is a TorchRL ``LossModule`` base that stores the actor and checks the scoring settings;
:class:`~torchrl_grpo.objectives.loss.GRPOLoss` and :class:`~torchrl_grpo.objectives.sft_loss.SFTLoss` derive from
it. :func:`check_policy_loss` is what the update checks of any loss it is given (a duck-typed one too).

A :class:`Penalty` is a named scalar the update adds to every micro-batch's loss output as its own ``loss_*``
entry (``loss_penalty_<name>``: backpropagated with the loss and logged under that name), e.g. continual EWC's
(:class:`torchrl_grpo.continual.algorithms.EWC`). It is not part of the loss: the loss module never sees it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import torch
from tensordict import TensorDictBase
from torchrl.objectives.common import LossModule

__all__ = ["NORMALISERS", "ANCHOR_SOURCES", "PolicyLoss", "PolicyLossModule", "Penalty", "check_policy_loss",
           "resolve_anchor", "penalty_key"]

#: ``normaliser`` values of a loss: what its aggregation divides by (module docstring).
NORMALISERS = ("token", "episode")

#: ``anchor=`` values of a loss call: π_old is the behaviour policy (``sample_log_probs``), the trainer's no-grad
#: recompute (``old_log_probs``, which the input must then carry), or the policy being trained as it is before this
#: optimizer step (the forward's own detached log-probs: one optimizer step per batch, no dropout).
ANCHOR_SOURCES = ("behaviour", "recomputed", "current")


@runtime_checkable
class PolicyLoss(Protocol):
    """What :class:`~torchrl_grpo.training.update.GRPOUpdate` needs of a loss (module docstring)."""

    temperature: float
    top_p: float
    top_k: int
    normaliser: str

    def __call__(self, tensordict: TensorDictBase, *, prefix=None, anchor: str | None = None) -> TensorDictBase:
        ...


def resolve_anchor(tensordict: TensorDictBase, anchor: str | None, key: str = "old_log_probs") -> str:
    """The anchor of one loss call: ``anchor``, or with None ``"recomputed"`` when ``tensordict`` carries ``key``
    and ``"behaviour"`` otherwise.

    Raises:
        ValueError: ``anchor`` not in :data:`ANCHOR_SOURCES`, or ``"recomputed"`` without ``key`` in ``tensordict``.
    """
    if anchor is None:
        return "recomputed" if key in tensordict.keys() else "behaviour"
    if anchor not in ANCHOR_SOURCES:
        raise ValueError(f"anchor must be one of {ANCHOR_SOURCES} or None, got {anchor!r}")
    if anchor == "recomputed" and key not in tensordict.keys():
        raise ValueError(f"anchor='recomputed' needs {key!r} in the input TensorDict")
    return anchor


def check_policy_loss(loss) -> None:
    """Check that ``loss`` declares the :class:`PolicyLoss` interface.

    Raises:
        TypeError: a missing setting, a ``normaliser`` not in :data:`NORMALISERS`, or not callable.
    """
    missing = [a for a in ("temperature", "top_p", "top_k", "normaliser") if not hasattr(loss, a)]
    if missing or not callable(loss):
        raise TypeError(f"{type(loss).__name__} is not a policy loss (torchrl_grpo.objectives.loss_interface."
                        f"PolicyLoss): missing {missing or ['__call__']}")
    if loss.normaliser not in NORMALISERS:
        raise TypeError(f"{type(loss).__name__}.normaliser must be one of {NORMALISERS}, got {loss.normaliser!r}")


class PolicyLossModule(LossModule):
    """A TorchRL ``LossModule`` on a causal LM ``actor`` that declares the :class:`PolicyLoss` settings.

    Subclasses set :attr:`normaliser` and implement ``forward(tensordict, *, prefix=None, anchor=None)``.

    Args:
        actor: HF causal LM (a ``torch.nn.Module`` returning ``.logits``), possibly wrapped by peft; kept as a plain
            attribute (no functional copy).
        temperature: > 0; top_p: in (0, 1] (1: none); top_k: >= 0 (0: none) — the scored distribution.

    Raises:
        ValueError: a scoring setting out of its range.
    """

    normaliser = "token"

    def __init__(self, actor: torch.nn.Module, *, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for the loss, got {temperature}")
        if not 0 < top_p <= 1 or top_k < 0:
            raise ValueError(f"top_p must be in (0, 1] and top_k >= 0, got top_p={top_p}, top_k={top_k}")
        self.__dict__["actor"] = actor  # LossModule would otherwise try to make functional copies of it
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)


def penalty_key(name: str) -> str:
    """The loss-output entry of the penalty ``name``: ``loss_penalty_<name>``."""
    return f"loss_penalty_{name}"


@dataclass(frozen=True)
class Penalty:
    """A named penalty: ``fn()`` is a scalar tensor with gradient on the training device, added to every
    micro-batch's loss output as ``loss_penalty_<name>`` (:func:`penalty_key`). Micro-batch losses are weighted by
    their share of the minibatch, so each optimizer step pays it once.

    Raises:
        ValueError: an empty name or one with characters other than letters, digits and ``_``.
        TypeError: ``fn`` not callable.
    """

    name: str
    fn: Callable[[], torch.Tensor]

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"a penalty name is letters, digits and '_', got {self.name!r}")
        if not callable(self.fn):
            raise TypeError(f"penalty {self.name!r}: fn must be callable, got {type(self.fn).__name__}")

    @property
    def key(self) -> str:
        return penalty_key(self.name)

    def __call__(self) -> torch.Tensor:
        return self.fn()
