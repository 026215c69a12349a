r"""Switch dropout off in a policy for RL updates.

The GRPO ratio :math:`\pi_\theta/\pi_{old}` compares the network that is differentiated with the one that sampled
(or the no-grad anchor pass). Dropout makes the differentiated forward a *random sub-network*: on-policy, where the
ratio is exactly 1 without it, LoRA dropout 0.05 gave ``ratio_max`` 1.14 on the tiny model, so noise alone reaches
the clip range. TRL's GRPOTrainer (``disable_dropout=True``) and AReaL do the same; dropout regularises supervised
fitting, which is not what an on-policy update needs.
"""
from __future__ import annotations

import torch

__all__ = ["disable_dropout"]

_CONFIG_KEYS = ("attention_dropout", "hidden_dropout", "dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop",
                "hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")


def disable_dropout(model: torch.nn.Module) -> int:
    """Set p=0 on every ``torch.nn.Dropout`` module (LoRA's ``lora_dropout`` included) and zero the dropout rates
    in the HF config that attention implementations read at call time (``attention_dropout`` etc.).

    Returns:
        The number of dropout modules whose ``p`` was > 0.
    """
    changed = 0
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            m.p = 0.0
            changed += 1
    seen = set()
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is None or id(cfg) in seen:
            continue
        seen.add(id(cfg))
        for key in _CONFIG_KEYS:
            v = getattr(cfg, key, None)
            if isinstance(v, float) and v > 0:
                setattr(cfg, key, 0.0)
    return changed
