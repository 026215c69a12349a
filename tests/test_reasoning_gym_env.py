"""ReasoningGym-v1 (envs/reasoning_gym, issue 26 s.1): the library's score on the extracted answer, disjoint seeded
splits, weighted mixes, curriculum levels, errors naming the valid names, hostile answers, and the id through
gym.make_vec, the TorchRL adapter, ``python -m envs.serve`` and the grpo_reasoning config (one step, tiny model).

The contract test (tests/test_env_contract.py) covers the id through the registry."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest
import reasoning_gym
from reasoning_gym.factory import create_curriculum

import envs
from envs.reasoning_gym import extract_answer
from envs.reasoning_gym import data as rg_data
from envs.reasoning_gym.data import is_test_question
from envs.reasoning_gym.grading import MAX_TEXT_CHARS

gym.register_envs(envs)
REPO = Path(__file__).resolve().parents[1]
EASY = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


def _env(**kw):
    if "tasks" not in kw:
        kw.setdefault("task", "chain_sum")
    return gym.make("ReasoningGym-v1", **kw)


def test_reward_is_the_librarys_score_of_the_extracted_answer():
    env = _env(split="test", task_config=EASY)
    obs, info = env.reset(seed=0, options={"index": 5})
    assert [m["role"] for m in obs] == ["system", "user"] and obs[1]["content"] == info["question"]
    assert info["task"] == "chain_sum" and info["task_config"] == {**EASY, "allow_negation": False, "seed": 22}
    gold = info["answer"]
    # the library's dataset, built independently of the env, is the judge
    ds = reasoning_gym.create_dataset("chain_sum", seed=22, size=info["source_index"] + 1, **EASY)
    entry = ds[info["source_index"]]
    assert entry["question"] == info["question"] and entry["answer"] == gold
    cases = {  # text -> what the env must extract
        f"<answer>{gold}</answer>": gold,
        f"thinking <answer>1</answer> then <answer> {gold} </answer>\nbye 7": gold,  # the last tag wins over numbers
        f"We add.\n= {gold}": gold,  # numeric gold: the last number
        f"{gold}0": f"{gold}0",  # a wrong number: the library's partial credit len(gold)/len(answer), unchanged
        f"It is {int(gold) - 1}.": str(int(gold) - 1),
        "no idea\n  I give up  \n\n": "I give up",  # no number: the last non-empty line
    }
    for text, expected in cases.items():
        env.reset(options={"index": 5})
        _, reward, term, trunc, info = env.step(text)
        assert info["extracted"] == expected, text
        assert reward == ds.score_answer(expected, entry), text
        assert term and not trunc and info["termination_reason"] == "answered" and "action_error" not in info
    env.reset(options={"index": 5})
    _, reward, _, _, info = env.step({"role": "assistant", "content": "  \n "})
    assert reward == 0.0 and info["extracted"] is None and "empty" in info["action_error"]


def test_extraction_rules():
    assert extract_answer("a <answer>x y</answer> b", "z") == "x y"
    assert extract_answer("12-5 gives 7, or -3.5", "4") == "-3.5"
    assert extract_answer("12-5", "4") == "5"  # a minus between numbers is not a sign
    assert extract_answer("1,000 apples", "1000") == "1,000"
    assert extract_answer("sorted: a, b\nc, d, e\n", "c, d, e") == "c, d, e"  # non-numeric gold: the last line
    assert extract_answer("the answer is 42\n", "cat") == "the answer is 42"
    assert extract_answer("", "4") is None
    assert extract_answer("x \ud800", "cat") == "x \ufffd"  # lone surrogates: U+FFFD (envs.action_text.clean_text)
    # only the last MAX_TEXT_CHARS characters are read
    assert extract_answer("<answer>7</answer>" + " " * MAX_TEXT_CHARS, "7") is None
    assert extract_answer("<answer>7</answer>" + " " * (MAX_TEXT_CHARS - 18), "7") == "7"


@pytest.mark.parametrize("spec", [
    {"task": "chain_sum", "task_config": EASY}, {"task": "products"}, {"task": "gcd"}, {"task": "basic_arithmetic"},
    {"task": "leg_counting"}, {"task": "word_sorting"}, {"task": "countdown"},
    {"tasks": {"chain_sum": 1.0, "leg_counting": 0.5}},
], ids=lambda s: "+".join(s.get("tasks", [s.get("task")])))
def test_demonstration_is_the_gold_answer_and_scores_one(spec):
    for split in ("train", "test"):
        env = _env(split=split, train_size=40, test_size=10, **spec)
        u = env.unwrapped
        for i in u.usable_task_indices(10):
            (msg,) = u.demonstration({"index": i})
            _, info = env.reset(options={"index": i})
            assert msg == {"role": "assistant", "content": f"<answer>{info['answer']}</answer>"}
            _, reward, *_, info = env.step(msg)
            assert reward == 1.0 and info["extracted"] == info["answer"], (split, i, info["question"][:80])
    with pytest.raises(ValueError):
        u.demonstration(None)


def test_splits_are_disjoint_deterministic_and_record_their_seeds():
    kw = dict(task_config=EASY, train_size=1000, test_size=200)
    train, test = _env(split="train", **kw).unwrapped, _env(split="test", **kw).unwrapped
    tq = [p["question"] for p in train._problems]
    sq = [p["question"] for p in test._problems]
    assert len(tq) == 1000 and len(sq) == 200 and not set(tq) & set(sq)
    assert {p["seed"] for p in train._problems} == {11} and {p["seed"] for p in test._problems} == {22}
    # each split is its generator's stream restricted to its side of the hash partition, in generator order
    assert all(not is_test_question(q) for q in tq) and all(is_test_question(q) for q in sq)
    gen = reasoning_gym.create_dataset("chain_sum", seed=22, size=2000, **EASY)
    kept = [p["source_index"] for p in test._problems]
    assert kept == sorted(kept) and all(gen[i]["question"] == p["question"] for i, p in zip(kept, test._problems))
    skipped = [i for i in range(kept[-1]) if i not in set(kept)]
    assert skipped and not any(is_test_question(gen[i]["question"]) for i in skipped)  # only train-side items left out
    again = _env(split="test", **kw).unwrapped
    assert [p["question"] for p in again._problems] == sq  # deterministic for the seeds
    other = _env(split="test", test_seed=5000, **kw).unwrapped
    assert [p["question"] for p in other._problems] != sq and not set(tq) & {p["question"] for p in other._problems}
    # overlapping generator streams (item i = Random(seed + i): seed 22 is seed 11 shifted) cannot leak a question
    shifted = _env(split="test", test_seed=12, **kw).unwrapped
    assert not set(tq) & {p["question"] for p in shifted._problems}


def test_both_splits_keep_the_generators_difficulty_mix():
    """The first version dropped from test whatever train drew: 1-digit sums (200 questions, all drawn by 1000 train
    items) then made 23/200 of test against ~500/1000 of train. The hash partition keeps the mix."""
    kw = dict(task_config=EASY, train_size=1000, test_size=200)
    share = [sum(p["metadata"]["num_digits"] == 1 for p in _env(split=s, **kw).unwrapped._problems) / n
             for s, n in (("train", 1000), ("test", 200))]
    assert abs(share[0] - share[1]) < 0.1, share


def test_an_empty_side_of_the_partition_is_a_clear_error(monkeypatch):
    one_digit = {"min_digits": 1, "max_digits": 1}  # 1-digit products: 100 questions, both sides non-empty
    env = _env(task="products", split="test", task_config=one_digit, train_size=20, test_size=10).unwrapped
    train = _env(task="products", split="train", task_config=one_digit, train_size=20, test_size=10).unwrapped
    assert not {p["question"] for p in env._problems} & {p["question"] for p in train._problems}
    monkeypatch.setattr(rg_data, "is_test_question", lambda q: False)  # a problem space with no test-side question
    with pytest.raises(ValueError, match="problem space"):
        rg_data.split_items(rg_data.resolve_spec("products", None, one_digit, None), "test", train_seed=11,
                            test_seed=22, train_size=20, test_size=5)
    with pytest.raises(ValueError, match="must differ"):
        _env(split="test", train_seed=3, test_seed=3)


def test_weighted_mix_uses_both_tasks_with_their_configs():
    env = _env(tasks={"chain_sum": 1.0, "leg_counting": 0.5}, task_config={"chain_sum": EASY}, split="train")
    u = env.unwrapped
    names = [p["metadata"]["source_dataset"] for p in u._problems]
    share = names.count("leg_counting") / len(names)
    assert set(names) == {"chain_sum", "leg_counting"} and 0.25 < share < 0.42  # weight 0.5 / 1.5 = 1/3
    i = names.index("leg_counting")
    _, info = env.reset(options={"index": i})
    assert info["task"] == "leg_counting" and "min_animals" in info["task_config"]
    _, reward, *_ = env.step(f"... so\n{info['answer']}")
    assert reward == 1.0
    j = names.index("chain_sum")
    _, info = env.reset(options={"index": j})
    assert info["task_config"]["max_digits"] == 2


def test_level_is_the_librarys_curriculum_and_a_run_can_be_made_harder():
    for level in (0, 3):
        c = create_curriculum("chain_sum")
        c.set_global_level(level)
        want = c.generate_configuration()
        _, info = _env(level=level, split="train", train_size=20).reset(options={"index": 0})
        cfg = info["task_config"]
        assert (cfg["min_terms"], cfg["max_terms"], cfg["min_digits"], cfg["max_digits"]) == \
            (want.min_terms, want.max_terms, want.min_digits, want.max_digits)
    hard = _env(level=3, split="train", train_size=200).unwrapped
    easy = _env(level=0, split="train", train_size=200).unwrapped
    assert max(p["metadata"]["num_terms"] for p in hard._problems) > max(p["metadata"]["num_terms"] for p in easy._problems)
    with pytest.raises(ValueError, match="also sets"):
        _env(level=1, task_config={"min_terms": 2})
    _env(level=1, task_config={"allow_negation": True}, train_size=10, test_size=5)  # a key the level leaves alone


@pytest.mark.parametrize("kw, needles", [
    ({"task": "chain_summ"}, ["unknown reasoning_gym task 'chain_summ'", "leg_counting", "chain_sum"]),
    ({"tasks": {"chain_sum": 1.0, "nope": 1.0}}, ["'nope'", "leg_counting"]),
    ({"task": "chain_sum", "task_config": {"min_term": 2}}, ["['min_term']", "min_terms", "allow_negation"]),
    ({"task": "chain_sum", "task_config": {"seed": 2}}, ["['seed']", "train_seed"]),
    ({"task": "chain_sum", "task_config": {"min_terms": 5, "max_terms": 2}}, ["max_terms must be >= min_terms"]),
    ({"tasks": {"chain_sum": 0}}, ["weight must be a number > 0"]),
    ({"tasks": {"chain_sum": 1.0}, "task_config": {"gcd": {}}}, ["['gcd']", "not in tasks"]),
    ({"task": "chain_sum", "tasks": {"gcd": 1.0}}, ["exactly one of"]),
    ({"task": "chain_sum", "split": "valid"}, ["split must be one of"]),
    ({"task": "chain_sum", "level": -1}, ["Invalid level: -1"]),
])
def test_bad_names_and_keys_fail_at_make_listing_the_valid_ones(kw, needles):
    with pytest.raises(ValueError) as e:
        gym.make("ReasoningGym-v1", **kw)
    for n in needles:
        assert n in str(e.value), str(e.value)[:400]


#: Refused before the library's scorer sees them (``info["action_error"]`` says why).
REFUSED = ["<answer>9**9**9</answer>", "<answer>(9**9)**9</answer>", "<answer>1e100000000</answer>", "1e100000000",
           "<answer>2^99999999</answer>", "9" * (1 << 20), "<answer>" + "(" * 1500 + "1" + ")" * 1500 + "</answer>",
           "<answer>" + "[" * 40 + "]" * 40 + "</answer>"]
#: Scored by the library (0, or countdown's 0.01 / 0.05 for a malformed / wrong-numbers expression), in bounded time.
SCORED = ["x" * (1 << 20), "(" * 100_000 + ")" * 100_000, "\ud800", "<answer>\udfff\ud800</answer>",
          "\ud800" * 100_000, "<answer>" * 20_000, "<answer>0x" + "f" * 3000 + "</answer>"]


@pytest.mark.parametrize("task", ["chain_sum", "countdown", "bitwise_arithmetic"])  # Decimal / sympy parse_expr / eval
def test_hostile_answers_score_zero_quickly(task):
    env = _env(task=task, split="test", train_size=20, test_size=5)
    t0 = time.perf_counter()
    for text in REFUSED + SCORED:
        env.reset(options={"index": 0})
        _, reward, term, _, info = env.step(text)
        # countdown's own scorer gives 0.01 to a malformed expression, 0.05 to one using other numbers
        assert term and reward <= 0.05, (task, text[:40], reward)
        json.dumps(info["messages"], ensure_ascii=False).encode("utf-8")  # lone surrogates were replaced
        if text in REFUSED:
            assert reward == 0.0 and "scored 0 without" in info["action_error"], (task, text[:40], info)
    assert time.perf_counter() - t0 < 20  # generous: each is linear in at most 4 KB


def test_make_vec_and_check_env():
    from gymnasium.utils.env_checker import check_env

    check_env(gym.make("ReasoningGym-v1", split="test", test_size=20).unwrapped)
    for mode in ("sync", "async"):
        venv = gym.make_vec("ReasoningGym-v1", num_envs=2, vectorization_mode=mode, split="test", task_config=EASY)
        try:
            obs, info = venv.reset(seed=3)
            assert [[m["role"] for m in o] for o in obs] == [["system", "user"]] * 2
            _, rew, term, _, info = venv.step([f"<answer>{info['answer'][0]}</answer>", "wrong"])
            assert rew.tolist() == [1.0, 0.0] and term.all()
        finally:
            venv.close()


def test_torchrl_adapter_check_env_specs():
    from torchrl.envs.utils import check_env_specs

    from envs.adapters.torchrl_env import make_torchrl_env

    env = make_torchrl_env("ReasoningGym-v1", batch_size=2, split="test", task_config=EASY)
    check_env_specs(env, seed=0)


def test_served_over_openenv():
    """envs.serve's app (what ``python -m envs.serve ReasoningGym-v1 --env-kwargs ...`` runs) on loopback."""
    pytest.importorskip("openenv", reason="envs.serve needs the extra [serve]")
    import socket
    import threading

    import uvicorn
    from openenv.core.generic_client import GenericEnvClient

    from envs.serve import build_app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = build_app("ReasoningGym-v1", {"split": "test", "task_config": EASY}, max_sessions=2)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    t0 = time.time()
    while not srv.started:
        assert th.is_alive() and time.time() - t0 < 30, "server did not start"
        time.sleep(0.01)
    try:
        with GenericEnvClient(base_url=f"http://127.0.0.1:{port}").sync() as e:
            r = e.reset(index=2)
            gold = r.observation["info"]["answer"]
            r = e.step({"content": f"so it is\n{gold}"})
            assert r.done and r.reward == 1.0 and r.observation["info"]["task"] == "chain_sum"
            r = e.reset(index=2)
            r = e.step({"content": "\ud800" + "9" * 100_000})  # hostile text over the wire: scored 0, server serves on
            assert r.done and r.reward == 0.0 and "digits" in r.observation["info"]["action_error"]
    finally:
        srv.should_exit = True
        th.join(15)


