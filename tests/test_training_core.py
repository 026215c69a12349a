"""Training-core correctness (issue 8): the ratio anchor, dropout, off-policy correction with several updates,
batch-level importance-weight metrics, the LR schedule under filtering, infrastructure failures, token budgets.

Each test failed on the code before the fix (c70c5bb); the closing note of issue 8 lists what each one saw.
"""
from __future__ import annotations

import math

import pytest
import torch

import tests.toy_envs  # noqa: F401  (registers ToyVowels-v0, ToyFlaky-v0)
from tests.test_trainer import make_cfg
from torchrl_grpo.backends.base import RolloutBackend
from torchrl_grpo.backends.transformers_backend import TransformersBackend
from torchrl_grpo.objectives.log_probs import token_log_probs
from torchrl_grpo.model_store import load_model_and_tokenizer
from torchrl_grpo.assembly import build_trainer


class SkewedBackend(RolloutBackend):
    """Samples with the trainer's own module but reports behaviour log-probs shifted by a per-row offset — the
    situation of a sampler with other numerics (vLLM bf16) or older weights (a stale async batch)."""

    def __init__(self, model, pad_token_id: int, offsets=(0.3, -0.3)):
        self.inner = TransformersBackend(model, pad_token_id=pad_token_id, share_module=True)
        self.offsets = offsets

    @property
    def policy_version(self):
        return self.inner.policy_version

    def generate(self, prompts, sampling):
        gens = self.inner.generate(prompts, sampling)
        for i, g in enumerate(gens):
            off = self.offsets[i % len(self.offsets)]
            g.logprobs = [lp + off for lp in g.logprobs]
        return gens

    def load_weights(self, weights=None):
        self.inner.load_weights(weights)


def _skewed_trainer(tmp_path, offsets=(0.3, -0.3), **over):
    model, tok = load_model_and_tokenizer("tiny-random")
    backend = SkewedBackend(model, tok.pad_token_id, offsets)
    return build_trainer(make_cfg(**over), tmp_path, model=model, tokenizer=tok, backend=backend)


def _record_loss_calls(trainer):
    calls = []
    fwd = trainer.loss_fn.forward

    def recorder(td, **kw):  # kw: the update's shared prefix (torchrl_grpo.objectives.shared_prefix)
        out = fwd(td, **kw)
        prefix = kw.get("prefix")
        calls.append({"rows": td.shape[0], "T": td["tokens"].shape[-1], "P": prefix.length if prefix is not None else 0,
                      "ratio_max": float(out["ratio_max"]), "ess": float(out["ess"])})
        return out

    trainer.loss_fn.forward = recorder
    return calls


# ---------------------------------------------------------------------------------------------- dropout (defect 3)
def test_lora_dropout_on_policy_ratio_is_exactly_one(tmp_path):
    """LoRA with dropout 0.05 (the old schema default): every on-policy update has ratio 1 and no clipping.
    Before: ratio_max 1.14 from step 2 (dropout active in the differentiated forward)."""
    cfg = make_cfg(actor={"peft": {"enable": True, "r": 8, "lora_alpha": 16, "lora_dropout": 0.05}},
                   train={"steps": 4}, optimizer={"lr": 5e-2})
    trainer = build_trainer(cfg, tmp_path)
    ms = [trainer.train_step() for _ in range(4)]
    trainer.close()
    for m in ms:
        assert m["ratio_max"] == pytest.approx(1.0, abs=1e-4), [x["ratio_max"] for x in ms]
        assert m["clip_fraction"] == 0.0


