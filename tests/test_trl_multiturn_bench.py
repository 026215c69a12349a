"""benchmarks/trl_multiturn_bench.py end to end on tiny-random (slow): one warm-up and one timed step of each side on
one generated tau2 mock task x 2 samples, 4 new tokens per turn, both sides evaluated by our evaluator before and after
each step; the results hold both sides with finite numbers and the prompts both sides generated from are the same."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trl_tiny import save_tiny_for_trl

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_one_warmup_and_one_timed_step_per_side_give_finite_numbers(tmp_path):
    # tau2 prompts with their tool schemas are ~4k tokens in tiny-random's byte-level vocabulary: lift its 4096
    # positions and our context limit so that neither side cuts the episode at the prompt
    model = save_tiny_for_trl(tmp_path / "tiny", max_positions=1 << 16)
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "benchmarks" / "trl_multiturn_bench.py"), "--model", str(model),
           "--tasks", "1", "--samples", "2", "--max-new-tokens", "4", "--warmup", "1", "--steps", "1",
           "--micro-batch", "2", "--override", "rollout.max_context_tokens=16384",
           "--eval-every", "1", "--eval-tasks", "1", "--target", "1.0", "--out-dir", str(out)]
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "TOKENIZERS_PARALLELISM": "false",
           "WANDB_MODE": "disabled"}
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600)
    assert p.returncode == 0, (p.stdout[-4000:], p.stderr[-4000:])
    res = json.loads((out / "trl_multiturn_bench.json").read_text())
    assert (out / "trl_multiturn_bench.md").read_text().startswith("# Multi-turn GRPO")

    for side in ("ours", "trl"):
        steps = res[side]["steps"]
        assert [s["warmup"] for s in steps] == [True, False], side
        assert all(s["episodes"] == 2 and s["generated_tokens"] > 0 and s["wall_s"] > 0 for s in steps), steps
        summary = res[side]["summary"]
        for key in ("step_s_median", "step_s_min", "step_s_max", "episodes_per_s", "generated_tokens_per_s",
                    "generate_s_per_step", "turns_per_episode"):
            assert math.isfinite(summary[key]) and summary[key] > 0, (side, key, summary[key])
        assert summary["timed_steps"] == 1 and summary["step_s_min"] <= summary["step_s_median"] <= summary["step_s_max"]
        rows = res["evals"]["rows"][side]
        assert [r["after_steps"] for r in rows] == [0, 1, 2], rows
        assert all(0.0 <= r["accuracy"] <= 1.0 and r["n"] == 1 and math.isfinite(r["eval_s"]) for r in rows), rows
    # the same prompt ids on both sides (TRL renders the env's tool schemas); one task per step on each side (the
    # script itself refuses a run whose TRL steps got other tasks than ours)
    assert res["settings"]["prompt_ids_identical"] is True
    assert all(len(s["task_indices"]) == 1 for s in res["ours"]["steps"])
    assert all(len(s["task_ids"]) == 1 for s in res["trl"]["steps"])
    assert res["trl"]["trl_args"]["max_tool_calling_iterations"] == res["settings"]["max_turns"] - 1
    assert res["trl"]["trl_args"]["generation_kwargs"] == {"max_new_tokens": 4}
    assert res["evals"]["time_to_target_s"] == {"ours": None, "trl": None, "ours_sft": None, "trl_sft": None}
    assert len(res["loadavg_before"]) == 3 and res["versions"]["trl"] and res["meta"]["device"] == "cpu"
    # each step's console line shows the reward the results record for it (TRL's line used to print before TRL had
    # logged that step's reward: 'reward -' for every TRL step while the table had the numbers)
    for side, tag in (("ours", "[ours]"), ("trl", "[trl ]")):
        printed = [ln.rsplit(" reward ", 1)[1].split()[0] for ln in p.stdout.splitlines() if ln.startswith(tag + " step ")]
        assert printed == [f"{s['reward_mean']:.3f}" for s in res[side]["steps"]], (side, printed, p.stdout[-3000:])