def test_a_bad_task_in_the_config_fails_before_any_model_loads():
    from hydra import compose, initialize_config_dir

    from torchrl_grpo.config import register_configs
    from torchrl_grpo.assembly.environments import check_data

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="grpo_reasoning", overrides=["econfig.task=chain_summ"])
        mix = compose(config_name="grpo_reasoning", overrides=["econfig.tasks={chain_sum: 1.0, leg_counting: 0.5}",
                                                               "econfig.task_config=null",  # replace, not merge
                                                               "econfig.task_config={chain_sum: {max_digits: 2}}"])
        harder = compose(config_name="grpo_reasoning", overrides=["econfig.task_config.max_digits=3"])
    with pytest.raises(ValueError, match="leg_counting"):  # the library's valid names, from check_data (build runs it
        check_data(cfg)                                     # before loading the model)
    assert dict(harder.econfig.task_config) == {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 3}
    sources = check_data(mix)
    assert "['chain_sum', 'leg_counting']" in sources["train_dataset"] and "seed=22" in sources["valid_dataset"]


@pytest.mark.slow  # ~20 s on a loaded 2-core machine: a real grpo.py run (tiny model)
def test_grpo_reasoning_config_composes_and_runs_one_step(tmp_path):
    from hydra import compose, initialize_config_dir

    from torchrl_grpo.config import register_configs, validate_config
    from torchrl_grpo.assembly.environments import env_kwargs_from_config

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="grpo_reasoning")
        acfg = compose(config_name="grpo_reasoning_async")
    validate_config(cfg)
    assert acfg.mode == "async" and acfg.econfig == cfg.econfig
    assert (cfg.actor.path, cfg.train.steps, cfg.train.batch_size, cfg.gconfig.n_samples, cfg.gconfig.max_new_tokens,
            cfg.optimizer.lr, cfg.eval.n_problems) == ("smollm2-135m-instruct", 16, 8, 8, 48, 1e-5, 200)
    env_id, kw = env_kwargs_from_config(cfg, "test")
    assert env_id == "ReasoningGym-v1" and kw["task"] == "chain_sum" and kw["task_config"] == EASY
    assert (kw["train_seed"], kw["test_seed"], kw["test_size"]) == (11, 22, 200)
    args = ["--config-name", "grpo_reasoning", "actor.path=tiny-random", "train.steps=1", "train.batch_size=2",
            "gconfig.n_samples=2", "gconfig.max_new_tokens=8", "eval.n_problems=2", "eval.at_start=false",
            "checkpoint.every=0", "stats_logger.wandb.mode=disabled", "stats_logger.progress_bar=false"]
    p = subprocess.run([sys.executable, str(REPO / "grpo.py"), *args], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = list((tmp_path / "outputs").glob("*/*"))
    sources = json.loads((run / "data_sources.json").read_text())
    assert "seed=11" in sources["train_dataset"] and "seed=22" in sources["valid_dataset"]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("rollout/episodes") == 4.0 for r in rows) and any("eval/accuracy" in r for r in rows)


