"""Supervised fine-tuning before RL (issue 14 s.2): demonstrations rendered through the RL collector, the SFT loss,
the SFT/RFT trainer and the model directory grpo.py starts from."""
from __future__ import annotations

import json
import math
import tempfile

import pytest
import torch
from omegaconf import OmegaConf

from envs.tau2.actions import parse_action
from torchrl_grpo.rollout.chat_tokens import ChatRenderer
from tests.test_tau2_training import tau2_cfg
from torchrl_grpo.rollout.collector import concat_batches
from torchrl_grpo.rollout.demonstrations import ScriptedBackend, gold_demonstrations, successful_episodes
from torchrl_grpo.objectives.log_probs import token_log_probs
from torchrl_grpo.objectives.sft_loss import SFTLoss
from torchrl_grpo.training.sft_trainer import SFTTrainer, save_merged_model
from torchrl_grpo.assembly import build_trainer


def sft_cfg(domain="mock", split="base", solo=True, **over):
    """tests/test_tau2_training.py's tau2 config with SFT-sized settings (``over`` merged last)."""
    base = {"econfig": {"solo_mode": solo, "max_steps": 40, "max_turns": 40}, "gconfig": {"max_new_tokens": 8},
            "train": {"micro_batch_size": 2}, "optimizer": {"lr": 3e-3}, "sft": {"epochs": 3, "minibatch_size": 3},
            "eval": {"pass_k": 0}}
    return OmegaConf.merge(tau2_cfg(domain, split, **base), OmegaConf.create(over))


def test_assistant_ids_are_the_text_the_env_parses_back(tok):
    ren = ChatRenderer(tok)
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "#W1"}'}}]}
    ids = ren.assistant_ids(call)
    assert ids[-1] in ren.end_of_turn_ids() and not any(t in ren.end_of_turn_ids() for t in ids[:-1])
    parsed = parse_action(tok.decode(ids, skip_special_tokens=True))
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_order", {"order_id": "#W1"})]
    text = ren.assistant_ids({"role": "assistant", "content": "Your order is on its way."})
    assert tok.decode(text, skip_special_tokens=True).strip() == "Your order is on its way."
    with pytest.raises(ValueError, match="assistant message"):
        ren.assistant_ids({"role": "user", "content": "hi"})


def test_scripted_backend_plays_one_episode_then_ends_turns():
    b = ScriptedBackend(eos_id=7)
    b.play([[1, 2, 7], [3, 7]])
    assert b.generate([[5]], None)[0].token_ids == [1, 2, 7]
    assert b.generate([[5, 1]], None)[0].token_ids == [3, 7]
    assert b.generate([[5, 1, 3]], None)[0].token_ids == [7]  # past the script: an empty turn
    with pytest.raises(ValueError, match="one episode"):
        b.generate([[1], [2]], None)
    with pytest.raises(TypeError):
        b.sync_from(torch.nn.Linear(1, 1))


@pytest.mark.parametrize("domain,split,solo", [("mock", "base", True), ("retail", "train", False)])
def test_gold_demonstrations_replay_through_the_collector_and_score_one(tmp_path, domain, split, solo):
    trainer = build_trainer(sft_cfg(domain, split, solo), tmp_path, trainer_cls=SFTTrainer)
    try:
        tasks = trainer.train_tasks[:6]
        batch, stats = gold_demonstrations(trainer.collector, tasks)
        assert stats["demo/tasks"] == len(tasks)
        assert batch is not None and batch.shape[0] == stats["demo/kept"] >= 5
        assert (batch["reward"] == 1.0).all() and (batch["action_errors"] == 0).all()
        assert not batch["context_truncated"].any() and (batch["num_turns"] >= 1).all()
        tok = trainer.tokenizer
        eot = ChatRenderer(tok).end_of_turn_ids()
        for i in range(batch.shape[0]):
            L = int(batch["attention_mask"][i].sum())
            rm = batch["response_mask"][i, :L]
            assert not rm[: int(batch["prompt_length"][i])].any()  # the prompt is context
            turns = int(batch["num_turns"][i])
            # every assistant turn ends with the end-of-turn token the collector stops on; env turns are unmasked
            assert sum(int(t) in eot for t in batch["tokens"][i, :L][rm]) == turns
            if turns > 1:  # tool results / user turns in between, unmasked
                assert (~rm).sum() > int(batch["prompt_length"][i]) + 1
        text = tok.decode(batch["tokens"][0][batch["response_mask"][0]], skip_special_tokens=True)
        assert "<tool_call>" in text
    finally:
        trainer.close()


