"""TrajectoryBuffer: filled from a collector-shaped batch, JSON lines round trip, stats, export, sampling."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from torchrl_grpo.continual.trajectory_buffer import Trajectory, TrajectoryBuffer


def fake_batch(rewards, infra=None, first_index=0):
    """A batch with the collector's keys (torchrl_grpo.rollout.collector docstring), one episode per task."""
    n = len(rewards)
    td = TensorDict({
        "reward": torch.tensor(rewards, dtype=torch.float32),
        "num_turns": torch.arange(1, n + 1),
        "response_tokens": torch.full((n,), 7),
        "infra_error": torch.tensor(infra or [False] * n),
    }, batch_size=[n])
    td["task"] = NonTensorStack(*[{"index": first_index + i} for i in range(n)])
    td["info"] = NonTensorStack(*[{"task_id": f"t{first_index + i}", "termination_reason": "agent_stop",
                                   "messages": [{"role": "user", "content": f"q{i}"},
                                                {"role": "assistant", "content": f"a{i}"}]} for i in range(n)])
    return td


def test_add_batch_keeps_fields_and_skips_infra_failures():
    buf = TrajectoryBuffer()
    assert buf.add_batch(fake_batch([1.0, 0.0, 0.5], infra=[False, True, False]), "mock", step=3) == 2
    eps = buf.episodes("mock")
    assert [t.task for t in eps] == [{"index": 0}, {"index": 2}]
    assert [t.reward for t in eps] == [1.0, 0.5]
    assert eps[0].task_id == "t0" and eps[0].step == 3 and eps[0].termination == "agent_stop"
    assert eps[1].num_turns == 3 and eps[1].response_tokens == 7
    assert eps[1].messages[-1] == {"role": "assistant", "content": "a2"}
    assert buf.domains == ["mock"] and len(buf) == 2


def test_capacity_drops_oldest_per_domain():
    buf = TrajectoryBuffer(capacity_per_domain=2)
    buf.add_batch(fake_batch([0.1, 0.2, 0.3]), "mock")
    buf.add_batch(fake_batch([0.9]), "telecom")
    assert [t.reward for t in buf.episodes("mock")] == pytest.approx([0.2, 0.3])
    assert len(buf.episodes("telecom")) == 1
    with pytest.raises(ValueError, match="capacity"):
        TrajectoryBuffer(0)


def test_stats_per_domain():
    buf = TrajectoryBuffer()
    buf.add_batch(fake_batch([1.0, 0.0, 0.5, 1.0]), "mock")
    buf.add_batch(fake_batch([1.0, 1.0], first_index=0), "mock")  # same tasks 0, 1 again
    s = buf.stats()["mock"]
    assert s["episodes"] == 6 and s["tasks"] == 4
    assert s["reward_mean"] == pytest.approx(4.5 / 6) and s["reward_max"] == 1.0
    assert s["success_rate"] == pytest.approx(4 / 6)
    assert buf.state()["episodes"] == 6


def test_save_load_round_trip(tmp_path):
    buf = TrajectoryBuffer()
    buf.add_batch(fake_batch([1.0, 0.25]), "mock", step=1)
    buf.add_batch(fake_batch([0.0]), "telecom", step=2)
    path = buf.save(tmp_path / "sub" / "trajectories.jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["domain"] == "mock"
    back = TrajectoryBuffer.load(path)
    assert back.episodes() == buf.episodes()
    assert back.stats() == buf.stats()
    (tmp_path / "bad.jsonl").write_text('{"domain": "mock"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        TrajectoryBuffer.load(tmp_path / "bad.jsonl")


def test_export_filters_by_reward(tmp_path):
    buf = TrajectoryBuffer()
    buf.add_batch(fake_batch([1.0, 0.69, 0.7, 0.0]), "mock")
    buf.add_batch(fake_batch([0.8]), "telecom")
    assert buf.export(tmp_path / "sft.jsonl") == 3  # 1.0, 0.7 (mock), 0.8 (telecom); default min_reward 0.7
    rows = [json.loads(x) for x in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert [(r["domain"], r["reward"]) for r in rows] == [("mock", 1.0), ("mock", pytest.approx(0.7)),
                                                          ("telecom", pytest.approx(0.8))]
    assert set(rows[0]) == {"domain", "task_id", "reward", "messages"} and rows[0]["messages"][0]["role"] == "user"
    assert buf.export(tmp_path / "m.jsonl", min_reward=0.9, domains=["mock"]) == 1


def test_sampling():
    buf = TrajectoryBuffer()
    buf.add_batch(fake_batch([1.0, 0.0, 0.0, 0.0]), "mock")
    buf.add_batch(fake_batch([0.5, 0.5]), "telecom")
    rng = np.random.default_rng(0)
    good = buf.sample(20, min_reward=0.9, rng=rng)
    assert len(good) == 20 and all(t.reward == 1.0 and t.domain == "mock" for t in good)
    tel = buf.sample(5, domains=["telecom"], rng=rng)
    assert {t.domain for t in tel} == {"telecom"}
    assert buf.sample(0) == []
    with pytest.raises(ValueError, match="reward >= 2"):
        buf.sample(1, min_reward=2.0)
    pairs = buf.sample_tasks(200, ["mock", "telecom", "airline"], rng)
    doms = [d for d, _ in pairs]
    assert set(doms) == {"mock", "telecom"} and 60 < doms.count("mock") < 140  # domains drawn uniformly
    assert {json.dumps(t) for d, t in pairs if d == "mock"} == {json.dumps({"index": i}) for i in range(4)}
    with pytest.raises(ValueError, match="no stored episode"):
        buf.sample_tasks(1, ["airline"], rng)
    # same rng seed -> same draw
    assert buf.sample_tasks(5, ["mock"], np.random.default_rng(1)) == buf.sample_tasks(5, ["mock"],
                                                                                        np.random.default_rng(1))


def test_trajectory_from_dict_requires_core_fields():
    t = Trajectory.from_dict({"domain": "mock", "task": {"index": 1}, "reward": 1.0, "extra": 5})
    assert t.task == {"index": 1} and t.messages == []
    with pytest.raises(ValueError, match="reward"):
        Trajectory.from_dict({"domain": "mock", "task": {}})
