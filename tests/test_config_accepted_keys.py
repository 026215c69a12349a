"""Accepted-but-ignored config (issue 25, item C6): every key either does what it says or fails at start-up, in
``validate_config``, with a ValueError naming it."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import tests.toy_envs  # noqa: F401  (registers ToyVowels-v0)
from tests.test_trainer import make_cfg
from torchrl_grpo.config import GRPOConfig, validate_config

REPO = Path(__file__).resolve().parents[1]


def cl_cfg(**over):
    """A continual config as configs/grpo_cl.yaml writes one (checkpoints per task, no periodic ones)."""
    base = {"cl": {"task_order": ["mock", "telecom"], "num_steps_per_task": 1,
                   "train_split": {"telecom": "small"}, "eval_split": {"telecom": "small"}},
            "eval": {"n_problems": 2}, "checkpoint": {"every": 0}}
    return OmegaConf.merge(OmegaConf.structured(GRPOConfig), OmegaConf.create(base), OmegaConf.create(over))


def test_the_continual_base_config_is_valid():
    validate_config(cl_cfg())


@pytest.mark.parametrize("over,key", [
    ({"eval_only": True}, "eval_only"),  # used to train the whole sequence anyway
    ({"eval": {"every": 5}}, "eval.every"),  # the continual trainer scores every cl.eval_interval steps
    ({"checkpoint": {"every": 2}}, "checkpoint.every"),  # it checkpoints per task (cl.save_checkpoints)
    ({"train": {"resume_from": "/somewhere/checkpoints/step_000004"}}, "train.resume_from"),  # cl.resume_from
    # no per-task checkpoints and a final one asked for: the run used to end with no checkpoint at all
    ({"cl": {"save_checkpoints": False}, "checkpoint": {"save_final": True}}, "checkpoint.save_final"),
    # it always scores every domain before training and after the last task (the accuracy matrix's b and last row)
    ({"eval": {"at_start": False}}, "eval.at_start"),
    ({"eval": {"at_end": False}}, "eval.at_end"),
    # it keeps every task's checkpoint_task_<k>/ (cl.resume_from continues from any of them)
    ({"checkpoint": {"keep_last": 1}}, "checkpoint.keep_last"),
])
def test_continual_runs_refuse_the_keys_they_do_not_read(over, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        validate_config(cl_cfg(**over))


@pytest.mark.parametrize("train,key", [({"partial_rollout_chunk": 4}, "train.partial_rollout_chunk"),
                                       ({"max_staleness": 2}, "train.max_staleness")])
def test_async_only_keys_fail_in_sync_mode(train, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.") + ".*mode=async"):
        validate_config(make_cfg(train=train))
    validate_config(make_cfg(mode="async", train=train))  # where they are read


def test_sync_mode_with_the_schema_defaults_is_valid_and_async_defaults_to_staleness_1():
    validate_config(make_cfg())  # no async key set
    validate_config(make_cfg(train={"max_staleness": 0}))  # what sync is: staleness 0
    from torchrl_grpo.assembly import max_staleness

    assert max_staleness(make_cfg(mode="async")) == 1  # AReaL's one-step-off pipeline, the async default
    assert max_staleness(make_cfg(mode="async", train={"max_staleness": 0})) == 0


def _load_sft_script():
    spec = importlib.util.spec_from_file_location("sft_script", REPO / "sft.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sft_py_eval_only_evaluates_and_does_not_train(tmp_path):
    """sft.py eval_only=true used to run the whole SFT recipe (gold demonstrations, fine-tuning, sft_model/)."""
    sft = _load_sft_script()
    cfg = make_cfg(eval_only=True, output_dir=str(tmp_path), gconfig={"n_samples": 2, "max_new_tokens": 4},
                   train={"batch_size": 1}, eval={"n_problems": 2})
    out = sft.run(cfg)
    assert "eval/accuracy" in out
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(not any(k.startswith(("sft/", "demo/", "rft/")) for k in r) for r in rows)
    assert any("eval/accuracy" in r for r in rows)
    assert not (tmp_path / "sft_model").exists()
