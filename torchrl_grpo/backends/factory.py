"""The rollout-backend registry: each backend registers its name, its settings, its factory and its placement rule.

A backend lives in a module ``torchrl_grpo/backends/<name>_backend.py`` that ends with
``register_backend(BackendSpec(...))``; every such module is imported on the first lookup (:func:`backend_names`,
:func:`backend_spec`, :func:`make_backend`), so nothing outside the module names the backend's class. A
:class:`BackendSpec` holds:

* ``name``: the ``rollout.backend`` value; the names are also :data:`~torchrl_grpo.config.choices.BACKENDS` (the
  config leaf validates a run config and parses ``allocation_mode`` before any backend module can be imported, so
  it keeps its own tuple; ``tests/test_backend_registry.py`` keeps the two equal);
* ``settings``: the config keys under ``rollout`` the factory takes (``"decode"``; a dotted key names the backend's
  own section, ``"vllm.dtype"`` -> ``rollout.vllm.dtype``), passed as keyword arguments named by their last part;
* ``factory(inputs, **settings)``: the backend from the engine-neutral :class:`BackendInputs` (policy, tokenizer,
  whether it gets its own copy, device, checkpoint path, seed, LoRA);
* ``placement``: its :class:`~torchrl_grpo.distributed.device_plan.EnginePlacement` (does an in-process engine sit
  on the first visible GPU only?), which :func:`torchrl_grpo.assembly.devices.setup_devices` hands to the device
  plan and the placement.

:func:`torchrl_grpo.assembly.rollout_side.backend_from_config` reads a run config into these values (for the trainer
and, through the Ray recipe, each rollout worker). Everything else talks to a
:class:`~torchrl_grpo.backends.base.RolloutBackend`.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torchrl_grpo.backends.base import RolloutBackend
from torchrl_grpo.config.choices import (
    BACKENDS,  # rollout.backend values (the leaf's copy of backend_names())
)
from torchrl_grpo.distributed.device_plan import ANY_DEVICE, EnginePlacement

__all__ = ["BACKENDS", "BackendInputs", "BackendSpec", "EnginePlacement", "backend_names", "backend_spec",
           "make_backend", "register_backend"]


@dataclass(frozen=True)
class BackendInputs:
    """What every backend factory is given, whatever its engine.

    Attributes:
        model: the trained policy (``nn.Module``, LoRA-wrapped or not).
        tokenizer: its tokenizer (pad id; an engine may load its own from ``name_or_path``).
        own_copy: generate from a copy of the policy, synced by export + load (the async trainer's engine, a
            disjoint inference device), rather than from ``model`` itself where the backend can share it (sync is
            then a no-op). An engine with its own weights always has a copy.
        device: the device of that copy (the plan's inference device; None: ``model``'s). An engine that cannot be
            given a device declares it in its placement rule instead.
        model_path: the policy's checkpoint (``actor.path``: a folder or a :mod:`torchrl_grpo.model_store` alias),
            for engines that load their own weights; None where unknown.
        seed: the run's seed.
        lora: ``model`` is LoRA-wrapped (its weights may differ from ``model_path``'s at start: an engine with its
            own weights takes the policy's at once).
    """

    model: torch.nn.Module
    tokenizer: Any
    own_copy: bool
    device: torch.device | str | None = None
    model_path: str | None = None
    seed: int = 0
    lora: bool = False


@dataclass(frozen=True)
class BackendSpec:
    """One registered rollout backend (module docstring).

    Attributes:
        name: the ``rollout.backend`` value.
        factory: ``factory(inputs: BackendInputs, **settings) -> RolloutBackend``; every setting a keyword
            argument with a default.
        settings: config keys under ``rollout`` (dotted: in the backend's own section) the factory takes.
        placement: the engine's placement rule.

    Raises:
        ValueError: an empty name, or a factory whose keyword arguments are not exactly the settings' last parts
            (each with a default).
        TypeError: a factory that is not callable, a placement that is not an :class:`EnginePlacement`.
    """

    name: str
    factory: Callable[..., RolloutBackend]
    settings: tuple[str, ...] = ()
    placement: EnginePlacement = ANY_DEVICE

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"a backend needs a name, got {self.name!r}")
        if not callable(self.factory):
            raise TypeError(f"backend {self.name!r}: factory {self.factory!r} is not callable")
        if not isinstance(self.placement, EnginePlacement):
            raise TypeError(f"backend {self.name!r}: placement must be an EnginePlacement, got {self.placement!r}")
        params = inspect.signature(self.factory).parameters.values()
        kw = {p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is not p.empty}
        if kw != set(self.setting_names):
            raise ValueError(f"backend {self.name!r}: its factory's keyword arguments (with defaults) {sorted(kw)} "
                             f"are not its settings {list(self.setting_names)}")

    @property
    def setting_names(self) -> tuple[str, ...]:
        """The factory's keyword names: each setting's last dotted part."""
        return tuple(k.rsplit(".", 1)[-1] for k in self.settings)

    @property
    def section(self) -> str | None:
        """The ``rollout.<section>`` its dotted settings live in (None: it reads ``rollout`` keys only)."""
        dotted = {k.split(".", 1)[0] for k in self.settings if "." in k}
        return dotted.pop() if len(dotted) == 1 else None


_REGISTRY: dict[str, BackendSpec] = {}
_discovered = False


def register_backend(spec: BackendSpec) -> BackendSpec:
    """Register ``spec`` under ``spec.name`` (a backend module calls this once, at import). Returns ``spec``.

    Raises:
        ValueError: another spec already holds that name.
    """
    held = _REGISTRY.get(spec.name)
    if held is not None and held != spec:
        raise ValueError(f"rollout backend {spec.name!r} is registered twice ({held.factory.__module__} and "
                         f"{spec.factory.__module__})")
    _REGISTRY[spec.name] = spec
    return spec


def _discover() -> None:
    """Import every ``torchrl_grpo.backends.*_backend`` module once (each registers itself)."""
    global _discovered
    if _discovered:
        return
    package = importlib.import_module("torchrl_grpo.backends")
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.endswith("_backend"):
            importlib.import_module(f"torchrl_grpo.backends.{info.name}")
    _discovered = True


def backend_names() -> tuple[str, ...]:
    """The registered backend names, in registration order."""
    _discover()
    return tuple(_REGISTRY)


def backend_spec(name: str) -> BackendSpec:
    """The registered :class:`BackendSpec` of ``name``.

    Raises:
        ValueError: no backend of that name (the message lists the registered ones).
    """
    _discover()
    if name not in _REGISTRY:
        raise ValueError(f"rollout backend must be one of {tuple(_REGISTRY)}, got {name!r}")
    return _REGISTRY[name]


def make_backend(kind: str, model: torch.nn.Module, tokenizer, *, own_copy: bool,
                 device: torch.device | str | None = None, model_path: str | None = None, seed: int = 0,
                 lora: bool = False, **settings: Any) -> RolloutBackend:
    """A rollout backend for ``model``: the registered factory of ``kind`` on :class:`BackendInputs` of the other
    arguments, with ``settings`` (keyword names of :attr:`BackendSpec.setting_names`; missing ones take the
    factory's defaults).

    Raises:
        ValueError: ``kind`` not registered, a setting it does not take, or what its factory refuses (e.g. vLLM
            without ``model_path``).
        ImportError: an engine whose optional extra is missing (raised by its module, with the install hint).
    """
    spec = backend_spec(kind)
    unknown = sorted(set(settings) - set(spec.setting_names))
    if unknown:
        raise ValueError(f"rollout backend {kind!r} takes the settings {list(spec.setting_names)}, not {unknown}")
    inputs = BackendInputs(model=model, tokenizer=tokenizer, own_copy=own_copy, device=device, model_path=model_path,
                           seed=seed, lora=lora)
    return spec.factory(inputs, **settings)
