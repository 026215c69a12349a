"""Phase 3 of :func:`torchrl_grpo.assembly.build`: the policy being trained, from ``actor.*``, ``loss.kl_coef`` and
``train.disable_dropout``.

:func:`build_policy` loads it (or takes a preloaded one), records ``model_source.json``, turns on gradient
checkpointing and LoRA, takes the frozen KL reference, switches dropout off and broadcasts rank 0's weights;
:func:`shard_policy` shards it with FSDP2 once the full copies (KL reference, rollout engine) are taken.
"""
from __future__ import annotations

import copy
import json
import logging
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from torchrl_grpo.assembly.devices import Devices
from torchrl_grpo.distributed.data_parallel import shard_model
from torchrl_grpo.model_store import load_model_and_tokenizer, resolve_model_path
from torchrl_grpo.training.dropout import disable_dropout

__all__ = ["Policy", "build_policy", "kl_reference", "shard_policy"]

log = logging.getLogger(__name__)


@dataclass
class Policy:
    """The trained policy and what comes with it.

    Attributes:
        model: the policy (LoRA-wrapped with ``actor.peft.enable``; FSDP-sharded after :func:`shard_policy`).
        tokenizer: its tokenizer.
        reference: the frozen KL reference as a context factory yielding the module to score with (None without KL).
        load_time_s: seconds spent loading the model (0-ish for a preloaded one).
    """

    model: torch.nn.Module
    tokenizer: Any
    reference: Callable[[], Any] | None
    load_time_s: float


def kl_reference(model: torch.nn.Module, peft: bool, placement=None) -> Callable[[], Any]:
    """The frozen KL reference as a context factory yielding the module to score with. With a
    :class:`~torchrl_grpo.distributed.placement.Placement` (full fine-tuning): the copy lives on
    ``placement.ref_device``, and on a disjoint CPU plan the scoring thread moves to the ref cores inside the context
    (:mod:`torchrl_grpo.distributed.placement`). LoRA: the same model with its adapter switched off."""
    if peft:  # LoRA: the reference is the base model, i.e. the adapter switched off

        @contextmanager
        def base_model():
            with model.disable_adapter():
                yield model

        return base_model
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    if placement is None or ("ref" not in placement.cores and placement.ref_device == placement.train_device):
        return lambda: nullcontext(ref)  # colocated: as before
    ref.to(placement.ref_device)

    @contextmanager
    def placed():
        with placement.on_cores("ref"):
            yield ref

    return placed


def _load(cfg, devices: Devices, run_dir: Path, model, tokenizer) -> tuple[torch.nn.Module, Any, float]:
    """``actor.path`` loaded on the device (``model_source.json`` records what it resolved to), or the preloaded
    pair; the load time. Raises ValueError: a preloaded model without its tokenizer."""
    t0 = time.perf_counter()
    if model is None:
        model, tokenizer = load_model_and_tokenizer(cfg.actor.path, dtype=cfg.actor.dtype, device=devices.device)
        src = resolve_model_path(cfg.actor.path)  # cached by now: records what actor.path resolved to
        (run_dir / "model_source.json").write_text(json.dumps(
            {"spec": src.spec, "kind": src.kind, "path": src.path, "gguf_file": src.gguf_file}, indent=1) + "\n")
    elif tokenizer is None:
        raise ValueError("a preloaded model needs its tokenizer")
    return model, tokenizer, time.perf_counter() - t0


def _warn_context(cfg, model) -> None:
    max_pos = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(max_pos, int) and cfg.rollout.max_context_tokens > max_pos:
        log.warning("rollout.max_context_tokens=%d exceeds the trained context of %s (%d positions): longer "
                    "episodes run on extrapolated positions (RoPE) or fail (absolute positions); lower it or pick "
                    "a longer-context model", cfg.rollout.max_context_tokens, cfg.actor.path, max_pos)


def _lora(cfg, model: torch.nn.Module) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model  # peft is imported only by LoRA runs

    p = cfg.actor.peft
    target = p.target_modules if isinstance(p.target_modules, str) else list(p.target_modules)
    return get_peft_model(model, LoraConfig(r=p.r, lora_alpha=p.lora_alpha, lora_dropout=p.lora_dropout,
                                            target_modules=target, task_type="CAUSAL_LM"))


def build_policy(cfg, devices: Devices, run_dir: Path, *, model=None, tokenizer=None) -> Policy:
    """Load and prepare the policy, in this order (it matters):

    1. load ``actor.path`` (or take the preloaded ``model`` / ``tokenizer``), move it to the device;
    2. gradient checkpointing (``actor.gradient_checkpointing``; the KV cache off);
    3. LoRA (``actor.peft``);
    4. the KL reference (``loss.kl_coef > 0``: :func:`kl_reference`), taken *before* dropout is disabled, as the
       policy was at start;
    5. dropout off (``train.disable_dropout``; see :mod:`torchrl_grpo.training.dropout`: dropout alone moved
       on-policy ratios to 1.14);
    6. rank 0's weights broadcast to every rank (LoRA's random init included).

    Must run after the seeds are set and the data is checked (:func:`torchrl_grpo.assembly.records.prepare_run`).

    Raises:
        ValueError: a preloaded model without its tokenizer.
        FileNotFoundError / ValueError: an ``actor.path`` that does not resolve (:mod:`torchrl_grpo.model_store`).
    """
    model, tokenizer, load_time_s = _load(cfg, devices, run_dir, model, tokenizer)
    _warn_context(cfg, model)
    model.to(devices.device)
    if cfg.actor.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if cfg.actor.peft.enable:
        model = _lora(cfg, model)
    reference = None
    if cfg.loss.kl_coef > 0:  # the copy is taken before dropout is disabled, as the policy was at start
        reference = kl_reference(model, peft=cfg.actor.peft.enable, placement=devices.placement)
    if cfg.train.disable_dropout:
        disable_dropout(model)
    devices.dp.broadcast_module(model)  # every rank starts from rank 0's weights (LoRA's random init included)
    return Policy(model=model, tokenizer=tokenizer, reference=reference, load_time_s=load_time_s)


def is_sharded(devices: Devices) -> bool:
    """The plan trains with FSDP2 (:mod:`torchrl_grpo.distributed.data_parallel`): the trainer holds shards."""
    return devices.plan.placements["train"].engine == "fsdp"


def shard_policy(policy: Policy, devices: Devices) -> Policy:
    """FSDP2-shard the policy when the plan trains with ``fsdp``; call it after the full copies (KL reference,
    rollout engine) are taken and before the optimizer is built. Other plans: unchanged."""
    if is_sharded(devices):
        policy.model = shard_model(policy.model, devices.dp)
    return policy