def test_no_grad_log_probs_run_in_eval_mode(tmp_path):
    """With dropout kept on (train.disable_dropout=false), the anchor/reference passes still see the sampler's
    network: the recompute equals the colocated sampler's behaviour log-probs even if the model is in train mode."""
    cfg = make_cfg(actor={"peft": {"enable": True, "r": 8, "lora_alpha": 16, "lora_dropout": 0.5}},
                   train={"disable_dropout": False})
    trainer = build_trainer(cfg, tmp_path)
    with torch.no_grad():  # a non-zero adapter, so LoRA dropout changes the output
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    batch = trainer.collector.collect(trainer.tasks_for_step(0), 4)
    trainer.model.train()
    trainer.updater.fill_log_probs(batch, "old_log_probs", trainer.model)
    trainer.close()
    m = batch["response_mask"]
    torch.testing.assert_close(batch["old_log_probs"][m], batch["sample_log_probs"][m], atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------------ anchor precision (defect 4)
def test_anchor_is_trainer_recompute_when_sampler_numerics_differ(tmp_path):
    """A sampler whose log-probs are off by ±0.3 nats: the first on-policy update still has ratio 1 and clip
    fraction 0 (the anchor is the trainer's own no-grad pass); the mismatch shows in ESS and the behaviour weight.
    Before: the sampler's log-probs were the anchor, ratio exp(∓0.3) → every token clipped."""
    trainer = _skewed_trainer(tmp_path)
    m = trainer.train_step()
    trainer.close()
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["clip_fraction"] == 0.0
    assert m["ess"] < 0.99  # the behaviour policy differs: visible here, not as clipping
    assert m["behaviour_weight_mean"] != pytest.approx(1.0, abs=1e-2)
    assert m["train/anchor_recomputed"] == 1.0


def test_colocated_exact_sampler_keeps_behaviour_anchor(tmp_path):
    """The fp32 colocated sampler is the trainer's own numerics: no extra pass, ratio 1."""
    trainer = build_trainer(make_cfg(), tmp_path)
    m = trainer.train_step()
    trainer.close()
    assert m["train/anchor_recomputed"] == 0.0
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and m["ess"] == pytest.approx(1.0, abs=1e-4)


# ------------------------------------------------------------- off-policy correction with several updates (defect 5)
@pytest.mark.parametrize("over", [{"ppo_epochs": 2}, {"minibatch_size": 8}])
def test_several_updates_keep_behaviour_weight(tmp_path, over):
    """A batch from a different behaviour policy trained with several optimizer steps keeps the decoupled weight
    π_prox/π_behav (no cap configured). Before: old_log_probs present → weight 1 (no correction at all)."""
    trainer = _skewed_trainer(tmp_path, train={"steps": 1, **over}, loss={"behaviour_weight_cap": None})
    m = trainer.train_step()
    trainer.close()
    assert m["train/optimizer_steps"] == 2.0
    # offsets ±0.3 on alternate rows: weights exp(∓0.3) → mean cosh(0.3) ≈ 1.045 (token-weighted, so approx)
    assert m["behaviour_weight_mean"] == pytest.approx(math.cosh(0.3), abs=0.03)
    assert m["behaviour_weight_mean"] != pytest.approx(1.0, abs=1e-3)


# ------------------------------------------------------------------------------ batch-level metrics (defect 7)
def test_ess_and_ratio_max_are_batch_level(tmp_path):
    """micro_batch_size=1: each episode has one constant weight, so every per-micro-batch ESS is 1; the batch ESS
    over all response tokens is not. Before: ESS was the token-weighted mean of micro-batch values (1.0) and
    ratio_max a mean of maxima."""
    trainer = _skewed_trainer(tmp_path, offsets=(0.0, 0.7), train={"micro_batch_size": 1, "ppo_epochs": 2},
                              optimizer={"lr": 5e-2})
    batch = trainer.collector.collect(trainer.tasks_for_step(0), trainer.cfg.gconfig.n_samples)
    with torch.no_grad():
        lp, _ = token_log_probs(trainer.model, batch["tokens"], batch["attention_mask"],
                                response_mask=batch["response_mask"])
    mask = batch["response_mask"]
    w = (lp - batch["sample_log_probs"])[mask].double().exp()
    expected_first_epoch = float(w.sum() ** 2 / (w.numel() * (w * w).sum()))
    calls = _record_loss_calls(trainer)
    m = trainer._learn(batch)
    trainer.close()
    first_epoch = calls[: len(calls) // 2]
    assert all(c["rows"] == 1 for c in calls)
    assert all(c["ess"] == pytest.approx(1.0, abs=1e-4) for c in first_epoch)  # per-episode ESS: uninformative
    assert expected_first_epoch < 0.97
    # the reported ESS covers both epochs' tokens; the first epoch alone is computed independently above
    assert m["ess"] < 0.97
    assert m["ratio_max"] == pytest.approx(max(c["ratio_max"] for c in calls), rel=1e-6)
    assert m["ratio_max"] > 1.0


# -------------------------------------------------------------------------------- LR schedule length (defect 8)
def test_lr_schedule_reaches_its_end_when_groups_are_filtered(tmp_path, gsm8k_dir):
    """A linear schedule over train.steps=3 ends at 0 even when zero-variance filtering removes every group (a
    random tiny model never solves GSM8K). Before: the scheduler counted planned optimizer steps and never moved."""
    cfg = make_cfg(econfig={"env_id": "GSM8K-v1", "format_reward": 0.0}, train={"steps": 3},
                   loss={"filter_zero_variance_groups": True}, train_dataset={"path": str(gsm8k_dir)},
                   gconfig={"n_samples": 2, "max_new_tokens": 4},
                   optimizer={"lr": 1e-3, "scheduler": "linear"})
    trainer = build_trainer(cfg, tmp_path)
    lrs = [trainer.train_step()["lr"] for _ in range(3)]
    trainer.close()
    assert lrs == pytest.approx([1e-3, 1e-3 * 2 / 3, 1e-3 / 3], abs=1e-12)  # each step's own rate (issue 36.6)


def test_lr_schedule_per_trainer_step_with_minibatches(tmp_path):
    """Several optimizer steps per trainer step: the schedule still spans exactly train.steps."""
    cfg = make_cfg(train={"steps": 2, "minibatch_size": 4}, optimizer={"lr": 1e-3, "scheduler": "linear"})
    trainer = build_trainer(cfg, tmp_path)
    ms = [trainer.train_step() for _ in range(2)]
    trainer.close()
    assert [m["train/optimizer_steps"] for m in ms] == [4.0, 4.0]
    assert ms[-1]["train/optimizer_steps_total"] == 8.0
    assert [m["lr"] for m in ms] == pytest.approx([1e-3, 5e-4], abs=1e-12)  # each step's own rate (issue 36.6)


def test_logged_lr_is_the_rate_the_step_used(tmp_path):
    """Issue 36.6: ``lr`` is the rate of the step's optimizer steps, not the next step's (it was read after
    ``scheduler.step()``: logged [5e-4, 0.0] for steps that used [1e-3, 5e-4])."""
    cfg = make_cfg(train={"steps": 3, "minibatch_size": 8}, optimizer={"lr": 1e-3, "scheduler": "linear"})
    trainer = build_trainer(cfg, tmp_path)
    used = []
    trainer.optimizer.register_step_pre_hook(lambda opt, args, kw: used.append(opt.param_groups[0]["lr"]))
    logged = []
    for _ in range(3):
        n = len(used)
        logged.append(trainer.train_step()["lr"])
        assert len(used) > n and set(used[n:]) == {logged[-1]}  # every optimizer step of the step used it
    trainer.close()
    assert logged == pytest.approx([1e-3, 1e-3 * 2 / 3, 1e-3 / 3], abs=1e-12)


# ------------------------------------------------------------------------------ infrastructure failures (defect 9)
def test_infrastructure_failures_drop_their_groups(tmp_path):
    """ToyFlaky: tasks 1, 5 raise in step (env_error), tasks 3, 7 end with user_error. Their groups are dropped
    whole and never trained; the others are. Before: they were trained with reward 0 (no metric)."""
    cfg = make_cfg(econfig={"env_id": "ToyFlaky-v0"}, train={"steps": 1, "batch_size": 8},
                   gconfig={"n_samples": 2, "max_new_tokens": 8})
    trainer = build_trainer(cfg, tmp_path)
    batch = trainer.collector.collect(trainer.tasks_for_step(0), 2)
    assert batch["infra_error"].sum().item() == 8  # 4 tasks x 2 samples
    calls = _record_loss_calls(trainer)
    m = trainer._learn(batch)
    trainer.close()
    assert m["groups/dropped_infra"] == 4.0
    assert m["groups/kept_episodes"] == 8.0
    assert sum(c["rows"] for c in calls) == 8
    healthy = ~batch["infra_error"]
    assert m["num_tokens"] == float(batch["response_mask"][healthy].sum())


@pytest.mark.parametrize("filtered", [True, False])
def test_batch_std_leaves_out_the_groups_the_step_does_not_train(tmp_path, filtered):
    """loss.adv_scale=batch with loss.filter_zero_variance_groups=true (issue 36): the batch std is that of the
    episodes trained, so the zero-variance groups the filter drops are left out of it, as the infrastructure-failure
    groups are (they used to enter it with advantage 0, shrinking the std: +-1.58 instead of +-0.71 below). Without
    the filter they are trained (with advantage 0) and stay in it."""
    from torchrl_grpo.objectives.advantage import group_advantages

    cfg = make_cfg(train={"steps": 1, "batch_size": 3}, gconfig={"n_samples": 2, "max_new_tokens": 4},
                   loss={"adv_scale": "batch", "filter_zero_variance_groups": filtered},
                   stats_logger={"samples_per_step": 0})
    trainer = build_trainer(cfg, tmp_path)
    batch = trainer.collector.collect(trainer.tasks_for_step(0), 2)
    batch["reward"] = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])  # group 0 varies; groups 1, 2 do not
    seen = []

    class Recorder:  # the update: records the advantages it is given
        optimizer_steps = 0

        def __call__(self, b, **kw):
            seen.append(b["advantage"].clone())
            return {}

    trainer.components.update = Recorder()
    m = trainer._learn(batch)
    trainer.close()
    kept = slice(0, 2) if filtered else slice(0, 6)
    expected = group_advantages(batch["reward"][kept], batch["group_id"][kept], scale="batch")
    assert m["groups/kept_episodes"] == (2.0 if filtered else 6.0)
    torch.testing.assert_close(seen[0], expected)
    assert seen[0][:2].abs().tolist() == pytest.approx([2 ** -0.5] * 2 if filtered else [1.5811] * 2, abs=1e-3)


