"""Ray rollout workers (torchrl_grpo.rollout.ray_workers): local Ray, tiny model, 2 workers, 3-step runs.

Skipped only when ray is not installed (it is in the [dev] extra). One Ray session for the module (start-up ~5 s).
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from hydra import compose, initialize_config_dir  # noqa: E402

from torchrl_grpo.config import register_configs  # noqa: E402
from torchrl_grpo.rollout.ray_workers import weights_digest  # noqa: E402
from torchrl_grpo.backends.weight_sync import export_hf_weights  # noqa: E402
from torchrl_grpo.assembly import build_trainer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
B, G = 4, 2  # tasks per step, episodes per task


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _trainer(tmp_path, gsm8k_dir, steps=3):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="grpo_gsm8k", overrides=[
            "actor.path=tiny-random", "rollout.launcher=ray", "rollout.num_workers=2", f"train.steps={steps}",
            f"train.batch_size={B}", f"gconfig.n_samples={G}", "gconfig.max_new_tokens=8", "eval.n_problems=0",
            "optimizer.lr=1e-3", "checkpoint.every=0", "checkpoint.save_final=false", "train.device=cpu",
            "stats_logger.wandb.mode=disabled", "stats_logger.progress_bar=false",
            f"train_dataset.path={gsm8k_dir}"])
    trainer = build_trainer(cfg, tmp_path / "run")
    batches = []

    def record(batch):  # random rewards: the tiny random model never solves GSM8K, and a step must move the weights
        batch["reward"] = torch.rand(batch.shape[0], generator=torch.Generator().manual_seed(len(batches)))
        batches.append(batch.exclude("info").clone())
        return batch

    trainer.augment_batch = record
    return trainer, batches


def _check_batch(batch, trainer, step):
    """Every task of the step exactly G times, none twice, none half: group g is task g of tasks_for_step."""
    tasks = [t["index"] for t in trainer.tasks_for_step(step)]
    assert batch.shape[0] == B * G
    assert batch["group_id"].tolist() == [g for g in range(B) for _ in range(G)]
    assert [t["index"] for t in batch["task"]] == [tasks[g] for g in range(B) for _ in range(G)]
    for g in range(B):  # a group never spans workers
        assert batch["worker"][batch["group_id"] == g].unique().numel() == 1


@pytest.mark.slow  # 3 GRPO steps over two Ray workers: ~60 s idle, 177 s loaded (the unit stage's second slowest)
def test_two_workers_train_and_stay_in_sync(ray_session, tmp_path, gsm8k_dir):
    trainer, batches = _trainer(tmp_path, gsm8k_dir)
    try:
        start = weights_digest(export_hf_weights(trainer.model))
        assert set(trainer.collector.worker_digests()) == {start}
        for step in range(3):
            m = trainer.train_step()
            _check_batch(batches[-1], trainer, step)
            assert set(batches[-1]["worker"].tolist()) == {0, 1}  # episodes from both workers
            assert m["rollout/workers"] == 2.0 and m["rollout/worker_restarts"] == 0.0
            assert (batches[-1]["policy_version"] == step).all()  # sampled by the weights of the last sync
            now = weights_digest(export_hf_weights(trainer.model))
            assert now != start  # trained
            assert trainer.collector.worker_digests() == [now, now]  # workers hold the trainer's weights
            start = now
    finally:
        trainer.close()


class KillOnFirstWait:
    """The ray module, except that the first ``wait`` kills ``victim`` first (its dispatched batch is lost)."""

    def __init__(self, ray_module, victim):
        self._ray, self._victim = ray_module, victim

    def wait(self, *a, **k):
        if self._victim is not None:
            self._ray.kill(self._victim)
            self._victim = None
        return self._ray.wait(*a, **k)

    def __getattr__(self, name):
        return getattr(self._ray, name)


@pytest.mark.slow  # 22.6 s of the unit stage at load ~4 (issue 45): kills and replaces a Ray actor mid-run
def test_killed_worker_is_replaced_and_nothing_trained_twice(ray_session, tmp_path, gsm8k_dir):
    trainer, batches = _trainer(tmp_path, gsm8k_dir)
    col = trainer.collector
    try:
        trainer.train_step()
        # kill worker 1 between steps: the next dispatch finds it dead
        ray.kill(col.workers[1])
        m = trainer.train_step()
        assert m["rollout/worker_restarts"] == 1.0
        # kill worker 0 while its batch is in flight: it is kept busy (a call that would block for up to 10 min),
        # the step's collect call is queued behind it, and the actor is killed when the collector first waits for
        # the batches, i.e. after the dispatch (an ordering, not a 1 s timer: issue 25, C7): its tasks were handed
        # over and the batch never comes back
        victim = col.workers[0]
        victim.__ray_call__.remote(lambda self: time.sleep(600))
        col._ray = KillOnFirstWait(ray, victim)
        try:
            m = trainer.train_step()
        finally:
            col._ray = ray
        assert m["rollout/worker_restarts"] == 2.0
        for step, batch in enumerate(batches):
            _check_batch(batch, trainer, step)
        now = weights_digest(export_hf_weights(trainer.model))
        assert trainer.collector.worker_digests() == [now, now]  # replacements received the current weights
        assert trainer.step == 3
    finally:
        trainer.close()


def test_worker_restarts_are_bounded(ray_session, tmp_path, gsm8k_dir):
    trainer, _ = _trainer(tmp_path, gsm8k_dir)
    col = trainer.collector
    col.max_restarts = 0
    try:
        ray.kill(col.workers[0])
        with pytest.raises(RuntimeError, match="max_worker_restarts=0"):
            trainer.train_step()
    finally:
        trainer.close()


def test_more_workers_than_ray_cpus_is_a_clear_error(ray_session):
    import functools

    from torchrl_grpo.backends.base import SamplingConfig
    from torchrl_grpo.assembly.rollout_side import worker_rollout
    from torchrl_grpo.rollout.ray_workers import RayRolloutCollector

    recipe = functools.partial(worker_rollout, {}, SamplingConfig())  # never run: the check comes first
    with pytest.raises(ValueError, match=r"rollout.num_workers=3 actors need 3 CPUs but the Ray cluster has 2"):
        RayRolloutCollector(recipe, 3, device="cpu")
