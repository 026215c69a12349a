"""The train-task selection of a run (issue 48: the curriculum of run 10 in the one-command config):
``train_dataset.start`` (tasks from a split index on, past an SFT phase's) and ``train_dataset.max_intents``
(``Tau2Env(max_intents=)``: generated mock tasks of at most K sub-intents). The config's selection must be the tasks
file run 10 trained on (``python -m envs.tau2.generated_tasks generated_train --max-intents 1 --start 256``)."""
from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest
from omegaconf import OmegaConf

import envs
from envs.tau2.generated_tasks import intents, select_tasks
from tests.test_sft_then_grpo import _cfg
from torchrl_grpo.assembly.environments import env_kwargs_from_config
from torchrl_grpo.config import validate_config
from torchrl_grpo.rollout.env_side import make_env_fn, train_task_indices, usable_task_indices

gym.register_envs(envs)


def _compose(name, overrides=()):
    from hydra import compose, initialize_config_dir

    from torchrl_grpo.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "configs"), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


def _mock(split="generated_train", **kw):
    return gym.make("tau2/mock-v0", split=split, user="solo", max_steps=8, **kw)


def test_max_intents_keeps_the_short_generated_tasks_in_split_order():
    env = _mock(max_intents=1)
    tasks = env.unwrapped.tasks.tasks
    kept = usable_task_indices(env)
    assert kept == [i for i, t in enumerate(tasks) if len(intents(t)) == 1]
    assert 0 < len(kept) < len(tasks)
    assert usable_task_indices(env, 5) == kept[:5]
    two = usable_task_indices(_mock(max_intents=2))
    assert set(kept) < set(two) < set(range(len(tasks)))
    assert usable_task_indices(_mock(max_intents=3)) == list(range(len(tasks)))


def test_a_filtered_out_task_still_resets():
    env = _mock(max_intents=1)
    skipped = next(i for i in range(len(env.unwrapped.tasks.tasks)) if i not in usable_task_indices(env))
    obs, info = env.reset(options={"index": skipped})
    assert obs and info


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1"])
def test_bad_max_intents_is_refused(bad):
    with pytest.raises(ValueError, match="max_intents must be an int >= 1"):
        _mock(max_intents=bad)


def test_max_intents_on_tasks_that_are_not_generated_is_refused_naming_a_task():
    with pytest.raises(ValueError, match=r"max_intents=1 filters generated mock tasks.*is not a generated mock task"):
        _mock(split="base", max_intents=1)


def test_start_skips_split_indices_below_it_and_limit_counts_from_there():
    env = _mock(max_intents=1)
    kept = usable_task_indices(env)
    assert train_task_indices(env, None, 0) == kept
    assert train_task_indices(env, None, 256) == [i for i in kept if i >= 256]
    assert train_task_indices(env, 3, 256) == [i for i in kept if i >= 256][:3]
    assert train_task_indices(env, 4, 0) == kept[:4]
    assert train_task_indices(env, None, 10 ** 6) == []


def test_the_one_command_config_trains_on_run_10s_tasks():
    """configs/grpo_tau2_mock.yaml: the GRPO phase's train tasks are, in order, the tasks file run 10 trained on."""
    cfg = _compose("grpo_tau2_mock")
    validate_config(cfg)
    assert (cfg.train_dataset.start, cfg.train_dataset.max_intents, cfg.sft.limit) == (256, 1, 256)
    env_id, kw = env_kwargs_from_config(cfg, cfg.train_dataset.split, cfg.train_dataset.path,
                                        max_intents=cfg.train_dataset.max_intents)
    env = make_env_fn(env_id, **kw)()
    got = [env.unwrapped.tasks.tasks[i].id for i in train_task_indices(env, cfg.train_dataset.limit,
                                                                         cfg.train_dataset.start)]
    want = [t["id"] for t in select_tasks("generated_train", max_intents=1, start=256)]
    assert got == want and len(got) == 785
    # evaluation reads every task of generated_test: the selection is the train split's only
    _, vkw = env_kwargs_from_config(cfg, cfg.valid_dataset.split, cfg.valid_dataset.path)
    assert "max_intents" not in vkw


@pytest.mark.parametrize("key,value,match", [("train_dataset.start", -1, "start must be >= 0"),
                                             ("train_dataset.max_intents", 0, "max_intents must be >= 1")])
def test_bad_selection_settings_are_refused(tmp_path, key, value, match):
    cfg = _cfg(tmp_path)
    OmegaConf.update(cfg, key, value)
    with pytest.raises(ValueError, match=match):
        validate_config(cfg)


def test_max_intents_outside_tau2_is_refused():
    cfg = _compose("grpo_gsm8k", ["train_dataset.max_intents=1"])
    with pytest.raises(ValueError, match="max_intents selects generated tau2 mock tasks"):
        validate_config(cfg)


def test_the_sft_phase_learns_from_the_splits_first_tasks_whatever_grpos_selection(tmp_path, monkeypatch):
    """sft.before_grpo: train_dataset.start / max_intents select the GRPO phase's tasks; the SFT phase reads the
    first sft.limit tasks of the split (run 10's warm start: the first 256, every intent count)."""
    from torchrl_grpo import cli

    seen = []
    monkeypatch.setattr(cli, "run_trainer", lambda cls, cfg, report=False: seen.append(cfg) or {})
    cfg = _cfg(tmp_path, train_dataset={"start": 256, "max_intents": 1})
    cli.run_sft_then_grpo(cfg)
    sft_cfg, grpo_cfg = seen
    assert (sft_cfg.train_dataset.start, sft_cfg.train_dataset.max_intents, sft_cfg.train_dataset.limit) == (0, None, 3)
    assert (grpo_cfg.train_dataset.start, grpo_cfg.train_dataset.max_intents) == (256, 1)