def test_concat_batches_pads_real_collector_batches_as_the_collector_does(tmp_path):
    trainer = build_trainer(sft_cfg(), tmp_path, trainer_cls=SFTTrainer)
    try:
        a = trainer.collector.collect([{"index": trainer.train_tasks[0]}], 2)
        b = trainer.collector.collect([{"index": trainer.train_tasks[1]}], 1)
    finally:
        trainer.close()
    pad = trainer.tokenizer.pad_token_id
    out = concat_batches([a, b], pad)
    T = max(a["tokens"].shape[-1], b["tokens"].shape[-1])
    assert out.shape[0] == 3 and out["tokens"].shape == (3, T)
    assert out["group_id"].tolist() == [0, 0, 1]
    for src, rows in ((a, slice(0, 2)), (b, slice(2, 3))):
        t = src["tokens"].shape[-1]
        assert torch.equal(out["tokens"][rows, :t], src["tokens"]) and (out["tokens"][rows, t:] == pad).all()
        assert not out["attention_mask"][rows, t:].any() and (out["token_policy_version"][rows, t:] == -1).all()
    assert len(list(out["task"])) == 3 and list(out["task"])[2] == {"index": trainer.train_tasks[1]}


def test_successful_episodes_keep_only_clean_successes(tmp_path):
    trainer = build_trainer(sft_cfg(), tmp_path, trainer_cls=SFTTrainer)
    try:
        batch = trainer.collector.collect([{"index": i} for i in trainer.train_tasks[:2]], 2)
    finally:
        trainer.close()
    batch["reward"] = torch.tensor([1.0, 0.0, 1.0, 1.0])
    batch["context_truncated"] = torch.tensor([False, False, True, False])
    kept = successful_episodes(batch, 1.0)
    assert kept.shape[0] == 2 and torch.equal(kept["tokens"], batch["tokens"][[0, 3]])
    batch["reward"] = torch.zeros(4)
    assert successful_episodes(batch, 1.0) is None


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_sft_loss_is_the_token_mean_nll_of_the_assistant_tokens(tiny_llama, shared_prefix):
    from torchrl_grpo.objectives.shared_prefix import build_shared_prefix
    from torchrl_grpo.objectives.log_probs import _decoder_and_head

    model = tiny_llama()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 300, (3, 20), generator=g)
    tokens[:, :6] = tokens[0, :6]  # a common prompt
    attn = torch.ones(3, 20, dtype=torch.bool)
    attn[2, 15:] = False
    rm = torch.zeros(3, 20, dtype=torch.bool)
    rm[:, 8:12] = True
    rm[:, 14:18] = True
    td = {"tokens": tokens, "attention_mask": attn, "response_mask": rm}
    from tensordict import TensorDict

    td = TensorDict(td, batch_size=[3])
    loss_fn = SFTLoss(model)
    prefix = build_shared_prefix(model, _decoder_and_head(model)[0], tokens[0, :6]) if shared_prefix else None
    out = loss_fn(td, prefix=prefix)
    out["loss_sft"].backward()
    if prefix is not None:
        prefix.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    # by hand: full logits, log-softmax, targets shifted
    logits = model(input_ids=tokens, attention_mask=attn.long(),
                   position_ids=(attn.long().cumsum(-1) - 1).clamp_min(0)).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    m = (rm & attn)[:, 1:]
    ref = -(lp * m).sum() / m.sum()
    ref.backward()
    assert out["loss_sft"].item() == pytest.approx(ref.item(), rel=1e-5)
    assert out["num_tokens"].item() == float(m.sum())
    for a, p in zip(grads, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.slow  # an SFT run to a fit, then GRPO from its model: 151 s loaded (full), LoRA 55 s at load ~4
@pytest.mark.parametrize("peft", [False, True])
def test_sft_fits_the_gold_demonstrations_and_grpo_loads_the_model_it_writes(tmp_path, peft):
    epochs = 6 if peft else 4  # LoRA r=8 on the tiny random model fits more slowly (lm_head is not adapted)
    over = {"actor": {"peft": {"enable": peft, "r": 8, "lora_alpha": 16}},
            "eval": {"at_start": True, "at_end": True, "n_problems": 2}, "optimizer": {"lr": 1e-2}, "sft": {"epochs": epochs, "minibatch_size": 3}}
    trainer = build_trainer(sft_cfg(**over), tmp_path, trainer_cls=SFTTrainer)
    try:
        summary = trainer.fit()
        probe_batch, _ = gold_demonstrations(trainer.collector, trainer.train_tasks[:2])
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    nll = [r["sft/nll"] for r in rows if "sft/nll" in r]
    kept = summary["demonstrations"]["demo/kept"]
    assert kept >= 5 and len(nll) == epochs * math.ceil(kept / 3)  # sft.epochs x minibatches
    per_epoch = len(nll) // epochs
    first, final = sum(nll[:per_epoch]) / per_epoch, sum(nll[-per_epoch:]) / per_epoch
    assert final < (first - 0.3 if peft else 0.75 * first), nll  # the demonstrations are being fitted
    assert all(math.isfinite(x) for x in nll)
    assert "eval_start" in summary and "eval/accuracy" in summary["eval_end"]
    assert any("demo/kept" in r for r in rows)
    # the written directory is a plain HF model (LoRA merged): actor.path= loads it with the same log-probs
    from torchrl_grpo.model_store import load_model_and_tokenizer

    loaded, tok2 = load_model_and_tokenizer(summary["model_dir"])
    assert not any("lora" in n for n, _ in loaded.named_parameters())
    t, am, rm = probe_batch["tokens"][:1], probe_batch["attention_mask"][:1], probe_batch["response_mask"][:1]
    with torch.no_grad():
        trainer.model.eval()
        a, _ = token_log_probs(trainer.model, t, am, response_mask=rm)
        b, _ = token_log_probs(loaded, t, am, response_mask=rm)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert tok2.chat_template == trainer.tokenizer.chat_template


def test_rft_round_keeps_the_policys_successes(tmp_path):
    """RFT with a policy that succeeds: the tiny model's backend is swapped for gold replays of the same tasks,
    so the round's episodes all score 1 and are kept; a failing policy keeps none and fine-tunes on nothing."""
    trainer = build_trainer(sft_cfg(sft={"source": "rft", "rft_rounds": 1, "rft_samples": 2}), tmp_path, trainer_cls=SFTTrainer)
    try:
        kept = trainer.rft_round(0)  # the random model: no success
        assert kept is None
        rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert rows[-1]["rft/kept"] == 0 and rows[-1]["rft/episodes"] == 2 * len(trainer.train_tasks)
    finally:
        trainer.close()


def test_bad_sft_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="sft.source"):
        build_trainer(sft_cfg(sft={"source": "teacher"}), tempfile.mkdtemp(), trainer_cls=SFTTrainer)
    with pytest.raises(ValueError, match="sft.epochs"):
        build_trainer(sft_cfg(sft={"epochs": 0}), tempfile.mkdtemp(), trainer_cls=SFTTrainer)
    with pytest.raises(ValueError, match="rft_rounds"):
        build_trainer(sft_cfg(sft={"source": "rft", "rft_rounds": 0}), tempfile.mkdtemp(), trainer_cls=SFTTrainer)
    with pytest.raises(ValueError, match="launcher=local"):
        build_trainer(sft_cfg(rollout={"launcher": "ray", "num_workers": 1}), tempfile.mkdtemp(), trainer_cls=SFTTrainer)


