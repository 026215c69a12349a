"""The continual-algorithm registry (torchrl_grpo.continual.algorithms.ALGORITHMS): every registered algorithm has
every piece (its name, a from_config that builds it from the default cl section), the names are the config leaf's
CL_ALGORITHMS, the trainer asks the algorithm (``joint``, ``on_resume_without_state``) instead of testing its class,
and an algorithm added by registration alone is built by make_algorithm."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from torchrl_grpo.assembly.continual_run import make_algorithm
from torchrl_grpo.config.choices import CL_ALGORITHMS
from torchrl_grpo.config.schema import ContinualConfig
from torchrl_grpo.continual import algorithms
from torchrl_grpo.continual.algorithms import ALGORITHMS, CLAlgorithm, KLAnchor, register_algorithm


def _defaults(**over) -> dict:
    return {**dataclasses.asdict(ContinualConfig()), **over}


def test_registered_names_are_the_config_leafs_choices():
    assert tuple(ALGORITHMS) == CL_ALGORITHMS


@pytest.mark.parametrize("name", CL_ALGORITHMS)
def test_every_registered_algorithm_has_every_piece(name):
    cls = ALGORITHMS[name]
    assert issubclass(cls, CLAlgorithm) and cls.name == name
    algo = cls.from_config(_defaults(algorithm=name), seed=3)
    assert type(algo) is cls and isinstance(algo.joint, bool)
    assert type(make_algorithm(OmegaConf.create(_defaults(algorithm=name)), seed=3)) is cls
    if algo.joint:
        assert algo.domain_for_step(4, ["a", "b", "c"]) in {"a", "b", "c"}
    else:
        with pytest.raises(NotImplementedError):
            algo.domain_for_step(0, ["a"])


def test_from_config_reads_the_settings_and_names_a_missing_one():
    r = ALGORITHMS["replay"].from_config({"replay_ratio": 0.25}, seed=7)
    assert (r.ratio, r.seed) == (0.25, 7)
    assert ALGORITHMS["ewc"].from_config({"ewc_lambda": 3.0}).lam == 3.0
    with pytest.raises(ValueError, match="cl.algorithm=replay needs cl.replay_ratio"):
        ALGORITHMS["replay"].from_config({})
    with pytest.raises(ValueError, match="> 0"):
        make_algorithm({"algorithm": "replay", "replay_ratio": 0.0})  # plain dicts work too


def test_register_algorithm_refuses_what_lacks_a_piece():
    class NoName(CLAlgorithm):
        pass  # inherits "sequential": not its own name

    with pytest.raises(ValueError, match="own non-empty class attribute 'name'"):
        register_algorithm(NoName)

    class Twin(CLAlgorithm):
        name = "replay"

    with pytest.raises(ValueError, match="registered twice"):
        register_algorithm(Twin)
    with pytest.raises(TypeError, match="CLAlgorithm subclass"):
        register_algorithm(object)
    assert tuple(ALGORITHMS) == CL_ALGORITHMS  # nothing was added


def test_a_new_algorithm_is_built_by_registration_alone(monkeypatch):
    monkeypatch.setattr(algorithms, "ALGORITHMS", dict(ALGORITHMS))  # register into a copy
    monkeypatch.setattr("torchrl_grpo.assembly.continual_run.ALGORITHMS", algorithms.ALGORITHMS)

    @algorithms.register_algorithm
    class Mixed(CLAlgorithm):
        name = "mixed"

        def __init__(self, alpha: float) -> None:
            self.alpha = alpha

        @classmethod
        def from_config(cls, settings, *, seed=0):
            return cls(settings["replay_ratio"] * 2)

    algo = make_algorithm(OmegaConf.create(_defaults(algorithm="mixed", replay_ratio=0.25)))
    assert isinstance(algo, Mixed) and algo.alpha == 0.5 and not algo.joint


def test_kl_anchor_resumed_without_its_state_takes_the_loaded_weights_only_after_a_finished_task():
    calls = []

    class Anchor(KLAnchor):
        def post_task(self, trainer, domain):
            calls.append(domain)

    a, trainer = Anchor(), SimpleNamespace()
    a.on_resume_without_state(trainer, "mock", task_done=False)
    assert calls == []
    a.on_resume_without_state(trainer, "mock", task_done=True)
    assert calls == ["mock"]
    for name in CL_ALGORITHMS:  # the algorithms need nothing: the default hook changes nothing
        assert ALGORITHMS[name].on_resume_without_state is CLAlgorithm.on_resume_without_state
