"""benchmarks/experiments/tau2_sft_table.py (issue 14 s.2): the stage commands, the summary over fake results, and the three
stages end to end on the mock domain with the tiny random model."""
import json
import math
import os
from pathlib import Path

import pytest

from tests.bench_experiments import load

tt = load("tau2_sft_table")


def _args(stage="base", *extra):
    return tt.parse([stage, *extra])


def _value(cmd, key):
    hits = [c.split("=", 1)[1] for c in cmd if c.startswith(key + "=")]
    assert len(hits) == 1, (key, hits)
    return hits[0]


def test_every_stage_trains_on_train_and_scores_the_test_split_once_at_its_end(tmp_path):
    a = _args("sft", "--domain", "airline", "--out-root", str(tmp_path))
    for stage in ("base", "sft"):
        cmd = tt.stage_command(a, stage, tmp_path / stage)
        assert _value(cmd, "train_dataset.split") == "train" and _value(cmd, "valid_dataset.split") == "test"
        assert _value(cmd, "eval.at_start") == "false" and _value(cmd, "eval.at_end") == "true"
        assert _value(cmd, "eval.pass_k") == "4" and _value(cmd, "econfig.solo_mode") == "false"
        assert _value(cmd, "econfig.user") == "scripted" and _value(cmd, "gconfig.max_new_tokens") == "256"
    base = tt.stage_command(a, "base", tmp_path / "b")
    assert base[1].endswith("grpo.py") and "eval_only=true" in base
    sft = tt.stage_command(a, "sft", tmp_path / "s")
    assert sft[1].endswith("sft.py") and _value(sft, "sft.source") == "gold" and _value(sft, "actor.peft.enable") == "false"
    telecom = tt.stage_command(_args("base", "--domain", "telecom"), "base", tmp_path)
    assert _value(telecom, "econfig.solo_mode") == "true"
    mock = tt.stage_command(_args("base", "--domain", "mock"), "base", tmp_path)
    assert _value(mock, "train_dataset.split") == _value(mock, "valid_dataset.split") == "base"


def test_grpo_starts_from_the_sft_model_of_its_seed_and_refuses_a_missing_one(tmp_path):
    a = _args("grpo", "--seed", "2", "--out-root", str(tmp_path), "--lora-r", "16")
    with pytest.raises(FileNotFoundError, match="seed 2"):
        tt.stage_command(a, "grpo", tmp_path / "g")
    m = tmp_path / "sft" / "seed2" / "sft_model"
    m.mkdir(parents=True)
    (m / "config.json").write_text("{}")
    cmd = tt.stage_command(a, "grpo", tmp_path / "g")
    assert _value(cmd, "actor.path") == str(m) and _value(cmd, "actor.peft.r") == "16"
    assert _value(cmd, "seed") == "2" and _value(cmd, "train.steps") == "4"
    from_base = tt.stage_command(_args("grpo", "--grpo-from", "base"), "grpo", tmp_path / "g")
    assert _value(from_base, "actor.path") == "smollm2-135m-instruct"


def test_bad_user_is_refused():
    with pytest.raises(SystemExit):
        tt.parse(["base", "--user", "nobody"])


def _write(root: Path, stage: str, seed, p1: float, pk=0.1, eval_over=None, train_over=None):
    a = _args(stage if stage != "base" else "base")
    b = tt.budget(a, stage)
    b["eval"].update(eval_over or {})
    b["train"].update(train_over or {})
    d = root / "base" if stage == "base" else root / stage / f"seed{seed}"
    d.mkdir(parents=True)
    res = {"stage": stage, "seed": seed, "budget": b, "wall_s": 120.0, "device": "cpu x2",
           "eval": {"pass^1": p1, "n": 20, "k": 4, "pass^k": pk, "pass@k": 0.3, "do_nothing_pass^1": 0.15},
           "train": []}
    (d / "result.json").write_text(json.dumps(res))


def test_summary_table_means_and_plot(tmp_path):
    _write(tmp_path, "base", None, 0.0, pk=0.0)
    for s, p in [(1, 0.10), (2, 0.20), (3, 0.15)]:
        _write(tmp_path, "sft", s, p)
    _write(tmp_path, "grpo", 1, 0.25)
    s = tt.summarise(tmp_path)
    assert s["stages"]["sft"]["seeds"] == [1, 2, 3] and s["stages"]["sft"]["pass^1_mean"] == pytest.approx(0.15)
    assert s["stages"]["sft"]["pass^1_ci"] == pytest.approx(4.303 * 0.05 / math.sqrt(3))
    assert math.isnan(s["stages"]["grpo"]["pass^1_ci"]) and s["do_nothing_pass^1"] == 0.15
    md = tt.to_markdown(s, tmp_path)
    assert "0.100 (2/20)" in md and md.count("| sft |") == 4 and "one run: no interval" in md
    assert "Do-nothing baseline" in md and "pass^4" in md
    assert tt.plot(s, tmp_path / "p.png").stat().st_size > 1000