def test_the_model_is_written_before_the_final_eval_so_a_failed_eval_keeps_the_training(tmp_path):
    """A 35-minute SFT run was lost when its 48-minute final eval was cut: the merged model must be on disk before
    the eval starts. The eval here dies after training; ``sft_model/`` is already a loadable model directory."""
    over = {"eval": {"at_start": False, "at_end": True, "n_problems": 1}, "sft": {"epochs": 1, "minibatch_size": 3}}
    trainer = build_trainer(sft_cfg(**over), tmp_path, trainer_cls=SFTTrainer)

    def dies():
        raise RuntimeError("eval cut")

    trainer.evaluate = dies
    try:
        with pytest.raises(RuntimeError, match="eval cut"):
            trainer.fit()
    finally:
        trainer.close()
    assert any("sft/nll" in line for line in (tmp_path / "metrics.jsonl").read_text().splitlines())
    from torchrl_grpo.model_store import load_model_and_tokenizer

    loaded, _ = load_model_and_tokenizer(str(tmp_path / "sft_model"))
    assert sum(p.numel() for p in loaded.parameters()) > 0


def test_gsm8k_demonstration_scores_one(gsm8k_dir):
    import gymnasium as gym

    import envs  # noqa: F401  (registers the ids)

    env = gym.make("GSM8K-v1", data_dir=str(gsm8k_dir), split="test")
    try:
        for i in range(5):
            msgs = env.unwrapped.demonstration({"index": i})
            assert len(msgs) == 1 and "<<" not in msgs[0]["content"] and "####" in msgs[0]["content"]
            env.reset(options={"index": i})
            _, r, term, _, _ = env.step(msgs[0]["content"])
            assert r == 1.0 and term
        with pytest.raises(ValueError, match="index"):
            env.unwrapped.demonstration({})
    finally:
        env.close()


