"""benchmarks/quick_guard.py: the CI regression guard's check logic, with fake timings (no model, no timing)."""
import importlib.util
import math
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "quick_guard.py"
_spec = importlib.util.spec_from_file_location("quick_guard", _PATH)
qg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(qg)

REF = {"rollout_vs_hf_generate": 2.0, "update_vs_plain": 1.5, "collector_vs_bare_env": 0.2}


def test_reference_values_pass_and_noise_passes():
    assert qg.check_ratios(dict(REF), REF, 0.6) == []
    assert qg.check_ratios({k: v * 0.7 for k, v in REF.items()}, REF, 0.6) == []  # 30% noise: no failure


def test_two_x_slowdown_of_our_side_fails_with_a_message_naming_the_ratio():
    measured = dict(REF)
    measured["update_vs_plain"] = REF["update_vs_plain"] / 2  # ours twice as slow vs the same baseline
    failures = qg.check_ratios(measured, REF, qg.DEFAULT_FACTOR)
    assert len(failures) == 1
    assert failures[0].startswith("update_vs_plain: 0.750 < 0.6 x reference 1.500")
    assert "2.00x slower" in failures[0]


@pytest.mark.parametrize("bad", [None, math.nan, math.inf, 0.0, -1.0, "fast"])
def test_missing_or_invalid_measurement_fails(bad):
    measured = dict(REF)
    if bad is None:
        del measured["collector_vs_bare_env"]
    else:
        measured["collector_vs_bare_env"] = bad
    failures = qg.check_ratios(measured, REF, 0.6)
    assert len(failures) == 1 and failures[0].startswith("collector_vs_bare_env: no valid measurement")


@pytest.mark.parametrize("factor", [0.0, -0.5, 1.5])
def test_factor_out_of_range_raises(factor):
    with pytest.raises(ValueError, match="factor"):
        qg.check_ratios(dict(REF), REF, factor)


def _fake_measure(ratios):
    def measure(model_name, prompts, samples, new_tokens, repeats):
        return dict(ratios), {"hf_generate_s": 2.0, "ours_generate_s": 1.0}
    return measure


def test_main_check_exits_nonzero_on_regression_and_zero_otherwise(monkeypatch, capsys):
    monkeypatch.setattr(qg, "REFERENCE", dict(REF))
    slow = dict(REF, rollout_vs_hf_generate=0.9)  # 2.0 -> 0.9: below the 1.2 floor
    monkeypatch.setattr(qg, "measure", _fake_measure(slow))
    assert qg.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "quick_guard FAILED" in err and "rollout_vs_hf_generate: 0.900 < 0.6 x reference 2.000" in err
    assert qg.main([]) == 0  # without --check a regression is reported, not fatal
    monkeypatch.setattr(qg, "measure", _fake_measure(REF))
    assert qg.main(["--check"]) == 0
    assert "all ratios >= 0.6 x reference" in capsys.readouterr().out


def test_main_other_model_is_reported_not_checked(monkeypatch, capsys):
    monkeypatch.setattr(qg, "REFERENCE", dict(REF))
    monkeypatch.setattr(qg, "measure", _fake_measure({k: v / 10 for k, v in REF.items()}))
    assert qg.main(["--check", "--model", "tiny-random"]) == 0
    assert "not checked" in capsys.readouterr().out


def test_main_record_writes_results(monkeypatch, tmp_path):
    monkeypatch.setattr(qg, "REFERENCE", dict(REF))
    monkeypatch.setattr(qg, "RESULTS", tmp_path)
    monkeypatch.setattr(qg, "measure", _fake_measure(REF))
    assert qg.main(["--check", "--record"]) == 0
    md = (tmp_path / "quick_guard.md").read_text()
    assert "| update_vs_plain | 1.500 | 1.500 | 0.900 |" in md
    import json

    data = json.loads((tmp_path / "quick_guard.json").read_text())
    assert data["ratios"] == REF and data["failures"] == []


def test_paired_timing_interleaves_the_two_sides_after_one_warm_up_each(monkeypatch):
    calls = []
    clock = iter(range(100))
    monkeypatch.setattr(qg.time, "perf_counter", lambda: float(next(clock)))
    a_s, b_s = qg._paired(lambda: calls.append("a"), lambda: calls.append("b"), repeats=3)
    assert calls == ["a", "b", "a", "b", "a", "b", "a", "b"]  # warm-ups, then a/b alternating
    assert (a_s, b_s) == (1.0, 1.0)  # each timed call spans one tick of the fake clock


def test_update_work_check_refuses_an_update_that_skipped_rows_or_differs_in_gradient():
    """quick_guard's 2026-11-23 update scored 128 of its batch's 256 tokens (gradient norm 3.943 vs the plain
    side's 4.859; /work/measure/qg): such a timing must not count. The correct update: 256 tokens, 4.85942."""
    qg.check_update_work({"num_tokens": 256.0, "grad_norm": 4.859421}, 256, 4.859451)
    with pytest.raises(RuntimeError, match="scored 128.0 tokens, the batch has 256"):
        qg.check_update_work({"num_tokens": 128.0, "grad_norm": 4.859421}, 256, 4.859451)
    with pytest.raises(RuntimeError, match="gradient norm 3.943"):
        qg.check_update_work({"num_tokens": 256.0, "grad_norm": 3.943315}, 256, 4.859451)
    with pytest.raises(RuntimeError, match="scored None tokens"):
        qg.check_update_work({"grad_norm": 4.859421}, 256, 4.859451)