def test_different_eval_or_stage_budgets_are_refused(tmp_path):
    _write(tmp_path, "base", None, 0.0)
    _write(tmp_path, "sft", 1, 0.1, eval_over={"n_eval": 10})
    with pytest.raises(ValueError, match="n_eval"):
        tt.summarise(tmp_path)
    root = tmp_path / "two"
    _write(root, "sft", 1, 0.1)
    _write(root, "sft", 2, 0.1, train_over={"sft_epochs": 9})
    with pytest.raises(ValueError, match="sft_epochs"):
        tt.summarise(root)


def s_warm(root):
    return tt.summarise(root)["warm_starts"][0]["status"].split(" (")[0]


@pytest.mark.slow  # end-to-end, 35-80 s on 2 cores: the slow stage (README: the unit command stays ~10 min)
def test_three_stages_end_to_end_on_mock_with_the_tiny_model(tmp_path):
    """base -> sft -> grpo through the real sft.py / grpo.py processes (tiny random model, mock domain, one step
    each): every stage writes a result.json with the test-split evaluation and the do-nothing baseline, grpo starts
    from sft's merged model, and summary builds the table."""
    common = ["--domain", "mock", "--model", "tiny-random", "--out-root", str(tmp_path), "--n-eval", "2",
              "--pass-k", "2", "--max-new-tokens", "4", "--max-turns", "2", "--max-context", "4096",
              "--sft-epochs", "1", "--sft-minibatch", "4", "--grpo-steps", "1", "--grpo-prompts", "1",
              "--grpo-samples", "2", "--threads", "1"]
    os.environ.setdefault("WANDB_MODE", "disabled")
    # a warm start re-created without its eval (another session's grpo run) is the very model an evaluated sft run saves
    assert tt.main(["sft", *common, "--warm-start-only"]) == 0
    warm = json.loads((tmp_path / "sft" / "seed1" / "warm_start.json").read_text())
    assert not (tmp_path / "sft" / "seed1" / "result.json").exists() and warm["model_sha256"]
    assert not (tmp_path / "sft" / "seed1" / "eval_episodes.jsonl").exists()
    for stage in ("base", "sft"):
        assert tt.main([stage, *common]) == 0
    assert tt.main(["grpo", *common, "--checkpoint-every", "1"]) == 0
    # a cut grpo run continues from its checkpoint (here: after its one step, so only the eval is redone) and its
    # re-evaluated episodes replace, not double, the first ones
    run = tmp_path / "grpo" / "seed1"
    assert (run / "checkpoints" / "step_000001").is_dir()
    assert tt.main(["grpo", *common, "--checkpoint-every", "1", "--resume"]) == 0
    resumed = json.loads((run / "result.json").read_text())
    assert resumed["resumed"] and f"train.resume_from={run}" in resumed["stage_command"]
    assert [r["step"] for r in resumed["train"] if "reward/mean" in r] == [1]
    grpo = json.loads((tmp_path / "grpo" / "seed1" / "result.json").read_text())
    assert f"actor.path={tmp_path / 'sft' / 'seed1' / 'sft_model'}" in grpo["stage_command"]
    sft = json.loads((tmp_path / "sft" / "seed1" / "result.json").read_text())
    assert sft["model_sha256"] == warm["model_sha256"] == grpo["start_model_sha256"]  # SFT is deterministic per seed
    assert s_warm(tmp_path) == "same model"
    assert any("sft/nll" in r for r in sft["train"]) and any("demo/kept" in r for r in sft["train"])
    s = tt.summarise(tmp_path)
    assert list(s["stages"]) == ["base", "sft", "grpo"]
    for r in s["runs"]:
        assert r["n"] == 2 and r["pass^k"] is not None and r["do_nothing_pass^1"] is not None
    assert "mock has one split" in tt.to_markdown(s, tmp_path)
    # every stage recorded its per-task outcomes (2 eval tasks: greedy + 2 samples each), so every stage pair is paired
    for st in ("base", "sft", "grpo"):
        r = json.loads(((tmp_path / "base") if st == "base" else (tmp_path / st / "seed1")).joinpath("result.json").read_text())
        assert len(r["per_task"]) == 2 and all(len(v["sampled"]) == 2 for v in r["per_task"].values())
        assert sum((v["greedy"] or 0) >= 1.0 for v in r["per_task"].values()) / 2 == pytest.approx(r["eval"]["pass^1"])
    assert [(q["first"], q["second"]) for q in s["paired"]] == [("do-nothing", "base"), ("do-nothing", "sft"),
                                                                 ("do-nothing", "grpo"), ("base", "sft"),
                                                                 ("base", "grpo"), ("sft", "grpo")]
    assert all(q["n"] == 2 for q in s["paired"]) and "McNemar" in tt.to_markdown(s, tmp_path)


