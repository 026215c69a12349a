r"""Supervised fine-tuning loss: the token-mean negative log-likelihood of the assistant tokens.

The standard maximum-likelihood / behaviour-cloning objective (e.g. InstructGPT's SFT stage, Ouyang et al., 2022,
arXiv:2203.02155, Sec. 3.5): over the assistant tokens ``m`` of a minibatch,

.. math:: \mathcal{L}_{SFT} = -\frac{1}{\sum_{i,t} m_{i,t}} \sum_{i,t} m_{i,t} \log\pi_\theta(o_{i,t} \mid o_{i,<t}),

the token mean over the whole minibatch (DAPO's token-level aggregation, as the GRPO loss's default): tool results,
user turns and the prompt are context only. Run by :class:`torchrl_grpo.training.update.GRPOUpdate` through the
:mod:`torchrl_grpo.objectives.loss_interface` (``normaliser="token"``, the raw softmax); the recipe around it is
:mod:`torchrl_grpo.training.sft_trainer`.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from torchrl_grpo.objectives.log_probs import token_log_probs
from torchrl_grpo.objectives.loss_interface import PolicyLossModule, resolve_anchor
from torchrl_grpo.objectives.shared_prefix import SharedPrefix

__all__ = ["SFTLoss"]


class SFTLoss(PolicyLossModule):
    """Token-mean negative log-likelihood of the assistant tokens (module docstring), a
    :class:`~torchrl_grpo.objectives.loss_interface.PolicyLossModule` scored under the model's raw distribution
    (temperature 1, no top-k / top-p).

    Input TensorDict [B]: ``tokens`` long [B, T], ``attention_mask`` bool [B, T], ``response_mask`` bool [B, T]
    (the tokens to imitate). Output (scalars): ``loss_sft`` (the NLL, nats/token, to backpropagate), ``nll`` (its
    detached value), ``num_tokens``.

    Raises:
        ValueError: missing keys or shapes that differ.
    """

    normaliser = "token"  # GRPOUpdate weights micro-batches by their share of the minibatch's tokens

    def __init__(self, actor: torch.nn.Module) -> None:
        super().__init__(actor)

    @property
    def in_keys(self):
        return ["tokens", "attention_mask", "response_mask"]

    @property
    def out_keys(self):
        return ["loss_sft", "nll", "num_tokens"]

    def forward(self, tensordict: TensorDictBase, *, prefix: SharedPrefix | None = None,
                anchor: str | None = None) -> TensorDict:
        """The NLL of ``tensordict``'s response tokens. ``prefix``: a shared-prefix pass every row starts with;
        ``anchor``: checked (:func:`~torchrl_grpo.objectives.loss_interface.resolve_anchor`) and otherwise unused,
        an SFT loss has no importance ratio to anchor."""
        missing = [k for k in self.in_keys if k not in tensordict.keys()]
        if missing:
            raise ValueError(f"SFTLoss: input lacks {missing}; present: {sorted(map(str, tensordict.keys()))}")
        resolve_anchor(tensordict, anchor)
        tokens, attn = tensordict["tokens"], tensordict["attention_mask"].bool()
        mask = tensordict["response_mask"].bool() & attn
        if tokens.shape != attn.shape or mask.shape != tokens.shape:
            raise ValueError("tokens, attention_mask and response_mask must all be [B, T]")
        logp, _ = token_log_probs(self.actor, tokens, attn, response_mask=mask, prefix=prefix)
        n = mask.sum()
        nll = -(logp * mask).sum() / n.clamp_min(1)
        return TensorDict({"loss_sft": nll, "nll": nll.detach(), "num_tokens": n.float()}, batch_size=[])
