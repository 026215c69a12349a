"""AReaL's ``allocation_mode`` string, read as config: its parser and the training strategy a config names.

These are rules about config values (no devices are looked at): :func:`torchrl_grpo.config.validate_config` uses them
at start-up and :mod:`torchrl_grpo.distributed.device_plan` resolves the plan from them. Imports nothing of
``torchrl_grpo`` outside ``config/`` and no torch.
"""
from __future__ import annotations

import re
from typing import Any

from torchrl_grpo.config.choices import FOREIGN_ENGINES, INFERENCE_ENGINES, TRAIN_ENGINES

__all__ = ["AllocationError", "parse_allocation_mode", "train_strategy"]


class AllocationError(ValueError):
    """A device plan that cannot run on the devices present; the message names the conflicting keys."""


_TERM = re.compile(r"^(?:(?P<engine>[a-z_]+)[:.])?(?P<dims>(?:[dtp]\d+)+)$")


def parse_allocation_mode(mode: str) -> dict[str, tuple[str, dict[str, int]]]:
    """Parse AReaL's ``allocation_mode`` (Fu et al., 2025, arXiv:2505.24298, the released ``AllocationMode``).

    Args:
        mode: ``ENGINE:DIMS[+ENGINE:DIMS]`` (``vllm:d1+fsdp:d2``; AReaL's older ``vllm.d1p1t1+d2p1t1`` also parses,
            a term without an engine being training with ``fsdp``).

    Returns:
        ``{"inference" | "train": (engine, {"d": dp, "t": tp, "p": pp})}``.

    Raises:
        AllocationError: malformed term, unknown engine, two terms for one role, zero-sized dims.
    """
    out: dict[str, tuple[str, dict[str, int]]] = {}
    for term in mode.replace(" ", "").split("+"):
        m = _TERM.match(term)
        if not m:
            raise AllocationError(f"allocation_mode={mode!r}: term {term!r} is not ENGINE:d<dp>[t<tp>][p<pp>] "
                                  f"(e.g. vllm:d1+fsdp:d2)")
        engine = m["engine"] or "fsdp"
        dims = {"d": 1, "t": 1, "p": 1}
        for k, v in re.findall(r"([dtp])(\d+)", m["dims"]):
            dims[k] = int(v)
        if min(dims.values()) < 1:
            raise AllocationError(f"allocation_mode={mode!r}: term {term!r} has a zero dimension")
        if engine in INFERENCE_ENGINES:
            role = "inference"
        elif engine in TRAIN_ENGINES:
            role = "train"
        else:
            extra = " (an AReaL engine this trainer does not run)" if engine in FOREIGN_ENGINES else ""
            raise AllocationError(f"allocation_mode={mode!r}: unknown engine {engine!r}{extra}; inference engines: "
                                  f"{INFERENCE_ENGINES}, training engines: {TRAIN_ENGINES}")
        if role in out:
            raise AllocationError(f"allocation_mode={mode!r}: two {role} terms ({out[role][0]} and {engine})")
        if role == "train" and (dims["t"] > 1 or dims["p"] > 1):
            raise AllocationError(f"allocation_mode={mode!r}: training supports data parallelism only (d); "
                                  f"tensor/pipeline dims t{dims['t']}p{dims['p']} need Megatron")
        out[role] = (engine, dims)
    if "train" not in out and "inference" in out:
        out["train"] = ("single", {"d": 1, "t": 1, "p": 1})
    return out


def train_strategy(cfg: Any) -> str:
    """The run's training strategy: ``train.strategy``, or, when that is ``single``, the training engine
    ``allocation_mode`` names (``vllm:d1+fsdp:d2``: ``fsdp``; AReaL's engine-less ``d2p1t1``: ``fsdp``). A
    malformed mode gives ``train.strategy`` (:func:`torchrl_grpo.distributed.device_plan.resolve_plan` then raises
    its error)."""
    strategy = cfg.train.strategy
    mode = cfg.get("allocation_mode") if hasattr(cfg, "get") else getattr(cfg, "allocation_mode", None)
    if strategy != "single" or not mode:
        return strategy
    try:
        train = parse_allocation_mode(mode).get("train")
    except AllocationError:
        return strategy
    return train[0] if train is not None else strategy
