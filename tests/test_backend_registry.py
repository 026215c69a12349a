"""The rollout-backend registry (torchrl_grpo.backends.factory): every registered backend has every piece (settings
that exist in the config, a factory taking exactly them, a placement rule), its names are the config leaf's
BACKENDS, and a backend added by registration alone is built and placed without touching the device plan."""
from __future__ import annotations

import dataclasses
import pkgutil

import pytest
import torch

import torchrl_grpo.backends as backends_pkg
from torchrl_grpo.backends import factory
from torchrl_grpo.backends.base import RolloutBackend
from torchrl_grpo.backends.factory import (
    BackendInputs,
    BackendSpec,
    EnginePlacement,
    backend_names,
    backend_spec,
    make_backend,
    register_backend,
)
from torchrl_grpo.config.choices import BACKENDS
from torchrl_grpo.config.schema import RolloutConfig
from torchrl_grpo.distributed.device_plan import (
    AllocationError,
    PlanRequest,
    resolve_plan,
)
from torchrl_grpo.distributed.placement import placement_for


def _rollout_keys(cls=RolloutConfig, prefix="") -> dict[str, object]:
    """Every key under ``rollout`` in the schema (dotted for sub-sections) -> its field type."""
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out[prefix + f.name] = "section"
            out.update(_rollout_keys(type(default), f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = f.type
    return out


def test_registered_names_are_the_config_leafs_backends():
    """``torchrl_grpo.config`` is a leaf (it validates rollout.backend and allocation_mode's engines before any
    backend module can load), so it keeps BACKENDS by hand: this keeps it equal to the registry."""
    assert sorted(backend_names()) == sorted(BACKENDS)


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_registered_backend_has_every_piece(name):
    spec = backend_spec(name)
    keys = _rollout_keys()
    assert spec.name == name and callable(spec.factory) and isinstance(spec.placement, EnginePlacement)
    missing = [k for k in spec.settings if k not in keys or keys[k] == "section"]
    assert not missing, f"{name}: settings {missing} are not keys of the rollout config section"
    assert len(set(spec.setting_names)) == len(spec.setting_names), f"{name}: two settings share a keyword name"
    if spec.placement.first_visible_gpu:
        assert spec.placement.reason


def test_every_config_section_of_rollout_belongs_to_one_backend():
    """A backend's own section (rollout.vllm) is read by that backend; a section no backend reads is dead config."""
    sections = [k for k, v in _rollout_keys().items() if v == "section"]
    owners = {s: [n for n in backend_names() if backend_spec(n).section == s] for s in sections}
    assert all(len(o) == 1 for o in owners.values()), owners


def test_every_backend_module_registers_a_backend():
    modules = {m.name for m in pkgutil.iter_modules(backends_pkg.__path__) if m.name.endswith("_backend")}
    registered = {backend_spec(n).factory.__module__.rsplit(".", 1)[-1] for n in backend_names()}
    assert modules == registered


def test_a_spec_lacking_a_piece_is_refused_at_registration():
    def fac(inputs, *, decode="auto"):
        return None

    with pytest.raises(ValueError, match="keyword arguments"):
        BackendSpec("x", fac, settings=("decode", "max_batch_size"))  # the factory does not take max_batch_size
    with pytest.raises(ValueError, match="keyword arguments"):
        BackendSpec("x", lambda inputs, *, decode: None, settings=("decode",))  # a setting without a default
    with pytest.raises(TypeError, match="not callable"):
        BackendSpec("x", "fac")
    with pytest.raises(ValueError, match="needs a reason"):
        EnginePlacement(first_visible_gpu=True)
    with pytest.raises(ValueError, match="registered twice"):
        register_backend(BackendSpec("transformers", fac, settings=("decode",)))
    with pytest.raises(ValueError, match="must be one of"):
        backend_spec("sglang")


class _Echo(RolloutBackend):
    """A stand-in engine: records what its factory was given."""

    def __init__(self, inputs, settings):
        self.inputs, self.settings = inputs, settings

    def generate(self, prompts, sampling):
        raise NotImplementedError

    def load_weights(self, weights):
        raise NotImplementedError


def _echo_factory(inputs: BackendInputs, *, mem_fraction: float = 0.9, tp: int = 1):
    return _Echo(inputs, {"mem_fraction": mem_fraction, "tp": tp})


def test_a_new_backend_is_built_and_placed_by_registration_alone(monkeypatch):
    """An SGLang-like engine bound to the first visible GPU: registered with its settings and placement rule, it is
    built through make_backend and the device plan honours its rule, with no edit to the factory or the plan."""
    spec = BackendSpec("echo", _echo_factory, settings=("echo.mem_fraction", "echo.tp"),
                       placement=EnginePlacement(first_visible_gpu=True, reason="echo.Engine takes no device"))
    monkeypatch.setitem(factory._REGISTRY, "echo", spec)
    model = torch.nn.Linear(2, 2)
    b = make_backend("echo", model, None, own_copy=True, model_path="some/path", seed=3, lora=True, tp=2)
    assert b.settings == {"mem_fraction": 0.9, "tp": 2}
    assert (b.inputs.model, b.inputs.model_path, b.inputs.seed, b.inputs.lora) == (model, "some/path", 3, True)
    assert spec.section == "echo"
    with pytest.raises(ValueError, match=r"takes the settings \['mem_fraction', 'tp'\], not \['decode'\]"):
        make_backend("echo", model, None, own_copy=False, decode="eager")
    gpus = [f"cuda:{i}" for i in range(4)]
    plan = resolve_plan(PlanRequest(num_devices={"train": 1, "inference": 1}), gpus, inference_engine="echo",
                        inference_placement=spec.placement)
    assert plan.placements["inference"].devices == ("cuda:0",)  # the first free GPU goes to the engine
    with pytest.raises(AllocationError, match=r"rollout.backend=echo .*echo.Engine takes no device"):
        resolve_plan(PlanRequest(devices={"inference": (2,)}), gpus, inference_engine="echo",
                     inference_placement=spec.placement)
    off = resolve_plan(PlanRequest(devices={"train": (0,), "inference": (1,)}), gpus)  # resolved without the rule
    with pytest.raises(AllocationError, match=r"rollout.backend=echo runs in this process.*echo.Engine"):
        placement_for(off, device=torch.device("cuda:0"), backend="echo", inference_placement=spec.placement)
    # the same plans for an engine without the rule: train first, any device
    assert resolve_plan(PlanRequest(num_devices={"train": 1, "inference": 1}), gpus,
                        inference_engine="echo").placements["inference"].devices == ("cuda:1",)


def test_transformers_factory_shares_or_copies(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    shared = make_backend("transformers", model, tok, own_copy=False, max_batch_size=3, decode="eager")
    assert shared.model is model and shared.share_module and shared.max_batch_size == 3
    copied = make_backend("transformers", model, tok, own_copy=True)
    assert copied.model is not model and not copied.share_module and copied.max_batch_size == 64
    assert not any(p.requires_grad for p in copied.model.parameters())
    for b in (shared, copied):
        b.close()


def test_vllm_factory_needs_a_model_path():
    with pytest.raises(ValueError, match="needs model_path"):
        make_backend("vllm", torch.nn.Linear(2, 2), None, own_copy=True)