# ------------------------------------------------------------------------------------- token budget per micro-batch
def test_split_micro_batches():
    from torchrl_grpo.training.micro_batch import split_micro_batches

    assert split_micro_batches([5, 5, 5, 5], 4) == [[0, 1, 2, 3]]
    assert split_micro_batches([5, 5, 5, 5], 3) == [[0, 1, 2], [3]]
    # padded size rows x longest <= 12: [5,5] = 10, adding 6 -> 3 x 6 = 18 > 12
    assert split_micro_batches([5, 5, 6, 2, 20, 1], 8, max_tokens=12) == [[0, 1], [2, 3], [4], [5]]
    assert split_micro_batches([], 4, 10) == []
    with pytest.raises(ValueError):
        split_micro_batches([1], 0)
    with pytest.raises(ValueError):
        split_micro_batches([1], 1, -1)


def test_token_budget_bounds_micro_batches_and_keeps_the_gradient(tmp_path):
    """train.max_tokens_per_mb splits by padded tokens (after the shared prefix, which runs once outside the
    micro-batches: rows x (T - P)); gradient accumulation makes the step identical."""
    ref = build_trainer(make_cfg(train={"steps": 1, "micro_batch_size": 16}), tmp_path / "a")
    r = ref.train_step()
    ref.close()
    budget = 3 * 40
    trainer = build_trainer(make_cfg(train={"steps": 1, "micro_batch_size": 16, "max_tokens_per_mb": budget}),
                          tmp_path / "b")
    calls = _record_loss_calls(trainer)
    m = trainer.train_step()
    trainer.close()
    assert len(calls) > 1
    assert all(c["rows"] * (c["T"] - c["P"]) <= budget or c["rows"] == 1 for c in calls)
    for k in ("loss/total", "grad_norm", "ess", "num_tokens"):
        assert m[k] == pytest.approx(r[k], rel=1e-4, abs=1e-7), k


