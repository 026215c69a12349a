"""benchmarks/experiments/harness.py and stats.py: the run / summary pieces every experiment driver shares (issue 27).

Pure functions over fake metrics and result files; the only process started is a two-line failing script (no model).
The statistics, prompt-order and runner tests moved here from tests/test_gsm8k_vs_trl.py and test_tau2_sft_table.py
with their assertions unchanged.
"""
import json
import math
import os
import sys
from pathlib import Path

import pytest

from tests.bench_experiments import load
from torchrl_grpo.reporting.learning_curve import wilson_interval

st = load("stats")
h = load("harness")


# ------------------------------------------------------------------------------------------------ stats (moved)
def test_t_quantiles_tabulated_interpolated_and_refused():
    assert st.t95(2) == 4.303 and st.t95(30) == 2.042 and st.t95(100) == 1.96
    assert st.t95(2.5) == pytest.approx((4.303 + 3.182) / 2)
    assert st.t95(22) == pytest.approx(2.086 + (2.060 - 2.086) * 2 / 5)
    with pytest.raises(ValueError, match="degree"):
        st.t95(0.5)


def test_mean_and_welch_intervals_by_hand():
    m, hw = st.mean_ci([0.2, 0.3, 0.25])
    sd = math.sqrt(((0.2 - 0.25) ** 2 + (0.05) ** 2) / 2)
    assert m == pytest.approx(0.25) and hw == pytest.approx(4.303 * sd / math.sqrt(3))
    assert math.isnan(st.mean_ci([0.2])[1])
    # equal n and variances: Welch df = 2(n-1) = 4, se = sqrt(2 s^2 / n)
    d, hw = st.welch_ci([0.3, 0.4, 0.35], [0.2, 0.3, 0.25])
    assert d == pytest.approx(0.1) and hw == pytest.approx(2.776 * math.sqrt(2 * 0.0025 / 3))
    assert math.isnan(st.welch_ci([0.3], [0.2, 0.3])[1])


def test_mcnemar_exact_by_hand():
    assert st.mcnemar_exact(0, 0) == 1.0
    assert st.mcnemar_exact(0, 5) == pytest.approx(2 / 32)  # 2 * P(X <= 0), X ~ Binom(5, 1/2)
    assert st.mcnemar_exact(1, 6) == pytest.approx(2 * (1 + 7) / 128)
    assert st.mcnemar_exact(3, 3) == 1.0 and st.mcnemar_exact(6, 1) == st.mcnemar_exact(1, 6)


# ------------------------------------------------------------------------------------------------ stats (new)
def test_paired_counts_over_the_shared_tasks_only():
    first = {"a": True, "b": False, "c": False, "d": True, "x": True}
    last = {"a": True, "b": True, "c": False, "d": False, "y": False}
    assert st.paired_counts(first, last) == {"n": 4, "both": 1, "neither": 1, "only_first": 1, "only_last": 1}
    assert st.paired_counts({"a": True}, {"b": True})["n"] == 0


def test_welch_of_two_constant_arms_is_exact_and_its_df_is_welch_satterthwaite():
    assert st.welch_ci([0.3, 0.3], [0.2, 0.2]) == (pytest.approx(0.1), 0.0)
    # unequal variances: v_a = 0.01/3, v_b = 0.0001/3 -> df = (v_a + v_b)^2 / (v_a^2/2 + v_b^2/2) = 2 * 1.01^2 / 1.0001
    # = 2.04, t quantile interpolated between df 2 (4.303) and 3 (3.182)
    a, b = [0.2, 0.3, 0.4], [0.29, 0.30, 0.31]
    va, vb = 0.01 / 3, 0.0001 / 3
    t = 4.303 + (3.182 - 4.303) * (2 * 1.01 ** 2 / 1.0001 - 2)
    assert st.welch_ci(a, b)[1] == pytest.approx(t * math.sqrt(va + vb))


def test_wilson_helpers_are_the_reporting_interval():
    """Wilson comes from torchrl_grpo.reporting (one copy): k/n form, NaN at n = 0, the table text, the error bars."""
    assert st.wilson(50, 250) == wilson_interval(0.2, 250)
    assert all(math.isnan(x) for x in st.wilson(0, 0))
    lo, hi = wilson_interval(0.2, 250)
    assert st.acc_wilson(0.2, 250) == f"0.200 (50/250) [{lo:.3f}, {hi:.3f}]"
    below, above = st.wilson_yerr([0.2, 0.5], [250, 10])
    lo2, hi2 = wilson_interval(0.5, 10)
    assert below == pytest.approx([0.2 - lo, 0.5 - lo2]) and above == pytest.approx([hi - 0.2, hi2 - 0.5])
    with pytest.raises(ValueError):
        st.acc_wilson(0.2, 0)


# ------------------------------------------------------------------------------------------------ running (moved)
@pytest.mark.parametrize("seed", [1, 2, 3, 17])
def test_trl_gets_the_same_prompts_in_the_same_order_as_our_trainer(seed):
    from types import SimpleNamespace

    from torchrl_grpo.training.grpo_trainer import GRPOTrainer

    fake = SimpleNamespace(settings=SimpleNamespace(batch_size=2, seed=seed), train_tasks=list(range(7473)))
    ours = [t["index"] for step in range(10) for t in GRPOTrainer.tasks_for_step(fake, step)]
    assert h.trl_prompt_order(seed, 7473, 20) == ours
    with pytest.raises(ValueError, match="one epoch"):
        h.trl_prompt_order(seed, 10, 20)


