"""Bounded waits and restores that used to hang or crash (issue 25, item C5): a hung Ray rollout worker, an async
rollout thread that does not stop, CUDA RNG states restored on a machine with fewer GPUs. No Ray cluster and no GPU:
the Ray module, the CUDA RNG calls and the rollout thread's work are stood in for, event-driven."""
from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest
import torch

import tests.toy_envs  # noqa: F401  (registers ToyVowels-v0)
from tests.test_trainer import make_cfg
from torchrl_grpo.training import checkpoint as checkpoint
from torchrl_grpo.assembly import build_trainer


# ------------------------------------------------------------------------------------------------ Ray: hung worker
class _Ref:
    def __init__(self, worker):
        self.worker = worker


class _Actor:
    def __init__(self, w):
        self.collect = SimpleNamespace(remote=lambda *a, **k: _Ref(w))


class _HungRay:
    """Worker 0 answers at once; worker 1 never does. ``wait`` without a timeout would block forever."""

    def __init__(self):
        self.timeouts: list = []

    def wait(self, refs, num_returns=1, timeout=None):
        self.timeouts.append(timeout)
        if timeout is None:
            raise AssertionError("ray.wait without a timeout blocks forever on a hung worker")
        ready = [r for r in refs if r.worker == 0]
        return ready[:num_returns], [r for r in refs if r not in ready[:num_returns]]

    def get(self, ref, timeout=None):  # worker 0's batch (never concatenated: the step fails)
        assert ref.worker == 0
        return None, {}

    def kill(self, actor):
        pass


def test_a_hung_ray_worker_fails_the_step_naming_it_after_the_timeout():
    pytest.importorskip("ray")
    from torchrl_grpo.rollout.ray_workers import RayRolloutCollector

    col = RayRolloutCollector.__new__(RayRolloutCollector)  # no Ray cluster: its module stood in for
    col._ray = _HungRay()
    col.num_workers, col.max_restarts, col.restarts, col.check_sync = 2, 3, 0, False
    col.workers = [_Actor(0), _Actor(1)]
    col.worker_timeout_s = 7.5
    col.last_stats = {}
    with pytest.raises(RuntimeError, match=r"rollout worker\(s\) \[1\].*7\.5 s.*rollout\.worker_timeout_s"):
        col.collect([{"index": i} for i in range(4)], 2, step=0)
    assert col._ray.timeouts and all(t is not None and t <= 7.5 for t in col._ray.timeouts)


def test_a_worker_that_does_not_load_the_weights_fails_the_sync_naming_it():
    pytest.importorskip("ray")
    from ray.exceptions import GetTimeoutError

    from torchrl_grpo.rollout.ray_workers import RayRolloutCollector

    class HungLoad:
        def put(self, obj):
            return obj

        def get(self, ref, timeout=None):
            if timeout is None:
                raise AssertionError("ray.get without a timeout blocks forever on a hung worker")
            if ref == 1:
                raise GetTimeoutError("timed out")
            return ref

    def actor(w):
        return SimpleNamespace(load_weights=SimpleNamespace(remote=lambda weights, version: w))

    col = RayRolloutCollector.__new__(RayRolloutCollector)
    col._ray, col.workers, col.local_backend, col.check_sync = HungLoad(), [actor(0), actor(1)], None, False
    col.policy_version, col.worker_timeout_s = 0, 3.0
    with pytest.raises(RuntimeError, match=r"rollout worker\(s\) \[1\] did not load the weights within 3 s"):
        col.update_policy_weights_(torch.nn.Linear(2, 2))


def test_worker_timeout_is_a_validated_config_key():
    from omegaconf import OmegaConf

    from torchrl_grpo.config import GRPOConfig, validate_config

    cfg = OmegaConf.structured(GRPOConfig)
    assert cfg.rollout.worker_timeout_s > 0
    cfg.rollout.worker_timeout_s = 0
    with pytest.raises(ValueError, match="rollout.worker_timeout_s"):
        validate_config(cfg)


# ------------------------------------------------------------------------------ async: a rollout thread that hangs
def test_async_close_joins_the_rollout_thread_with_a_bound_and_warns(tmp_path, caplog):
    from torchrl_grpo.training.async_trainer import AsyncGRPOTrainer

    cfg = make_cfg(mode="async", train={"steps": 3, "batch_size": 1}, gconfig={"n_samples": 2, "max_new_tokens": 4})
    trainer = build_trainer(cfg, tmp_path, trainer_cls=AsyncGRPOTrainer)
    entered, release = threading.Event(), threading.Event()

    def hung_collect(*a, **k):  # a batch that does not finish (a hung env / user simulator) until released
        entered.set()
        release.wait(timeout=120)
        raise RuntimeError("released by the test")

    trainer.collector.collect = hung_collect
    trainer.close_timeout_s = 0.2
    trainer._start()
    assert entered.wait(timeout=60)
    closer = threading.Thread(target=trainer.close)
    try:
        with caplog.at_level(logging.WARNING, logger="torchrl_grpo.training.async_trainer"):
            closer.start()
            closer.join(timeout=60)  # "does not hang" bound; the join itself is bounded by close_timeout_s = 0.2 s
            assert not closer.is_alive(), "close() waited for a rollout thread that does not finish"
    finally:
        release.set()
        closer.join(timeout=60)
    assert any("rollout thread" in r.getMessage() and "0.2" in r.getMessage() for r in caplog.records
               if r.levelno >= logging.WARNING), [r.getMessage() for r in caplog.records]


# ------------------------------------------------------------------------------------ CUDA RNG on fewer devices
def test_cuda_rng_states_of_more_devices_than_visible_restore_the_visible_ones_with_a_warning(monkeypatch, caplog):
    """A checkpoint saved on 2 GPUs, resumed with 1 visible: torch.cuda.set_rng_state_all raised IndexError
    (``default_generators[1]``). Now devices 0 .. min(saved, visible) - 1 are restored and the rest named in a
    warning."""
    restored: list[int] = []

    def fake_set(state, device="cuda"):
        idx = device if isinstance(device, int) else torch.device(device).index
        if idx >= 1:  # what torch.cuda.default_generators[idx] does with one visible device
            raise IndexError("tuple index out of range")
        restored.append(idx)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", fake_set)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", fake_set)
    state = {"python": __import__("random").getstate(), "numpy": __import__("numpy").random.get_state(),
             "torch": torch.get_rng_state(), "cuda": [torch.zeros(16, dtype=torch.uint8)] * 2}
    with caplog.at_level(logging.WARNING, logger="torchrl_grpo.training.checkpoint"):
        checkpoint.set_rng_state(state)
    assert restored == [0]
    assert any("2 CUDA devices" in r.getMessage() and "1 visible" in r.getMessage() for r in caplog.records)