def test_bad_training_core_config_values(tmp_path):
    with pytest.raises(ValueError, match="max_tokens_per_mb"):
        build_trainer(make_cfg(train={"max_tokens_per_mb": -1}), tmp_path)
    with pytest.raises(ValueError, match="behaviour_weight_mode"):
        build_trainer(make_cfg(loss={"behaviour_weight_mode": "clip"}), tmp_path)
    with pytest.raises(ValueError, match="anchor"):
        build_trainer(make_cfg(loss={"anchor": "sometimes"}), tmp_path)


def test_current_anchor_equals_the_recompute_pass(tmp_path):
    """Issue 12 t.3: with one optimizer step per batch the PPO anchor π_prox is the model before that step, which the
    loss forward itself computes: ``loss.anchor=auto`` then uses its detached log-probs (no extra no-grad pass,
    ``train/anchor_current`` 1) and gives the same metrics and the same updated weights as ``loss.anchor=recompute``
    (the separate pass), on a sampler whose log-probs are off by ±0.3 nats (so the decoupled weight is not 1)."""
    runs = {}
    for anchor in ("auto", "recompute"):
        torch.manual_seed(0)
        trainer = _skewed_trainer(tmp_path / anchor, loss={"anchor": anchor})
        passes = []
        fill = trainer.updater.fill_log_probs
        trainer.updater.fill_log_probs = (lambda td, key, model, passes=passes, fill=fill:
                                          (passes.append(key), fill(td, key, model)))
        m = trainer.train_step()
        trainer.close()
        runs[anchor] = (m, passes, {n: p.detach().clone() for n, p in trainer.model.named_parameters()})
    (ma, pa, wa), (mr, pr, wr) = runs["auto"], runs["recompute"]
    assert pa == [] and pr == ["old_log_probs"]
    assert ma["train/anchor_current"] == 1.0 and mr["train/anchor_current"] == 0.0
    assert ma["train/anchor_recomputed"] == mr["train/anchor_recomputed"] == 1.0
    for k in ("loss/total", "ratio_mean", "clip_fraction", "ess", "behaviour_weight_mean", "grad_norm"):
        assert ma[k] == pytest.approx(mr[k], abs=1e-5), k
    assert ma["behaviour_weight_mean"] != pytest.approx(1.0, abs=1e-2)
    for n in wa:
        torch.testing.assert_close(wa[n], wr[n], atol=1e-6, rtol=0, msg=n)
