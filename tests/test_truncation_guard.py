"""The guard against length-driven reward hacking (issue 14): the collector records, per episode, whether its last
generation hit ``max_new_tokens`` (``length_truncated``), and the trainer logs ``episode/truncated_fraction`` and
``episode/response_tokens`` per step, warning when responses collapse or most attempts are cut off."""
from __future__ import annotations

import pytest

import tests.toy_envs  # noqa: F401  (registers ToyVowels-v0)
from tests.test_collector import ScriptedChatEnv
from tests.test_trainer import make_cfg
from torchrl_grpo.backends.base import Generation, RolloutBackend, SamplingConfig
from torchrl_grpo.rollout.collector import GroupCollector
from torchrl_grpo.assembly import build_trainer


class LengthScriptBackend(RolloutBackend):
    """Prompt ``k`` of every call gets ``lengths[call][k % len]`` tokens; a reply shorter than ``max_new_tokens``
    ends with eos (``"stop"``), one of ``max_new_tokens`` tokens is cut (``"length"``)."""

    def __init__(self, tokenizer, lengths: list[list[int]]):
        self.tok, self.lengths, self.calls, self.policy_version = tokenizer, lengths, 0, 0

    def generate(self, prompts, sampling):
        plan = self.lengths[min(self.calls, len(self.lengths) - 1)]
        self.calls += 1
        a = self.tok.encode("a", add_special_tokens=False)[0]
        out = []
        for k in range(len(prompts)):
            n = plan[k % len(plan)]
            if n >= sampling.max_new_tokens:
                ids, reason = [a] * sampling.max_new_tokens, "length"
            else:
                ids, reason = [a] * (n - 1) + [self.tok.eos_token_id], "stop"
            out.append(Generation(ids, [-1.0] * len(ids), reason))
        return out

    def load_weights(self, weights=None):
        self.policy_version += 1


def test_collector_records_length_truncation_of_the_last_generation(tok):
    # 3 turns per episode; 2 prompts per call: prompt 0 is cut at the limit, prompt 1 stops early (turns 1-2);
    # in the last call, prompt 0 stops and prompt 1 is cut: only the LAST generation counts
    be = LengthScriptBackend(tok, [[8, 3], [8, 3], [3, 8]])
    col = GroupCollector(ScriptedChatEnv, be, tok, SamplingConfig(max_new_tokens=8), max_turns=5)
    td = col.collect([{"index": 0}], n_samples=2)
    assert td["num_turns"].tolist() == [3, 3]
    assert td["length_truncated"].dtype.is_floating_point is False
    assert td["length_truncated"].tolist() == [False, True]
    assert not td["context_truncated"].any()  # a different flag: the context limit, not max_new_tokens


def test_trainer_logs_truncated_fraction_and_warns_on_collapse(tmp_path, tiny_model_and_tokenizer, caplog):
    model, tok = tiny_model_and_tokenizer
    # 2 prompts x 4 samples per step, max_new_tokens 16. Step 1: 3 of 4 replies cut at 16 tokens (fraction 0.75 >
    # 0.5: warn). Step 2: every reply 3 tokens and stopped (fraction 0, mean length 3 < 40% of step 1's 13: warn).
    be = LengthScriptBackend(tok, [[16, 16, 16, 4], [3]])
    cfg = make_cfg(gconfig={"n_samples": 4, "max_new_tokens": 16}, train={"steps": 2, "batch_size": 2})
    trainer = build_trainer(cfg, tmp_path, model=model, tokenizer=tok, backend=be)
    with caplog.at_level("WARNING", logger="torchrl_grpo.training.grpo_trainer"):
        m1 = trainer.train_step()
        first_warnings = caplog.text
        caplog.clear()
        m2 = trainer.train_step()
    trainer.close()
    assert m1["episode/truncated_fraction"] == pytest.approx(0.75)
    assert m1["episode/response_tokens"] == pytest.approx((16 * 3 + 4) / 4)
    assert "truncated" in first_warnings and "max_new_tokens" in first_warnings
    assert m2["episode/truncated_fraction"] == 0.0
    assert m2["episode/response_tokens"] == pytest.approx(3.0)
    assert "response length" in caplog.text and "13" in caplog.text
