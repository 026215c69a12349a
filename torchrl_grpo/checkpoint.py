"""Atomic training checkpoints: model (full weights or LoRA adapter), optimizer, scheduler, RNG states, step
and the resolved config.

Layout of ``<run_dir>/checkpoints/step_000010/``::

    model/               HF ``save_pretrained`` dir (safetensors) — or the peft adapter dir with LoRA
    tokenizer/           the tokenizer, so the checkpoint loads on its own
    optimizer.pt         optimizer state dict
    scheduler.pt         LR scheduler state dict
    trainer_state.pt     {"step", "rng": {python, numpy, torch, cuda}, "extra"}
    config.yaml          the resolved run config

A checkpoint is written to a temporary sibling directory and renamed into place, so a crash mid-write never
leaves a half checkpoint that ``resume_from`` could pick up.
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "rng_state", "set_rng_state"]


def rng_state() -> dict[str, Any]:
    """Snapshot of python, numpy and torch (CPU and CUDA) RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _is_peft(model) -> bool:
    return hasattr(model, "peft_config")


def save_checkpoint(
    ckpt_root: str | os.PathLike,
    step: int,
    *,
    model,
    tokenizer=None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler=None,
    config_yaml: str | None = None,
    extra: dict | None = None,
    keep_last: int = 0,
) -> Path:
    """Write a checkpoint for ``step`` atomically and prune old ones.

    Args:
        ckpt_root: the ``checkpoints/`` directory.
        step: number of completed optimizer steps.
        keep_last: keep only the newest k checkpoints (0 keeps all).

    Returns:
        Path of the final checkpoint directory.
    """
    root = Path(ckpt_root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp_step_{step:06d}_", dir=root))
    try:
        model.save_pretrained(tmp / "model", safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "tokenizer")
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save({"step": step, "rng": rng_state(), "extra": extra or {}, "peft": _is_peft(model)},
                   tmp / "trainer_state.pt")
        if config_yaml is not None:
            (tmp / "config.yaml").write_text(config_yaml)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last > 0:
        ckpts = sorted(p for p in root.glob("step_*") if p.is_dir())
        for old in ckpts[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(path: str | os.PathLike) -> Path:
    """Resolve ``path`` (a checkpoint dir, a ``checkpoints/`` dir or a run dir) to a checkpoint dir.

    Raises:
        FileNotFoundError: nothing that looks like a checkpoint there.
    """
    p = Path(path)
    if (p / "trainer_state.pt").is_file():
        return p
    for root in (p, p / "checkpoints"):
        ckpts = sorted(q for q in root.glob("step_*") if (q / "trainer_state.pt").is_file()) if root.is_dir() else []
        if ckpts:
            return ckpts[-1]
    raise FileNotFoundError(f"no checkpoint (a step_*/trainer_state.pt) found at {p}")


def _load_weights_into(model, model_dir: Path) -> None:
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {model_dir}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if _is_peft(model):
        from peft import set_peft_model_state_dict

        res = set_peft_model_state_dict(model, state)
        unexpected = getattr(res, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"adapter checkpoint has unexpected keys, e.g. {unexpected[:3]}")
        return
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    if isinstance(getattr(model, "_tied_weights_keys", None), dict):
        tied = set(model._tied_weights_keys)
    bad_missing = [k for k in missing if k not in tied and not k.endswith("lm_head.weight")]
    if bad_missing or unexpected:
        raise ValueError(f"checkpoint does not match the model: missing {bad_missing[:3]}, unexpected {unexpected[:3]}")


def load_checkpoint(path: str | os.PathLike, *, model, optimizer=None, scheduler=None, restore_rng: bool = True) -> dict:
    """Load a checkpoint into live objects (built with the same config).

    Returns:
        The trainer state dict (``step``, ``extra``).

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        ValueError: the checkpoint was saved with/without LoRA but the model is not, or keys do not match.
    """
    ckpt = latest_checkpoint(path)
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    if bool(state.get("peft")) != _is_peft(model):
        raise ValueError(f"checkpoint {ckpt} was saved with peft={state.get('peft')} but actor.peft.enable is {_is_peft(model)}")
    _load_weights_into(model, ckpt / "model")
    if optimizer is not None and (ckpt / "optimizer.pt").is_file():
        optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=False))
    if scheduler is not None and (ckpt / "scheduler.pt").is_file():
        scheduler.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=False))
    if restore_rng:
        set_rng_state(state["rng"])
    state["path"] = str(ckpt)
    return state
