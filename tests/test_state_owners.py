"""One owner for each piece of state (issue 37): the env side (collectors, train tasks, eval tasks, baseline) lives in
``components.env_side`` only, the trainer reads its components instead of copying them, and the evaluator asks the
env side for the eval tasks and baseline. After ``use_env`` (a continual domain switch) every reader sees the new env
side and nothing still holds the old one."""
from __future__ import annotations

import dataclasses

import pytest

import tests.toy_envs  # noqa: F401  (registers ToyVowels-v0)
from tests.test_trainer import make_cfg
from torchrl_grpo.assembly import build_trainer
from torchrl_grpo.rollout.env_side import make_env_side


def _held(*owners) -> list:
    """Every attribute value of ``owners`` (instance dicts and dataclass fields), one level deep."""
    out = []
    for o in owners:
        out += list(vars(o).values())
        if dataclasses.is_dataclass(o):
            out += [getattr(o, f.name) for f in dataclasses.fields(o)]
    return out


def test_use_env_switches_every_reader_and_keeps_one_copy(tmp_path):
    cfg = make_cfg(gconfig={"n_samples": 2, "max_new_tokens": 4}, train={"steps": 1, "batch_size": 2},
                   eval={"n_problems": 2}, stats_logger={"samples_per_step": 0})
    trainer = build_trainer(cfg, tmp_path)
    c, old = trainer.components, trainer.components.env_side
    new = make_env_side(("ToyVowels-v0", {"split": "train", "n_tasks": 5}), ("ToyVowels-v0", {"split": "test",
                        "n_tasks": 3}), trainer.backend, trainer.tokenizer, c.sampling, max_turns=1,
                        max_context_tokens=256, seed=7, train_limit=None, n_eval=None)
    assert new.train_tasks == [0, 1, 2, 3, 4] and old.train_tasks == list(range(8))
    collected, evaluated, closed = [], [], []
    new.collector.collect = lambda tasks, n, **kw: (collected.append(tasks), type(new.collector).collect(
        new.collector, tasks, n, **kw))[1]
    real_eval = new.eval_collector.collect
    new.eval_collector.collect = lambda tasks, n, **kw: (evaluated.extend(t["index"] for t in tasks),
                                                         real_eval(tasks, n, **kw))[1]
    try:
        trainer.use_env(new)
        # one owner: the components hold the new side, the trainer's names are views of it (identity, not copies)
        assert c.env_side is new and trainer.components is c and trainer.evaluator.components is c
        assert trainer.collector is new.collector and trainer.eval_collector is new.eval_collector
        assert trainer.train_tasks is new.train_tasks
        # nothing of the trainer, its evaluator or the components still holds the old side or its parts
        held = _held(trainer, trainer.evaluator, c)
        for part in (old, old.collector, old.eval_collector, old.train_tasks):
            assert not any(x is part for x in held), part
        # the collector: the step's tasks are the new side's, collected by its collector
        m = trainer.train_step()
        assert [t["index"] for t in collected[0]] and {t["index"] for t in collected[0]} <= set(new.train_tasks)
        assert m["groups/kept_episodes"] >= 0
        # the evaluator: the new side's eval tasks (listed once, by the side) and its eval collector
        assert trainer.evaluator.n_tasks is None  # nothing listed on the new side yet
        out = trainer.evaluate()
        assert sorted(set(evaluated)) == new.eval_tasks() == [0, 1, 2] and out["eval/n_tasks"] == 3.0
        assert trainer.evaluator.n_tasks == 3
        # back to the first side: the evaluator reads its tasks again (no stale copy of the other side's)
        trainer.use_env(old)
        assert trainer.evaluator.n_tasks is None and trainer.collector is old.collector
        assert trainer.evaluate()["eval/n_tasks"] == 2.0 and old.eval_tasks() == [0, 1]
        # the checkpoint reads no env state: a save after the switches is the trainer's step as before
        assert trainer.save().name == "step_000001"
        trainer.use_env(new)
        for col in (new.collector, new.eval_collector):
            col.close = lambda col=col: closed.append(col)
    finally:
        trainer.close()  # closes the env side the components hold now (the new one), not the old one
        old.close()
    assert closed == [new.collector, new.eval_collector]


def test_trainer_views_of_components_are_read_only(tmp_path):
    """``trainer.model`` etc. are the components' objects; assigning one raises instead of forking a second copy."""
    trainer = build_trainer(make_cfg(train={"steps": 1}), tmp_path)
    try:
        c = trainer.components
        assert trainer.model is c.model and trainer.updater is c.update and trainer.settings is c.settings
        assert trainer.optimizer is c.optimizer and trainer.logger is c.logger and trainer.backend is c.backend
        with pytest.raises(AttributeError, match="components.update"):
            trainer.updater = None
        with pytest.raises(AttributeError, match="components.env_side.collector"):
            trainer.collector = None
    finally:
        trainer.close()
