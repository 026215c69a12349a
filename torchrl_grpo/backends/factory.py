"""Build a rollout backend by name: the one place outside each backend's own module that names a backend class.

``rollout.backend`` values are :data:`BACKENDS` (:mod:`torchrl_grpo.config.choices`). :func:`make_backend` builds
one from explicit settings; :func:`torchrl_grpo.assembly.rollout_side.backend_from_config` reads them from a run config (for
the trainer and, through the Ray recipe, each rollout worker). Everything else talks to a
:class:`~torchrl_grpo.backends.base.RolloutBackend`.
"""
from __future__ import annotations

import copy

import torch

from torchrl_grpo.backends.base import RolloutBackend
from torchrl_grpo.config.choices import BACKENDS  # rollout.backend: the colocated transformers backend, or vLLM

__all__ = ["BACKENDS", "make_backend"]


def make_backend(kind: str, model: torch.nn.Module, tokenizer, *, own_copy: bool, max_batch_size: int,
                 device: torch.device | str | None = None,
                 model_path: str | None = None, seed: int = 0, vllm_dtype: str = "auto", max_model_len: int = 2048,
                 check_sync_every: int = 0, gpu_memory_utilization: float | None = None,
                 push_weights: bool = False, decode: str = "auto") -> RolloutBackend:
    """A rollout backend for ``model``.

    Args:
        kind: one of :data:`BACKENDS`.
        model: the trained policy (``nn.Module``, LoRA-wrapped or not).
        tokenizer: its tokenizer (pad id; vLLM's tokenizer).
        own_copy: ``transformers``: ``False`` shares ``model`` (sync is a no-op); ``True`` generates from a merged,
            frozen copy (the async trainer's engine, synced by export). vLLM always has its own weights.
        device: ``transformers`` with ``own_copy``: the device of the copy (the plan's inference device,
            :mod:`torchrl_grpo.distributed.placement`; None: ``model``'s). Weight sync copies across devices
            (``load_weights``: ``Tensor.copy_``). vLLM: not used (the in-process engine takes the first visible GPU;
            :func:`torchrl_grpo.distributed.placement.placement_for` refuses a plan that puts it elsewhere).
        max_batch_size: ``transformers``: most sequences per generate call.
        decode: ``transformers``: the decode loop (:data:`~torchrl_grpo.config.choices.DECODE_MODES`).
        model_path: vLLM: the resolved model folder the engine loads.
        seed, vllm_dtype, max_model_len, check_sync_every, gpu_memory_utilization: vLLM engine settings
            (:class:`~torchrl_grpo.backends.vllm_backend.VLLMBackend`); ``gpu_memory_utilization`` only on CUDA.
        push_weights: vLLM: sync ``model`` into the engine at once (LoRA layers may start non-zero, so the engine's
            base weights are not the policy).

    Raises:
        ValueError: ``kind`` not in :data:`BACKENDS`, or vLLM without ``model_path``.
        ImportError: vLLM without the ``[vllm]`` extra (raised by the vLLM backend module, with the install hint).
    """
    if kind not in BACKENDS:
        raise ValueError(f"rollout backend must be one of {BACKENDS}, got {kind!r}")
    if kind == "transformers":
        from torchrl_grpo.backends.transformers_backend import TransformersBackend

        if not own_copy:
            return TransformersBackend(model, pad_token_id=tokenizer.pad_token_id, share_module=True,
                                       max_batch_size=max_batch_size, decode=decode)
        gen_model = copy.deepcopy(model)
        if hasattr(gen_model, "peft_config"):
            gen_model = gen_model.merge_and_unload()
        gen_model.eval().requires_grad_(False)
        if device is not None:
            gen_model.to(device)
        return TransformersBackend(gen_model, pad_token_id=tokenizer.pad_token_id, share_module=False,
                                   max_batch_size=max_batch_size, decode=decode)
    if model_path is None:
        raise ValueError("the vllm backend needs model_path (the model folder the engine loads)")
    from torchrl_grpo.backends.vllm_backend import VLLMBackend

    extra = {"gpu_memory_utilization": gpu_memory_utilization} \
        if gpu_memory_utilization is not None and torch.cuda.is_available() else {}
    backend = VLLMBackend(model_path, tokenizer=tokenizer, dtype=vllm_dtype, max_model_len=max_model_len, seed=seed,
                          check_sync_every=check_sync_every, **extra)
    if push_weights:
        backend.sync_from(model)
    return backend

