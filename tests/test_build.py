"""Construction apart from the loop (issue 9): build() components, backends owning their weight sync, metric
reductions declared next to the loss, and the trainer's import graph."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import tests.toy_envs  # noqa: F401  (registers ToyVowels-v0)
from tests.test_trainer import make_cfg
from torchrl_grpo.backends.transformers_backend import TransformersBackend
from torchrl_grpo.assembly import Components, LoopSettings, build, build_trainer, trainer_class
from torchrl_grpo.objectives.loss import REDUCTIONS, LossMetrics
from torchrl_grpo.model_store import load_model_and_tokenizer
from torchrl_grpo.training.grpo_trainer import GRPOTrainer
from torchrl_grpo.backends.weight_sync import export_hf_weights


def test_build_gives_the_loop_its_components_and_settings(tmp_path):
    cfg = make_cfg(train={"steps": 3, "batch_size": 2}, gconfig={"n_samples": 4, "max_new_tokens": 8})
    c = build(cfg, tmp_path)
    assert isinstance(c, Components) and isinstance(c.settings, LoopSettings)
    assert (c.settings.steps, c.settings.batch_size, c.settings.n_samples) == (3, 2, 4)
    with pytest.raises(AttributeError):  # frozen: the loop cannot change its settings
        c.settings.steps = 5
    trainer = GRPOTrainer(components=c)
    m = trainer.train_step()
    trainer.close()
    assert trainer.step == 1 and m["train/optimizer_steps"] == 1.0 and m["policy_version"] == 1


def test_build_trainer_picks_the_loop_and_the_loop_takes_components_only(tmp_path):
    """The trainer class is chosen by build (issue 27): sync / async / continual from the config; the loop is built
    on components, and a config given in their place fails with a TypeError naming build_trainer."""
    from torchrl_grpo.continual.trainer import ContinualTrainer
    from torchrl_grpo.training.async_trainer import AsyncGRPOTrainer

    assert trainer_class(make_cfg()) is GRPOTrainer
    assert trainer_class(make_cfg(mode="async")) is AsyncGRPOTrainer
    assert trainer_class(make_cfg(cl={"task_order": ["mock"]})) is ContinualTrainer
    with pytest.raises(TypeError, match="build_trainer"):
        GRPOTrainer(make_cfg())
    trainer = build_trainer(make_cfg(train={"steps": 1}), tmp_path)
    try:
        assert type(trainer) is GRPOTrainer and isinstance(trainer.components, Components)
        assert trainer.cfg.train.steps == 1 and trainer.settings.steps == 1
    finally:
        trainer.close()


def test_sync_from_shared_module_only_bumps_the_version():
    model, tok = load_model_and_tokenizer("tiny-random")
    backend = TransformersBackend(model, pad_token_id=tok.pad_token_id, share_module=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    backend.sync_from(model, probe=[1, 2, 3])
    assert backend.policy_version == 1 and backend.last_sync_stats == {}
    assert backend.model is model
    for n, p in model.named_parameters():
        torch.testing.assert_close(p, before[n])


def test_sync_from_copy_loads_the_merged_lora_weights():
    from peft import LoraConfig, get_peft_model

    model, tok = load_model_and_tokenizer("tiny-random")
    copy_model, _ = load_model_and_tokenizer("tiny-random")
    backend = TransformersBackend(copy_model, pad_token_id=tok.pad_token_id, share_module=False)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    backend.sync_from(peft_model)
    assert backend.policy_version == 1
    got = dict(copy_model.named_parameters())
    n_lora = 0
    for name, t in export_hf_weights(peft_model):
        torch.testing.assert_close(got[name], t)
        n_lora += "proj" in name
    assert n_lora > 0
    # a LoRA delta really moved the weights: the copy is not the base model any more
    base = dict(peft_model.get_base_model().named_parameters())
    name = next(n for n in got if n.endswith("q_proj.weight"))
    assert not torch.equal(got[name], base[name.replace("q_proj.weight", "q_proj.base_layer.weight")])


def _fake_losses(values: dict[str, float]):
    from tensordict import TensorDict

    return TensorDict({k: torch.tensor(v) for k, v in values.items()}, batch_size=[])


def test_loss_metrics_reduce_as_declared():
    """Two micro-batches of 3 and 1 tokens: token means weighted 3:1, max of ratio_max, sum of num_tokens, ESS of
    the pooled weights, NaN metrics left out, loss/total averaged over minibatches."""
    assert REDUCTIONS["ratio_max"] == "max" and REDUCTIONS["num_tokens"] == "sum" and REDUCTIONS["ess"] == "ess"
    w1, w2 = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64), torch.tensor([3.0], dtype=torch.float64)
    acc = LossMetrics()
    for w, clip, rmax, kl in ((w1, 0.2, 1.5, float("nan")), (w2, 0.6, 1.2, float("nan"))):
        acc.add(_fake_losses({"loss_objective": 1.0, "clip_fraction": clip, "ratio_max": rmax, "kl_ref": kl,
                              "num_tokens": float(w.numel()), "ess": 0.5,
                              "ess_log_sum_w": float(w.sum().log()), "ess_log_sum_w2": float((w**2).sum().log())}),
                tokens=float(w.numel()), scaled_loss=0.5, share=0.5)
    out = acc.finish(n_minibatches=1)
    w = torch.cat([w1, w2])
    assert out["clip_fraction"] == pytest.approx((0.2 * 3 + 0.6 * 1) / 4)
    assert out["ratio_max"] == 1.5 and out["num_tokens"] == 4.0
    assert out["ess"] == pytest.approx(float(w.sum() ** 2 / (4 * (w**2).sum())))
    assert "kl_ref" not in out and out["loss/total"] == pytest.approx(1.0)
    empty = LossMetrics().finish(0)
    assert empty["ess"] != empty["ess"] and empty["ratio_max"] != empty["ratio_max"] and "loss/total" not in empty


def test_trainer_imports_the_components_not_their_constructors():
    code = ("import sys, torchrl_grpo.training.grpo_trainer, torchrl_grpo.training.async_trainer; "
            "print(' '.join(m for m in sys.modules if m.split('.')[0] in ('peft', 'vllm', 'tau2') or m in "
            "('torchrl_grpo.assembly', 'torchrl_grpo.model_store', 'torchrl_grpo.rollout.env_side', "
            "'torchrl_grpo.backends.transformers_backend', 'torchrl_grpo.backends.vllm_backend')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == []
