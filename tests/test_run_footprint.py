"""What the default run (``python grpo.py``: configs/grpo_reasoning.yaml) writes (issue 36): the trained weights in
final_model/, no optimizer state unless asked; an interrupted run stays resumable (tests/test_interrupt.py)."""
from __future__ import annotations

from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from torchrl_grpo.assembly import build_trainer
from torchrl_grpo.config import register_configs
from torchrl_grpo.model_store import load_model_and_tokenizer

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SMALL = ["actor.path=tiny-random", "train.steps=2", "train.batch_size=1", "gconfig.n_samples=2",
         "gconfig.max_new_tokens=4", "eval.n_problems=2", "econfig.train_size=20", "econfig.test_size=8",
         "stats_logger.wandb.mode=disabled", "stats_logger.progress_bar=false"]


def _default_cfg(tmp_path, *overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="grpo_reasoning", overrides=[*SMALL, f"output_dir={tmp_path}", *overrides])


def _fit(cfg, run_dir):
    trainer = build_trainer(cfg, run_dir)
    try:
        summary = trainer.fit()
        state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    finally:
        trainer.close()
    return summary, state


def test_the_default_run_keeps_the_trained_weights_and_no_optimizer_state(tmp_path):
    """Before: the final checkpoint with AdamW state (1.6 GB for SmolLM2-135M) and no loadable model dir."""
    summary, trained = _fit(_default_cfg(tmp_path), tmp_path)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert not any(f.endswith("optimizer.pt") for f in files), files
    assert not (tmp_path / "checkpoints").exists(), files
    assert summary["final_model"] == str(tmp_path / "final_model")
    assert (tmp_path / "final_model" / "model.safetensors").is_file()
    model, tok = load_model_and_tokenizer(str(tmp_path / "final_model"))  # what actor.path= loads
    loaded = model.state_dict()
    for k, v in trained.items():
        if k in loaded:
            assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), k  # the training dtype, bit-exact


def test_a_resumable_checkpoint_when_asked(tmp_path):
    _fit(_default_cfg(tmp_path, "checkpoint.save_final=true"), tmp_path)
    ckpt = tmp_path / "checkpoints" / "step_000002"
    assert (ckpt / "optimizer.pt").is_file() and (ckpt / "COMPLETE.json").is_file()
    assert (tmp_path / "final_model" / "model.safetensors").is_file()


def test_a_rank_other_than_0_writes_no_config_file(tmp_path):
    """Under torchrun every rank ran ``fit``, and every rank wrote ``<run_dir>/config.yaml`` (the same file, at once:
    a reader could see it truncated); rank 0 writes it, as it writes checkpoints and the final model."""
    from torchrl_grpo.distributed.data_parallel import SINGLE

    class Rank1:
        rank, world_size, enabled, is_main = 1, 2, True, False

        def __getattr__(self, name):  # the rest of the DataParallel interface: as one process
            return getattr(SINGLE, name)

    cfg = _default_cfg(tmp_path, "train.steps=1", "eval.n_problems=0")
    trainer = build_trainer(cfg, tmp_path)
    trainer.components.dp = Rank1()
    try:
        trainer.fit()
    finally:
        trainer.close()
    assert not (tmp_path / "config.yaml").exists(), sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
