"""A long evaluation shows progress inside its collector calls (issue 45, item 10): a multi-turn chunk whose episodes
finish together used to sit at ``eval (step 2): 0/4 episodes`` for minutes; now every turn moves the bar's postfix
(turn, episodes running, tokens, ETA) and the log gets a line at most every ``EVAL_LOG_EVERY_S`` seconds."""
from __future__ import annotations

import logging

from tests.test_collector import ScriptedBackend, ScriptedChatEnv
from torchrl_grpo.backends.base import SamplingConfig
from torchrl_grpo.rollout import evaluation
from torchrl_grpo.rollout.collector import GroupCollector
from torchrl_grpo.rollout.evaluation import EvalProgress


class RecordingBar:
    def __init__(self):
        self.postfixes, self.n = [], 0

    def set_postfix_str(self, text, refresh=True):
        self.postfixes.append(text)

    def update(self, n):
        self.n += n


def test_every_turn_of_a_multi_turn_evaluation_is_logged_with_tokens_and_an_eta(tok, monkeypatch, caplog):
    """ScriptedChatEnv plays 3 turns: the log shows turns 1, 2, 3 of each chunk, the tokens growing, an ETA."""
    monkeypatch.setattr(evaluation, "EVAL_LOG_EVERY_S", 0.0)
    monkeypatch.setattr(evaluation, "EVAL_CHUNK", 2)
    col = GroupCollector(ScriptedChatEnv, ScriptedBackend(tok), tok, SamplingConfig(max_new_tokens=8), max_turns=30)
    with caplog.at_level(logging.INFO, logger=evaluation.__name__):
        out = evaluation.evaluate(col, task_indices=[0, 1, 2], greedy=True, step=2)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("eval (step 2)")]
    assert [ln.split("turn ")[1].split("/")[0] for ln in lines] == ["1", "2", "3", "1", "2", "3"], lines
    assert all("/30" in ln and "ETA <= " in ln for ln in lines)
    assert "chunk 1/2" in lines[0] and "chunk 2/2" in lines[3] and "2 episodes done" in lines[3]
    tokens = [int(ln.split(" running, ")[1].split(" tokens")[0].replace(",", "")) for ln in lines]
    assert tokens == sorted(tokens) and tokens[0] > 0  # counted across chunks
    assert "3 running" not in lines[0] and "2 running" in lines[0] and "0 running" in lines[2]
    assert out["eval/accuracy"] == 1.0


def test_progress_bar_moves_every_turn_and_counts_episodes_per_chunk():
    bar = RecordingBar()
    p = EvalProgress(bar, "eval (step 0)", chunks=2, max_turns=30, clock=lambda: 0.0)
    for turn in (1, 2, 3):
        p.on_turn(turn, live=4 - turn, tokens=100 * turn)
    assert len(bar.postfixes) == 3 and "turn 3/30" in bar.postfixes[-1] and "300 tokens" in bar.postfixes[-1]
    assert bar.n == 0
    p.chunk_done(4, 300)
    assert bar.n == 4


def test_eta_is_the_turn_limit_bound_at_the_current_pace_plus_the_chunks_left():
    now = [0.0]
    p = EvalProgress(None, "eval", chunks=3, max_turns=10, clock=lambda: now[0])
    now[0] = 20.0  # 2 turns of the first chunk in 20 s: 8 turns left at 10 s, 2 chunks left at 10 turns x 10 s
    assert p.eta_s(2) == 8 * 10 + 2 * 100
    now[0] = 50.0
    p.chunk_done(4, 0)  # the first chunk took 50 s (its episodes ended early): the chunks left are paced by it
    now[0] = 60.0
    assert p.eta_s(1) == 9 * 10 + 1 * 50
