"""Export the trainer's current policy weights under plain HF parameter names, for a rollout engine.

With LoRA (peft), the adapter is merged into a copy of each affected base weight on the fly
(``W + scale * B @ A``, Hu et al., 2021, arXiv:2106.09685, Eq. 3) so the engine receives ordinary full
weights and needs no LoRA support; the trainer's module is not modified.

An FSDP-sharded policy (:mod:`torchrl_grpo.distributed.data_parallel`) yields full tensors: each parameter is all-gathered
(``DTensor.full_tensor()``) as it is yielded, so every rank must iterate the whole export, in the same order.
"""
from __future__ import annotations

from typing import Iterator

import torch

__all__ = ["export_hf_weights"]


def _is_peft(model) -> bool:
    return hasattr(model, "peft_config")


@torch.no_grad()
def export_hf_weights(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` for every parameter of the policy, LoRA merged.

    Args:
        model: HF causal LM or peft ``PeftModel`` wrapping one.
        dtype: cast tensors to this dtype (e.g. the engine's bf16); None keeps them.

    Yields:
        Names as in the base model's own ``state_dict`` (e.g. ``model.layers.0.self_attn.q_proj.weight``).
    """
    if not _is_peft(model):
        from torch.distributed.tensor import DTensor

        for name, p in model.named_parameters():
            t = p.detach().full_tensor() if isinstance(p, DTensor) else p.detach()
            yield name, (t.to(dtype) if dtype is not None else t)
        return
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged: dict[str, torch.Tensor] = {}
    for mod_name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            w = module.get_base_layer().weight.detach().clone()
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    w += module.get_delta_weight(adapter).to(w.dtype)
            merged[f"{mod_name}.weight"] = w
    for name, p in base.named_parameters():
        if "lora_" in name:
            continue
        hf_name = name.replace(".base_layer.", ".")
        t = merged.get(hf_name, p.detach())
        yield hf_name, (t.to(dtype) if dtype is not None else t)
