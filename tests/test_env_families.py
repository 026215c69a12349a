"""The env-family registry (:mod:`envs.families`): every family declares every piece, ``envs.ENV_IDS`` is derived
from it, a family's own settings (``econfig.params``) are checked against its section with an error naming the keys,
and the trainer's env assembly goes through the registry only."""
from __future__ import annotations

import dataclasses

import gymnasium as gym
import pytest
from omegaconf import OmegaConf

import envs
from envs.families import check_pieces, families, family_of
from torchrl_grpo.assembly.environments import check_data, env_kwargs_from_config
from torchrl_grpo.config import GRPOConfig

FAMILIES = sorted(families())


def _cfg(**econfig):
    cfg = OmegaConf.structured(GRPOConfig)
    cfg.econfig = OmegaConf.merge(cfg.econfig, econfig)
    return cfg


@pytest.mark.parametrize("name", FAMILIES)
def test_every_registered_family_has_every_piece(name):
    f = families()[name]
    check_pieces(f)  # ids with entry points, a config section, callable kwargs mapping and data check
    for env_id in f.ids:
        assert env_id in gym.registry, env_id
        assert family_of(env_id) is f
    runtime = {"user": "solo" if name == "tau2" else None, "user_fn": None}
    env_id, kw = f.make_kwargs(f.section({"env_id": next(iter(f.ids))}), "test", None, runtime)
    assert env_id in f.ids and kw["split"] == "test"


def test_a_family_lacking_a_piece_is_refused():
    good = families()["gsm8k"]
    for piece, value in (("ids", {}), ("make_kwargs", None), ("check_data", "nope"), ("config", None),
                         ("ids", {"X-v0": "no_colon"}), ("compat_ids", ("Y-v0",)),
                         ("continual", {"d": {"train_split": "train"}})):
        with pytest.raises((TypeError, ValueError)):
            check_pieces(dataclasses.replace(good, **{piece: value}))


def test_env_ids_are_derived_from_the_registry():
    ids = [i for n in FAMILIES for i in families()[n].ids if i not in families()[n].compat_ids]
    assert envs.ENV_IDS == ids
    assert envs.COMPAT_IDS == ["tau2/agent-gym-v0"]
    assert {"gsm8k", "ifeval", "reasoning_gym", "tau2"} <= set(FAMILIES)


def test_family_settings_come_from_params_then_econfig_then_defaults():
    f = families()["reasoning_gym"]
    s = f.section({"env_id": "ReasoningGym-v1", "train_size": 7, "params": {"test_size": 3}})
    assert (s["train_size"], s["test_size"], s["train_seed"]) == (7, 3, 11)
    with pytest.raises(ValueError, match=r"\['bogus'\].*'reasoning_gym'.*its keys: \['level'"):
        f.section({"env_id": "ReasoningGym-v1", "params": {"bogus": 1}})


def test_an_unknown_setting_or_id_fails_before_any_model_loads():
    cfg = _cfg(env_id="GSM8K-v1", params={"format_rewrd": 0.5})
    for fn in (check_data, lambda c: env_kwargs_from_config(c, "train")):
        with pytest.raises(ValueError, match=r"format_rewrd.*its keys: \['format_reward', 'system_prompt'\]"):
            fn(cfg)
    with pytest.raises(ValueError, match="unknown econfig.env_id 'Nope-v0'; registered: "):
        check_data(_cfg(env_id="Nope-v0"))
    assert env_kwargs_from_config(_cfg(env_id="GSM8K-v1", params={"format_reward": 0.5}), "train") == (
        "GSM8K-v1", {"split": "train", "format_reward": 0.5})


def test_tau2_kwargs_through_the_registry():
    cfg = _cfg(env_id="tau2", domain="airline", solo_mode=False, user="llm", user_llm="m", user_llm_base_url="u")
    assert env_kwargs_from_config(cfg, "test") == ("tau2/airline-v0", {
        "split": "test", "max_steps": 30, "reward": "binary", "user": "llm", "user_llm": "m",
        "user_llm_base_url": "u", "user_llm_args": {}})
    assert env_kwargs_from_config(_cfg(env_id="tau2/mock-v0"), "base")[1]["user"] == "solo"
    with pytest.raises(ValueError, match="needs a user_fn"):
        env_kwargs_from_config(_cfg(env_id="tau2/retail-v0", solo_mode=False, user="local"), "train")
