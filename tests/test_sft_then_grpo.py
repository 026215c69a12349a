"""grpo.py with sft.before_grpo (issue 48 item 2): SFT on gold demonstrations, then GRPO from the written model, in
one run dir, ending on the three-point line (base -> SFT -> GRPO) and learning_curve.png."""
from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from tests.test_tau2_training import tau2_cfg
from torchrl_grpo.cli import run, run_sft_then_grpo
from torchrl_grpo.config import validate_config
from torchrl_grpo.reporting.headline import warm_start_headline


def _cfg(tmp_path, **over):
    base = {"econfig": {"max_steps": 4, "max_turns": 4}, "gconfig": {"max_new_tokens": 6, "n_samples": 2},
            "train_dataset": {"split": "generated_train"}, "valid_dataset": {"split": "generated_test"},
            "train": {"steps": 1, "batch_size": 1, "micro_batch_size": 2},
            "eval": {"at_start": True, "at_end": True, "n_problems": 2, "pass_k": 0},
            "sft": {"before_grpo": True, "limit": 3, "epochs": 1, "minibatch_size": 3, "base_eval_problems": 1,
                    "lr": 1e-3},
            "output_dir": str(tmp_path)}
    return OmegaConf.merge(tau2_cfg("mock", "generated_train"), OmegaConf.create(base), OmegaConf.create(over))


def test_sft_then_grpo_runs_both_phases_in_one_run_dir(tmp_path, caplog):
    cfg = _cfg(tmp_path)
    with caplog.at_level("INFO", logger="grpo"):
        out = run(cfg)
    assert out["base"]["eval/n_tasks"] == 1 and out["sft"]["eval/n_tasks"] == 2 and out["grpo"]["eval/n_tasks"] == 2
    assert (tmp_path / "sft" / "sft_model" / "config.json").is_file()
    rows = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert any("sft/nll" in r for r in rows)
    assert [r["sft/lr"] for r in rows if "sft/lr" in r][0] <= 1e-3  # the SFT phase's own lr
    grpo_rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("loss/total" in r for r in grpo_rows)
    src = json.loads((tmp_path / "model_source.json").read_text())
    assert "sft_model" in json.dumps(src)  # GRPO started from the SFT model
    ev = [json.loads(x) for x in (tmp_path / "eval_episodes.jsonl").read_text().splitlines()]
    assert {r["mode"] for r in ev} == {"greedy"} and len(ev) == 4 and {r["step"] for r in ev} == {0, 1}
    assert all("tool_calls" in r for r in ev)
    assert (tmp_path / "learning_curve.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "warm_start.json").read_text())
    assert set(saved) == {"base", "sft", "grpo", "wall_s"} and saved["wall_s"]["total"] > 0
    last = [r.getMessage() for r in caplog.records if r.getMessage().startswith("result:")]
    assert len(last) == 1 and last[0].startswith("result: pass^1 base ") and " -> SFT " in last[0]
    assert "-> GRPO" in last[0] and f"run dir: {tmp_path}" in last[0] and "(n=1)" in last[0]


def test_warm_start_headline_states_each_phase():
    m = lambda p, n: {"eval/accuracy": p, "eval/n_tasks": float(n)}  # noqa: E731
    line = warm_start_headline(m(0.0, 50), m(0.31, 200), m(0.455, 200), "runs/x")
    assert line == ("result: pass^1 base 0.000 (n=50) -> SFT 0.310 -> GRPO 0.455 (n=200; 95% Wilson "
                    "[0.250, 0.377] -> [0.387, 0.524]); run dir: runs/x")
    assert "base - (not evaluated)" in warm_start_headline(None, m(0.3, 10), m(0.4, 10), "d")


@pytest.mark.parametrize("key,value", [("sft.limit", 0), ("sft.base_eval_problems", -1), ("eval_only", True)])
def test_bad_warm_start_settings_are_refused(tmp_path, key, value):
    cfg = _cfg(tmp_path)
    OmegaConf.update(cfg, key, value)
    with pytest.raises(ValueError, match=key.split(".")[-1] if key != "eval_only" else "before_grpo"):
        validate_config(cfg)


def test_run_sft_then_grpo_is_what_run_calls(tmp_path, monkeypatch):
    called = {}
    monkeypatch.setattr("torchrl_grpo.cli.run_sft_then_grpo", lambda cfg: called.setdefault("cfg", cfg) and {})
    run(_cfg(tmp_path))
    assert "cfg" in called and run_sft_then_grpo is not None