def test_resume_only_when_asked_and_a_complete_checkpoint_is_there(tmp_path):
    m = tmp_path / "sft" / "seed1" / "sft_model"
    m.mkdir(parents=True)
    (m / "config.json").write_text("{}")
    run = tmp_path / "grpo" / "seed1"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)  # no COMPLETE.json: a save that was killed
    with_resume = tt.stage_command(_args("grpo", "--out-root", str(tmp_path), "--resume"), "grpo", run)
    assert not any(c.startswith("train.resume_from=") for c in with_resume)
    plain = tt.stage_command(_args("grpo", "--out-root", str(tmp_path), "--checkpoint-every", "2"), "grpo", run)
    assert _value(plain, "checkpoint.every") == "2" and not any(c.startswith("train.resume_from=") for c in plain)
    assert _value(tt.stage_command(_args("base"), "base", run), "checkpoint.every") == "0"


def test_per_task_outcomes_take_the_last_evaluation_and_pair_on_the_same_tasks(tmp_path):
    rows = [{"step": 0, "mode": "greedy", "task": {"index": 0}, "task_id": "a", "reward": 0.0},
            {"step": 4, "mode": "greedy", "task": {"index": 0}, "task_id": "a", "reward": 1.0},
            {"step": 4, "mode": "greedy", "task": {"index": 1}, "task_id": "b", "reward": 0.0},
            {"step": 4, "mode": "sampled", "task": {"index": 1}, "task_id": "b", "reward": 1.0},
            {"step": 4, "mode": "sampled", "task": {"index": 1}, "task_id": "b", "reward": 0.0},
            {"step": 4, "mode": "greedy", "task": {"index": 2}, "task_id": None, "reward": 1.0}]
    (tmp_path / "eval_episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pt = tt.per_task_outcomes(tmp_path)
    assert pt == {"a": {"greedy": 1.0, "sampled": []}, "b": {"greedy": 0.0, "sampled": [1.0, 0.0]},
                  "{'index': 2}": {"greedy": 1.0, "sampled": []}}
    assert tt.per_task_outcomes(tmp_path / "none") is None
    other = {"a": {"greedy": 0.0, "sampled": []}, "b": {"greedy": 1.0, "sampled": []},
             "{'index': 2}": {"greedy": 1.0, "sampled": []}}
    q = tt.paired_greedy(pt, other)
    assert (q["both"], q["only_first"], q["only_second"], q["neither"]) == (1, 1, 1, 0)
    assert q["only_second_tasks"] == ["b"] and q["p_mcnemar"] == 1.0
    with pytest.raises(ValueError, match="same tasks"):
        tt.paired_greedy(pt, {"a": {"greedy": 1.0, "sampled": []}})


def test_summary_pairs_stages_of_the_same_seed(tmp_path):
    _write(tmp_path, "base", None, 0.0)
    _write(tmp_path, "sft", 1, 0.1)
    _write(tmp_path, "grpo", 1, 0.2)
    _write(tmp_path, "grpo", 2, 0.2)
    tasks = [str(i) for i in range(10)]
    for d, solved in [(tmp_path / "base", set()), (tmp_path / "sft" / "seed1", {"0"}),
                      (tmp_path / "grpo" / "seed1", {"0", "1", "2"}), (tmp_path / "grpo" / "seed2", {"5"})]:
        r = json.loads((d / "result.json").read_text())
        r["per_task"] = {t: {"greedy": float(t in solved), "sampled": []} for t in tasks}
        (d / "result.json").write_text(json.dumps(r))
    s = tt.summarise(tmp_path)
    got = {(q["first"], q["second"], q["seed"]): (q["only_first"], q["only_second"]) for q in s["paired"]}
    assert got == {("base", "sft", 1): (0, 1), ("base", "grpo", 1): (0, 3), ("base", "grpo", 2): (0, 1),
                   ("sft", "grpo", 1): (0, 2)}  # sft has no seed 2: grpo seed 2 is paired with base only
    assert "| sft -> grpo | 1 | 1 | 0 | 2 | 7 | 0.500 | 1, 2 |" in tt.to_markdown(s, tmp_path)


def test_weights_sha256_names_a_model_by_its_weight_files_only(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"\x00\x01weights")
    (b / "config.json").write_text('{"other": "config"}')  # config and tokenizer files do not count
    assert tt.weights_sha256(a) == tt.weights_sha256(b) is not None
    (b / "model.safetensors").write_bytes(b"\x00\x02weights")
    assert tt.weights_sha256(a) != tt.weights_sha256(b)
    assert tt.weights_sha256(tmp_path / "empty") is None


def test_warm_start_only_skips_the_eval_and_belongs_to_sft(tmp_path):
    cmd = tt.stage_command(_args("sft", "--warm-start-only"), "sft", tmp_path)
    assert _value(cmd, "eval.at_end") == "false" and _value(cmd, "sft.save_model") == "true"
    with pytest.raises(SystemExit):
        tt.parse(["grpo", "--warm-start-only"])


def test_the_table_says_whether_grpo_started_from_the_evaluated_sft_model(tmp_path):
    _write(tmp_path, "sft", 1, 0.1)
    _write(tmp_path, "sft", 2, 0.1)
    _write(tmp_path, "grpo", 1, 0.2)
    _write(tmp_path, "grpo", 2, 0.2)
    _write(tmp_path, "grpo", 3, 0.2)
    for d, key, sha in [("sft/seed1", "model_sha256", "a" * 64), ("grpo/seed1", "start_model_sha256", "a" * 64),
                        ("sft/seed2", "model_sha256", "b" * 64), ("grpo/seed2", "start_model_sha256", "c" * 64)]:
        r = json.loads((tmp_path / d / "result.json").read_text())
        r[key] = sha
        (tmp_path / d / "result.json").write_text(json.dumps(r))
    s = tt.summarise(tmp_path)
    st = {w["seed"]: w["status"] for w in s["warm_starts"]}
    assert st[1].startswith("same model") and st[2].startswith("different model") and st[3] == "no sft row of this seed"
    assert "grpo seed 2 started from the sft row's model: different model" in tt.to_markdown(s, tmp_path)


def test_do_nothing_per_task_on_mock_matches_the_logged_mean_and_pairs_with_every_run(tmp_path):
    dn = tt.do_nothing_per_task("mock", "solo", 3)
    assert len(dn) == 3 and all(v in (0.0, 1.0) for v in dn.values())
    _write(tmp_path, "sft", 1, 0.0)
    path = tmp_path / "sft" / "seed1" / "result.json"
    r = json.loads(path.read_text())
    r["budget"]["eval"].update(domain="mock", user="solo", n_eval=3)
    r["eval"]["do_nothing_pass^1"] = sum(v >= 1 for v in dn.values()) / 3
    r["per_task"] = {t: {"greedy": 1.0 - v, "sampled": []} for t, v in dn.items()}  # solves what do-nothing does not
    model = path.parent / "sft_model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"w")
    path.write_text(json.dumps(r))
    got = tt.annotate(path)
    assert got["do_nothing_per_task"] == dn and got["model_sha256"] == tt.weights_sha256(model)
    assert got["annotated"][0]["fields"] == ["do_nothing_per_task", "model_sha256"]
    assert tt.annotate(path).get("annotated") == got["annotated"]  # nothing left to add: unchanged
    q = tt.summarise(tmp_path)["paired"][0]
    assert (q["first"], q["second"]) == ("do-nothing", "sft") and q["both"] == 0 and q["neither"] == 0
    r = json.loads(path.read_text())
    r["do_nothing_per_task"] = None
    r["eval"]["do_nothing_pass^1"] = 2.0  # another set of tasks than the evaluated ones
    path.write_text(json.dumps(r))
    with pytest.raises(ValueError, match="not the evaluated tasks"):
        tt.annotate(path)


def test_summary_write_keeps_the_hand_written_notes(tmp_path):
    _write(tmp_path, "base", None, 0.0)
    stem = tmp_path / "out" / "table"
    tt.main(["summary", str(tmp_path), "--write", str(stem)])
    md = stem.with_suffix(".md")
    md.write_text(md.read_text() + "\n## How it was run\n\nby hand\n")
    _write(tmp_path, "sft", 1, 0.25)
    tt.main(["summary", str(tmp_path), "--write", str(stem)])
    text = md.read_text()
    assert "0.250 (5/20)" in text and text.endswith("## How it was run\n\nby hand\n") and text.count("## How") == 1
