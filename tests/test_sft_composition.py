"""The SFT trainer by composition (issue 27): not a GRPOTrainer subclass, built from components + SFTSettings + an SFT
update with no config, run on the shared loop shell (each optimizer step under its interrupt rules)."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import signal

import pytest

from tests.test_sft import sft_cfg
from torchrl_grpo.assembly import build
from torchrl_grpo.assembly.trainers import sft_settings
from torchrl_grpo.training.grpo_trainer import GRPOTrainer
from torchrl_grpo.training.interrupt import TrainingInterrupted
from torchrl_grpo.objectives.sft_loss import SFTLoss
from torchrl_grpo.training.sft_trainer import SFTSettings, SFTTrainer, sft_update


def _rows(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sft_trainer_runs_from_components_and_settings_without_a_config(tmp_path):
    assert not issubclass(SFTTrainer, GRPOTrainer)
    cfg = sft_cfg(optimizer={"lr": 2e-3, "warmup_steps": 1, "scheduler": "linear"}, sft={"epochs": 1, "minibatch_size": 3})
    settings = sft_settings(cfg)
    assert settings == SFTSettings(source="gold", epochs=1, minibatch_size=3, min_reward=1.0, rft_rounds=0,
                                   rft_samples=4, save_model=True, lr=2e-3, scheduler="linear", warmup_steps=1)
    c = build(cfg, tmp_path)
    update = sft_update(c.update)
    assert isinstance(update.loss_fn, SFTLoss) and update.optimizer is c.optimizer and update.model is c.model
    trainer = SFTTrainer(c, settings=dataclasses.replace(settings, save_model=False), update=update)
    try:
        summary = trainer.fit()
    finally:
        trainer.close()
    assert trainer.cfg is None and "model_dir" not in summary and not (tmp_path / "sft_model").exists()
    steps = [r["step"] for r in _rows(tmp_path) if "sft/nll" in r]
    kept = summary["demonstrations"]["demo/kept"]
    assert steps == list(range(1, math.ceil(kept / 3) + 1)) and trainer.step == steps[-1]
    assert summary["last"]["sft/round"] == 0.0 and summary["rft"] == []
    with pytest.raises(TypeError, match="build_trainer"):
        SFTTrainer(cfg, settings=settings, update=update)


def test_a_signal_in_an_sft_step_finishes_and_logs_it_then_stops_without_writing_the_model(tmp_path):
    cfg = sft_cfg(sft={"epochs": 2, "minibatch_size": 3})
    c = build(cfg, tmp_path)
    trainer = SFTTrainer(c, settings=sft_settings(cfg), update=sft_update(c.update))
    real = trainer.update

    def update(batch, *, step):
        if step == 1:  # the second optimizer step
            os.kill(os.getpid(), signal.SIGTERM)
        return real(batch, step=step)

    trainer.update = update
    try:
        with pytest.raises(TrainingInterrupted) as ei:
            trainer.fit()
    finally:
        trainer.close()
    assert not ei.value.mid_step and trainer.step == 2
    assert [r["step"] for r in _rows(tmp_path) if "sft/nll" in r] == [1, 2]
    assert not (tmp_path / "sft_model").exists()