@pytest.mark.parametrize("cores", [None, "0"])
def test_run_logged_names_the_failed_script_and_keeps_the_log(tmp_path, cores):
    """A failing stage raises with the script's name (also when pinned by taskset) and the log's tail."""
    import shutil

    if cores and shutil.which("taskset") is None:
        pytest.skip("taskset not installed")
    script = tmp_path / "failing_stage.py"
    script.write_text("print('step 1 ok')\nraise SystemExit(3)\n")
    log = tmp_path / "run.log"
    with pytest.raises(RuntimeError, match=r"failing_stage\.py exited 3") as e:
        h.run_logged([sys.executable, str(script)], log, cores=cores, threads=0)
    assert "step 1 ok" in str(e.value)
    assert log.read_text().startswith("$ ") and "step 1 ok" in log.read_text()


# ------------------------------------------------------------------------------------------------ running (new)
def test_run_logged_appends_and_children_run_this_checkout_with_the_threads_asked(tmp_path):
    script = tmp_path / "show_env.py"
    script.write_text("import os\nprint(os.environ['PYTHONPATH'].split(os.pathsep)[0], os.environ.get('OMP_NUM_THREADS'),"
                      " os.getcwd())\n")
    log = tmp_path / "run.log"
    log.write_text("earlier run\n")
    wall = h.run_logged([sys.executable, str(script)], log, threads=3)
    text = log.read_text()
    assert wall >= 0 and text.startswith("earlier run\n$ ")  # appended, never truncated
    assert f"{h.REPO} 3 {h.REPO}" in text
    assert (h.REPO / "grpo.py").is_file()  # REPO is the checkout root, two levels above experiments/


def test_child_env_leaves_threads_alone_at_zero_and_keeps_an_existing_pythonpath(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    env = h.child_env(0)
    assert env["PYTHONPATH"] == f"{h.REPO}{os.pathsep}/elsewhere" and env["OMP_NUM_THREADS"] == "7"
    assert h.child_env(2)["MKL_NUM_THREADS"] == "2"


# ------------------------------------------------------------------------------------------------ metrics (new)
def _metrics_file(d: Path, rows: list[dict]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return d


def test_read_metrics_skips_blank_lines_and_a_missing_file_is_no_rows(tmp_path):
    d = _metrics_file(tmp_path / "run", [{"step": 1, "reward/mean": 0.5}, {"step": 2}])
    assert h.read_metrics(d) == [{"step": 1, "reward/mean": 0.5}, {"step": 2}]
    assert h.read_metrics(tmp_path / "none") == []


def test_evaluations_and_the_final_one(tmp_path):
    rows = [{"eval/accuracy": 0.2, "eval/n_tasks": 200},  # no step: the evaluation before training, step 0
            {"step": 1, "reward/mean": 0.1},
            {"step": 4, "eval/accuracy": 0.25, "eval/n_tasks": 200, "eval/time_s": 9.0, "eval/tokens_per_s": 30.0},
            {"step": 5, "eval/accuracy": 0.5}]  # n not logged: 0
    assert h.evaluations(rows) == [{"step": 0, "accuracy": 0.2, "n": 200}, {"step": 4, "accuracy": 0.25, "n": 200},
                                   {"step": 5, "accuracy": 0.5, "n": 0}]
    assert h.final_eval(rows[:3]) == {"accuracy": 0.25, "n": 200, "time_s": 9.0, "tokens_per_s": 30.0}
    assert h.last_eval_row(rows) is rows[3]
    with pytest.raises(RuntimeError, match="no eval/accuracy"):
        h.final_eval([{"step": 1, "reward/mean": 0.1}])


# ------------------------------------------------------------------------------------------------ results (new)
def test_budget_diff_names_changed_and_missing_keys_only():
    ref = {"steps": 10, "lr": 1e-5, "model": "m"}
    assert h.budget_diff(ref, dict(ref), ("steps", "lr", "model")) == []
    assert h.budget_diff(ref, {"steps": 20, "lr": 1e-5}, ("steps", "lr", "model")) == ["steps", "model"]
    assert h.budget_diff(ref, {"steps": 20}, ("lr",)) == ["lr"]


def test_load_json_skips_missing_files_in_order(tmp_path):
    for i in (1, 2):
        (tmp_path / f"r{i}.json").write_text(json.dumps({"seed": i}))
    assert h.load_json([tmp_path / "r2.json", tmp_path / "nope.json", tmp_path / "r1.json"]) == [{"seed": 2}, {"seed": 1}]


def test_write_outputs_makes_the_folder_and_all_three_files(tmp_path):
    drawn = []
    h.write_outputs(tmp_path / "new" / "table", "| a |\n", {"x": 1.5}, drawn.append)
    assert (tmp_path / "new" / "table.md").read_text() == "| a |\n"
    assert json.loads((tmp_path / "new" / "table.json").read_text()) == {"x": 1.5}
    assert drawn == [tmp_path / "new" / "table.png"]


def test_run_metadata_records_commit_command_versions_and_load():
    meta = h.process_meta("0", 2, "transformers")
    assert set(meta) == {"commit", "command", "date", "device", "cores", "threads", "backend", "loadavg_start"}
    assert meta["cores"] == "0" and meta["threads"] == 2 and meta["backend"] == "transformers"
    assert meta["command"].startswith(sys.executable) and meta["date"].endswith(" UTC") and len(meta["loadavg_start"]) == 3
    assert meta["commit"] in ("", h.git_commit()) and (meta["commit"] == "" or len(meta["commit"]) == 40)
    v = h.package_versions(("pytest", "no-such-distribution-xyz"))
    assert v["pytest"] == pytest.__version__ and v["no-such-distribution-xyz"] is None
