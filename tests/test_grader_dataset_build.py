"""A grader worker's dataset build is not charged to a grade's CPU budget (issue 49, hole 6).

:func:`envs.reasoning_gym.grading.score` has the library's ``score_answer`` run in a grader worker, which rebuilds the
task's dataset from its config once per worker. The build used to run inside the graded call, under the grade's CPU
bound (cold builds: arc_agi 0.66 s, group_anagrams 0.45 s of a 1 s bound, while scoring takes 0.1 ms): on a machine
1.5x slower every first grade in a fresh worker ran out of CPU and killed its worker, whose replacement did the same.
Here a dataset whose build burns 1.5x the grade's CPU bound must still score its gold answer in a fresh pool, and
again after a bomb replaced the worker; a build that raises, or one past the build's own bound, is a failed grade
that names the build.
"""
from __future__ import annotations

import time

import pytest

from envs import grader_process
from envs.grader_process import GraderPool
from envs.reasoning_gym import grading

#: The grade's CPU bound in these tests (the default is 1 s); the slow build burns 1.5x it.
CPU_S = 0.4


def _burn(seconds: float) -> None:
    """Burn ``seconds`` of this process's CPU, nearly all of it user time (as a dataset build's Python is; reading
    the CPU clock is a system call, so it is read every 10,000 additions)."""
    t0 = time.process_time()
    while time.process_time() - t0 < seconds:
        sum(range(10_000))


class SlowBuildDataset:
    """A dataset built from its config (as the library's are), whose build burns ``config["build_cpu_s"]`` of CPU;
    ``score_answer`` is exact match (1.0 / 0.0), or a C-level CPU bomb for the answer ``"bomb"``."""

    def __init__(self, config: dict):
        self.config = config
        if config.get("raise"):
            raise OSError("the word list is missing")
        _burn(config["build_cpu_s"])

    def score_answer(self, answer, entry) -> float:
        if answer == "bomb":
            (3 ** 300_000_000).bit_length()
        return 1.0 if answer == entry["answer"] else 0.0


@pytest.fixture
def fresh_pool(monkeypatch):
    p = GraderPool(workers=1, cpu_s=CPU_S)
    monkeypatch.setattr(grader_process, "_default", p)
    yield p
    p.close()


def _grade(answer: str, **config):
    dataset = SlowBuildDataset.__new__(SlowBuildDataset)  # built here without burning: only its config travels
    dataset.config = {"build_cpu_s": 1.5 * CPU_S, **config}
    return grading.score(dataset, f"<answer>{answer}</answer>", {"answer": answer}, "slow_build")


def test_a_slow_dataset_build_does_not_eat_the_first_grades_cpu_budget(fresh_pool):
    """Before: grader_timeout ("used more than 0.4 s of CPU time"), the gold scored 0, its worker killed."""
    reward, grade = _grade("42")
    assert reward == 1.0 and grade["grader_timeout"] is False, grade
    assert fresh_pool.counts["grader_timeout"] == 0


def test_a_worker_replaced_after_a_bomb_builds_again_without_charge(fresh_pool):
    assert _grade("42")[0] == 1.0
    reward, grade = _grade("bomb")  # the score itself is a bomb: killed at the grade's bound, the worker replaced
    assert reward == 0.0 and grade["grader_timeout"] is True, grade
    reward, grade = _grade("42")  # the replacement builds the dataset again, outside the grade's budget
    assert reward == 1.0 and grade["grader_timeout"] is False, grade


def test_a_build_that_fails_is_a_grader_error_naming_the_build(fresh_pool):
    reward, grade = _grade("42", **{"raise": True})
    assert reward == 0.0 and grade["grader_error"] is True, grade
    assert "OSError: the word list is missing" in grade["error"] and "preparing" in grade["error"], grade


def test_a_build_past_its_own_cpu_bound_is_a_timeout_naming_the_build(monkeypatch):
    p = GraderPool(workers=1, cpu_s=CPU_S, prepare_cpu_s=0.3)
    monkeypatch.setattr(grader_process, "_default", p)
    try:
        reward, grade = _grade("42")
        assert reward == 0.0 and grade["grader_timeout"] is True, grade
        assert "preparing" in grade["error"] and "0.3 s of CPU" in grade["error"], grade
    finally:
        p.close()