def test_save_merged_model_keeps_the_adapter_in_memory(tmp_path, tiny_model_and_tokenizer):
    from peft import LoraConfig, get_peft_model

    base, tok = tiny_model_and_tokenizer
    import copy

    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                           task_type="CAUSAL_LM"))
    save_merged_model(model, tok, tmp_path / "m")
    assert hasattr(model, "get_base_model") and any("lora_" in n for n, _ in model.named_parameters())
    assert (tmp_path / "m" / "config.json").is_file() and (tmp_path / "m" / "tokenizer_config.json").is_file()


@pytest.mark.slow  # issue 45: two subprocess runs, 53 s at load avg ~4 on 2 cores; CI's slow stage runs it
def test_sft_py_command_line_writes_a_model_grpo_py_can_start_from(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    args = ["--config-name", "sft_tau2", "actor.path=tiny-random", "actor.peft.enable=false", "econfig.domain=mock",
            "econfig.solo_mode=true", "train_dataset.split=base", "valid_dataset.split=base", "eval.n_problems=1",
            "gconfig.max_new_tokens=4", "rollout.max_context_tokens=4096", "sft.epochs=1",
            "stats_logger.wandb.mode=disabled", "stats_logger.progress_bar=false", f"output_dir={tmp_path}"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    # cwd=tmp_path: Hydra's own run dir (outputs/<date>/<time>/.hydra, sft.log) lands there, not in the checkout
    p = subprocess.run([sys.executable, str(repo / "sft.py"), *args], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "sft_model" / "config.json").is_file() and (tmp_path / "learning_curve.png").is_file()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("sft/nll" in r for r in rows) and sum("eval/accuracy" in r for r in rows) == 2


def test_sft_phase_lr_follows_optimizer_lr_after_warmup(tmp_path):
    """With optimizer.warmup_steps, the build's GRPO schedule had already scaled the lr by its warm-up factor at
    construction; the SFT phase's schedule must still peak at optimizer.lr (it once peaked at half of it)."""
    # through fit(): a gold phase on 3 tasks, then one RFT round keeping every episode (min_reward below any reward)
    cfg = sft_cfg(optimizer={"lr": 1e-3, "warmup_steps": 2, "scheduler": "constant"},
                  sft={"epochs": 2, "rft_rounds": 1, "rft_samples": 1, "min_reward": -1.0, "save_model": False},
                  train_dataset={"limit": 3}, eval={"n_problems": 0})
    trainer = build_trainer(cfg, tmp_path, trainer_cls=SFTTrainer)
    try:
        summary = trainer.fit()  # the RFT phase starts from optimizer.lr again
    finally:
        trainer.close()
    assert summary["rft"] == [3]
    lrs = [r["sft/lr"] for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if "sft/lr" in r]
    assert len(lrs) == 4 and lrs[1] == pytest.approx(1e-3) and lrs[3] == pytest.approx(1e-3), lrs
    # each step logs the rate it used (issue 36.6): warm-up 1/2 then the peak, in each phase (not the next step's)
    assert lrs == pytest.approx([5e-4, 1e-3, 5e-4, 1e-3]), lrs