@pytest.mark.slow  # ~25 s on a loaded 2-core machine (model load + generation)
def test_probe_runs_on_the_tiny_model(tmp_path):
    """benchmarks/reasoning_gym_probe.py end to end on tiny-random: one table row per candidate, the command kept."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("reasoning_gym_probe", REPO / "benchmarks" / "reasoning_gym_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)

    assert probe.parse_candidate("gcd@0") == {"task": "gcd", "level": 0}
    assert probe.parse_candidate('products:{"max_digits": 1}') == {"task": "products", "task_config": {"max_digits": 1}}
    out = tmp_path / "probe.md"
    argv = ["--model", "tiny-random", "--prompts", "2", "--samples", "2", "--max-new-tokens", "4", "--train-size", "50",
            "--out", str(out), 'chain_sum:{"min_terms": 2, "max_terms": 2}', "gcd@0"]
    assert probe.main(argv) == 0
    text = out.read_text()
    assert "reasoning_gym_probe.py --model tiny-random" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| chain_sum") or ln.startswith("| gcd@0")]
    assert len(rows) == 2 and all(len(r.split("|")) == 9 for r in rows)


def test_the_default_grpo_py_config_is_reasoning_gym_and_refuses_a_dataset_path():
    """``python grpo.py`` with no config name trains on ReasoningGym-v1 (issue 26 s.2); its problems are generated,
    so a ``train_dataset.path`` (meaningful for GSM8K / IFEval) fails at start instead of being ignored."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from torchrl_grpo.config import register_configs
    from torchrl_grpo.assembly.environments import env_kwargs_from_config

    p = subprocess.run([sys.executable, str(REPO / "grpo.py"), "--cfg", "job"], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    assert OmegaConf.create(p.stdout).econfig.env_id == "ReasoningGym-v1"
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="grpo_reasoning")
    assert env_kwargs_from_config(cfg, "train")[1]["task"] == "chain_sum"
    with pytest.raises(ValueError, match="train_dataset.path"):
        env_kwargs_from_config(cfg, "train", dataset_path="/data/gsm8k")
