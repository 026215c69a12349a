"""Issue 43 (log the mismatch every run): ``rollout/logp_diff_mean`` / ``rollout/logp_diff_max`` (|behaviour log-prob -
the trainer's recompute| over the step's response tokens, nats) and ``rollout/decode`` (the backend's
``decode_path``) land in ``metrics.jsonl`` of the sync and the async trainer, as TRL and verl log theirs: ~0 for the
exact eager path on the tiny model, the injected gap for a sampler whose log-probs are off by a known amount."""
from __future__ import annotations

import json

import pytest

import tests.toy_envs  # noqa: F401  (registers ToyVowels-v0)
from tests.test_trainer import make_cfg
from tests.test_training_core import _skewed_trainer
from torchrl_grpo.assembly import build_trainer
from torchrl_grpo.backends.base import RolloutBackend
from torchrl_grpo.training.async_trainer import AsyncGRPOTrainer

GAP_KEYS = ("rollout/logp_diff_mean", "rollout/logp_diff_max")


def _logged_row(trainer, tmp_path) -> dict:
    trainer.fit()
    trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss/total" in r][-1]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_one_step_run_logs_the_gap_and_the_decode_path(tmp_path, mode):
    over = {"train": {"steps": 1}} if mode == "sync" else {"mode": "async", "train": {"steps": 1, "max_staleness": 0}}
    cls = AsyncGRPOTrainer if mode == "async" else None
    trainer = build_trainer(make_cfg(**over), tmp_path, **({"trainer_cls": cls} if cls else {}))
    path = trainer.backend.decode_path
    row = _logged_row(trainer, tmp_path)
    assert isinstance(path, str) and path and row["rollout/decode"] == path
    for k in GAP_KEYS:  # the exact eager path: the recompute equals the sampler's own log-probs
        assert row[k] is not None and 0.0 <= row[k] < 1e-4, (k, row[k])
    assert row["rollout/logp_diff_mean"] <= row["rollout/logp_diff_max"]


def test_the_gap_is_what_the_sampler_is_off_by(tmp_path):
    """Behaviour log-probs shifted by +-0.3 nats per row (a sampler with other numerics): both numbers are 0.3."""
    trainer = _skewed_trainer(tmp_path, offsets=(0.3, -0.3), train={"steps": 1})
    row = _logged_row(trainer, tmp_path)
    assert row["rollout/logp_diff_mean"] == pytest.approx(0.3, abs=1e-4)
    assert row["rollout/logp_diff_max"] == pytest.approx(0.3, abs=1e-4)
    assert row["rollout/decode"] == "default"  # a backend that does not choose a decode path


def test_decode_path_defaults():
    assert RolloutBackend.decode_path.fget(object.__new__(_Plain)) == "default"
    from torchrl_grpo.backends.vllm_backend import VLLMBackend  # importable without vLLM (it is imported lazily)

    assert VLLMBackend.decode_path.fget(None) == "vllm"


class _Plain(RolloutBackend):
    def generate(self, prompts, sampling):
        raise NotImplementedError

    def load_weights(self, weights):
        raise NotImplementedError
