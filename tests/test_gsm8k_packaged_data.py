"""GSM8K ships with the package: the packaged copy is the default, overrides win over it, bad rows fail by line,
and the trainer checks the data before it loads a model (issue 13, section 1)."""
from __future__ import annotations

import gzip
import json

import gymnasium as gym
import pytest

import envs
from envs.gsm8k import GSM8KEnv, load_gsm8k
from envs.gsm8k.data import PACKAGED_DATA_DIR, data_source, resolve_data_dir


def _write(path, rows, gz=False):
    text = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def test_packaged_copy_is_the_default_without_env_var(monkeypatch):
    monkeypatch.delenv("GSM8K_DATA_DIR", raising=False)
    assert resolve_data_dir() == str(PACKAGED_DATA_DIR)
    assert data_source("train") == str(PACKAGED_DATA_DIR / "train.jsonl.gz")
    train, test = load_gsm8k("train"), load_gsm8k("test")
    assert (len(train), len(test)) == (7473, 1319)
    assert train[0]["answer"] == "72" and train[0]["solution"].endswith("#### 72")
    gym.register_envs(envs)
    env = gym.make("GSM8K-v1", split="test")
    obs, info = env.reset(options={"index": 0})
    assert obs[-1]["content"] == test[0]["question"] and info["answer"] == test[0]["answer"]
    assert GSM8KEnv().num_tasks == 7473


def test_packaged_copy_carries_its_license():
    lic = (PACKAGED_DATA_DIR / "LICENSE").read_text()
    assert "MIT License" in lic and "OpenAI" in lic
    assert "openai/grade-school-math" in (PACKAGED_DATA_DIR / "README.md").read_text()


def test_override_precedence(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    _write(a / "test.jsonl", [{"question": "from env var", "answer": "#### 1"}])
    _write(b / "test.jsonl.gz", [{"question": "from data_dir", "answer": "#### 2"}], gz=True)
    monkeypatch.setenv("GSM8K_DATA_DIR", str(a))
    assert [p["question"] for p in load_gsm8k("test")] == ["from env var"]  # env var beats the packaged copy
    assert [p["question"] for p in load_gsm8k("test", b)] == ["from data_dir"]  # data_dir beats the env var
    assert GSM8KEnv(split="test", data_dir=str(b)).num_tasks == 1
    assert data_source("test", "openai/gsm8k") == "hf:openai/gsm8k"  # a hub id stays an override (not loaded here)
    monkeypatch.setenv("GSM8K_DATA_DIR", "openai/gsm8k")
    assert data_source("test") == "hf:openai/gsm8k"
    monkeypatch.setenv("GSM8K_DATA_DIR", "")  # empty = unset
    assert data_source("test") == str(PACKAGED_DATA_DIR / "test.jsonl.gz")


@pytest.mark.parametrize("bad, message", [
    ('{"question": "q", "answer": "no gold line"}', "no '#### <number>' line"),
    ('{"question": "q", "answer": "#### none"}', "no number after '####'"),
    ('{"question": 3, "answer": "#### 1"}', r"non-string field\(s\) \['question'\]"),
    ('{"answer": "#### 1"}', r"\['question'\]"),
    ('["q", "#### 1"]', "expected a JSON object"),
    ("{not json", "malformed JSON"),
])
@pytest.mark.parametrize("gz", [False, True])
def test_bad_row_error_names_file_and_line(tmp_path, bad, message, gz):
    good = {"question": "q", "answer": "#### 1"}
    name = "train.jsonl.gz" if gz else "train.jsonl"
    _write(tmp_path / name, [good, good, bad], gz=gz)
    with pytest.raises(ValueError, match=rf"{tmp_path / name}:3: .*{message}"):
        load_gsm8k("train", tmp_path)


def test_trainer_checks_data_before_loading_the_model(tmp_path, monkeypatch):
    import torchrl_grpo.model_store
    from tests.test_trainer import make_cfg
    from torchrl_grpo.assembly import build

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(torchrl_grpo.model_store, "load_model_and_tokenizer", no_model)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        build(make_cfg(econfig={"env_id": "GSM8K-v1"}, train_dataset={"path": str(tmp_path / "nowhere")}), tmp_path / "r1")
    _write(tmp_path / "train.jsonl", [{"question": "q", "answer": "#### 1"}, {"question": "q", "answer": "oops"}])
    with pytest.raises(ValueError, match=r"train\.jsonl:2"):
        build(make_cfg(econfig={"env_id": "GSM8K-v1"}, train_dataset={"path": str(tmp_path)}), tmp_path / "r2")


def test_run_dir_records_the_resolved_data_path(tmp_path, monkeypatch, tiny_model_and_tokenizer):
    from tests.test_trainer import make_cfg
    from torchrl_grpo.assembly import build

    monkeypatch.delenv("GSM8K_DATA_DIR", raising=False)
    model, tok = tiny_model_and_tokenizer
    comps = build(make_cfg(econfig={"env_id": "GSM8K-v1"}), tmp_path, model=model, tokenizer=tok)
    try:
        sources = json.loads((tmp_path / "data_sources.json").read_text())
    finally:
        comps.logger.close()
    assert sources == {"train_dataset": str(PACKAGED_DATA_DIR / "train.jsonl.gz"),
                       "valid_dataset": str(PACKAGED_DATA_DIR / "test.jsonl.gz")}
