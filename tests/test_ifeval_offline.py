"""IFEval-v0 never reaches the network unless asked (issue 25, B5): with the NLTK data missing, building the env
must not call ``nltk.download`` (if-verifiable's IFBench module calls it at import); it leaves the prompts out and
says how to get the data."""
from __future__ import annotations

import logging
import sys

import pytest

nltk = pytest.importorskip("nltk")
pytest.importorskip("if_verifiable", reason="IFEval-v0 needs the [ifeval] extra")

import gymnasium as gym

import envs
from envs.ifeval import env as ifeval_env
from envs.ifeval import grading

gym.register_envs(envs)


@pytest.fixture
def no_nltk_data(monkeypatch, tmp_path):
    """NLTK's search path holds only an empty folder; if-verifiable's IFBench modules and our caches are fresh."""
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    monkeypatch.delenv("NLTK_DATA", raising=False)
    for name in [m for m in sys.modules if m.startswith("if_verifiable.ifbench")]:
        monkeypatch.delitem(sys.modules, name)
    grading._registry.cache_clear()
    grading.instruction_available.cache_clear()
    monkeypatch.setattr(ifeval_env, "_warned_unavailable", set())
    yield
    grading._registry.cache_clear()  # later tests see the real NLTK path again
    grading.instruction_available.cache_clear()


def test_make_does_not_download_nltk_data(no_nltk_data, monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(nltk, "download", lambda *a, **k: calls.append(a) or False)
    with caplog.at_level(logging.WARNING):
        env = gym.make("IFEval-v0")
    assert calls == [], f"nltk.download called at construction: {calls}"
    u = env.unwrapped
    assert 0 < len(u.usable_task_indices()) < u.num_tasks  # the checkers needing NLTK data are left out
    assert "python -m nltk.downloader punkt punkt_tab stopwords averaged_perceptron_tagger_eng" in caplog.text
    env.reset(options={"index": u.usable_task_indices(1)[0]})
    env.step("a short answer.")  # grading an available prompt does not download either
    assert calls == []


def test_download_only_when_asked(no_nltk_data, monkeypatch):
    """``IFEVAL_NLTK_DOWNLOAD=1`` lets if-verifiable call ``nltk.download`` (mocked here: no network)."""
    calls = []
    monkeypatch.setattr(nltk, "download", lambda *a, **k: calls.append(a) or False)
    monkeypatch.setenv("IFEVAL_NLTK_DOWNLOAD", "1")
    grading._registry("ifbench")
    assert ("punkt",) in calls
