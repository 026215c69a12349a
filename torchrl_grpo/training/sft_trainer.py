r"""Supervised fine-tuning (SFT) before RL: gold demonstrations, then rounds of rejection-sampling fine-tuning (RFT),
evaluated on the valid/test split, written as a model directory that ``grpo.py actor.path=`` starts from.

The recipe of slime's tau2 cookbook and of the GSM8K guides (SFT -> RFT -> GRPO): RL from a model that can
already act. Data: :mod:`torchrl_grpo.rollout.demonstrations` (gold replays through the RL collector and env, so the
tokens are the ones the policy will later sample; the policy's own successful episodes for RFT).

Objective (the standard maximum-likelihood / behaviour-cloning loss, e.g. InstructGPT's SFT stage, Ouyang et al.,
2022, arXiv:2203.02155, Sec. 3.5): over the assistant tokens ``m`` of a minibatch,

.. math:: \mathcal{L}_{SFT} = -\frac{1}{\sum_{i,t} m_{i,t}} \sum_{i,t} m_{i,t} \log\pi_\theta(o_{i,t} \mid o_{i,<t}),

the token mean over the whole minibatch (DAPO's token-level aggregation, as the GRPO loss): tool results, user
turns and the prompt are context only. The optimizer side is :class:`torchrl_grpo.training.update.GRPOUpdate` with this
loss (micro-batches by token budget, the shared-prefix forward, gradient clipping, non-finite skips), one
optimizer step per minibatch.
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.objectives.common import LossModule

from torchrl_grpo.config.choices import SFT_SOURCES  # sft.source, defined once in the config
from torchrl_grpo.rollout.demonstrations import gold_demonstrations, successful_episodes
from torchrl_grpo.objectives.log_probs import token_log_probs
from torchrl_grpo.objectives.shared_prefix import SharedPrefix
from torchrl_grpo.training.grpo_trainer import GRPOTrainer
from torchrl_grpo.training.optimizer import make_scheduler
from torchrl_grpo.training.update import GRPOUpdate

__all__ = ["SFTLoss", "SFTTrainer", "SFT_SOURCES", "save_merged_model"]

log = logging.getLogger(__name__)

class SFTLoss(LossModule):
    """Token-mean negative log-likelihood of the assistant tokens (module docstring), as a TorchRL ``LossModule``
    that :class:`~torchrl_grpo.training.update.GRPOUpdate` runs in place of the GRPO loss.

    Input TensorDict [B]: ``tokens`` long [B, T], ``attention_mask`` bool [B, T], ``response_mask`` bool [B, T]
    (the tokens to imitate). Output (scalars): ``loss_sft`` (the NLL, nats/token, to backpropagate), ``nll`` (its
    detached value), ``num_tokens``.

    Raises:
        ValueError: missing keys or shapes that differ.
    """

    aggregation = "token_mean"  # GRPOUpdate weights micro-batches by their share of the minibatch's tokens
    temperature, top_p, top_k = 1.0, 1.0, 0  # the model's raw distribution (used by no-grad scoring passes)

    def __init__(self, actor: torch.nn.Module) -> None:
        super().__init__()
        self.__dict__["actor"] = actor  # a plain attribute: no functional copy
        self.anchor_current = False  # set by GRPOUpdate; an SFT loss has no importance ratio to anchor

    @property
    def in_keys(self):
        return ["tokens", "attention_mask", "response_mask"]

    @property
    def out_keys(self):
        return ["loss_sft", "nll", "num_tokens"]

    def forward(self, tensordict: TensorDictBase, prefix: SharedPrefix | None = None) -> TensorDict:
        missing = [k for k in self.in_keys if k not in tensordict.keys()]
        if missing:
            raise ValueError(f"SFTLoss: input lacks {missing}; present: {sorted(map(str, tensordict.keys()))}")
        tokens, attn = tensordict["tokens"], tensordict["attention_mask"].bool()
        mask = tensordict["response_mask"].bool() & attn
        if tokens.shape != attn.shape or mask.shape != tokens.shape:
            raise ValueError("tokens, attention_mask and response_mask must all be [B, T]")
        logp, _ = token_log_probs(self.actor, tokens, attn, response_mask=mask, prefix=prefix)
        n = mask.sum()
        nll = -(logp * mask).sum() / n.clamp_min(1)
        return TensorDict({"loss_sft": nll, "nll": nll.detach(), "num_tokens": n.float()}, batch_size=[])


def save_merged_model(model: torch.nn.Module, tokenizer, out_dir: str | Path) -> Path:
    """Write ``model`` (LoRA merged into the base weights, HF names) and ``tokenizer`` to ``out_dir`` as one Hugging
    Face model directory: what ``actor.path=`` (:func:`torchrl_grpo.models.load_model_and_tokenizer`) loads. The
    in-memory model is not changed (a LoRA model keeps its adapter).

    Returns:
        ``out_dir`` as a Path.
    """
    from torchrl_grpo.backends.weight_sync import export_hf_weights

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    state = {k: v.detach().cpu().contiguous() for k, v in export_hf_weights(model)}
    # tied embeddings: HF drops the tied copy itself; buffers are rebuilt from the config
    base.save_pretrained(out, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


class SFTTrainer(GRPOTrainer):
    """SFT (gold demonstrations) and RFT rounds on the env of a :class:`~torchrl_grpo.config.GRPOConfig`, with the
    GRPO trainer's components (model, LoRA, backend, collectors, logger, evaluation): ``python sft.py``.

    ``fit()``: evaluate (``eval.at_start``) -> ``sft.epochs`` epochs over the gold demonstrations of the train split
    (``sft.source=gold``) -> ``sft.rft_rounds`` rounds of: sample ``sft.rft_samples`` episodes per train task with
    the policy, keep those with reward ``>= sft.min_reward``, ``sft.epochs`` epochs on them -> ``<run_dir>/sft_model``
    (``sft.save_model``: merged weights + tokenizer; ``grpo.py actor.path=`` that dir; written before the final eval
    so a failed or interrupted eval keeps the training) -> evaluate (``eval.at_end``).
    ``self.step`` counts optimizer steps (the metrics' x axis). SIGINT / SIGTERM stop the run where it is
    (``grpo.run_trainer`` closes it); nothing is written before the end but ``metrics.jsonl``.

    Built by :func:`torchrl_grpo.build.build_trainer` ``(cfg, run_dir, trainer_cls=SFTTrainer)``, which also refuses
    Ray rollout workers before anything is built (:func:`torchrl_grpo.config.check_sft_run`).

    Args:
        components: the built components (:class:`~torchrl_grpo.training.components.Components`).
        cfg: the config they were built from (``sft.*``, ``optimizer.*`` are read).

    Raises:
        ValueError: torchrun ranks; RuntimeError: no demonstration survives the replay.
    """

    def __init__(self, components, *, cfg) -> None:
        super().__init__(components, cfg=cfg)
        s = cfg.sft  # choices and ranges checked with the rest of the config, before the model loads (validate_config)
        if self.dp.enabled:
            raise ValueError("sft.py runs in one process (no torchrun / FSDP yet)")
        self.sft = s
        self.sft_loss = SFTLoss(self.model)
        u = self.updater
        self.sft_update = GRPOUpdate(
            self.model, self.sft_loss, self.optimizer, reference=None, device=self.device, autocast=u.autocast,
            ppo_epochs=1, minibatch_size=0, micro_batch_size=u.micro_batch_size, max_tokens_per_mb=u.max_tokens_per_mb,
            max_grad_norm=u.max_grad_norm, anchor="behaviour", exact_log_probs=True, seed=self.settings.seed,
            shared_prefix=u.shared_prefix)

    def _fine_tune(self, data: TensorDict, phase: str, round_: int = 0) -> dict[str, float]:
        """``sft.epochs`` epochs over ``data`` (a collector batch), one optimizer step per ``sft.minibatch_size``
        episodes in a seeded order; logs ``sft/*`` per optimizer step. Returns the last step's metrics."""
        s, o = self.sft, self.cfg.optimizer
        data = data.select(*[k for k, v in data.items() if isinstance(v, torch.Tensor)])  # tensor columns only
        n = data.shape[0]
        mb = min(s.minibatch_size, n)
        per_epoch = -(-n // mb)
        total = per_epoch * s.epochs
        for g in self.optimizer.param_groups:  # each phase's schedule peaks at optimizer.lr (LambdaLR's base), not at
            g["initial_lr"] = o.lr  # the lr an earlier schedule (the build's GRPO one, a finished phase) left behind
        scheduler = make_scheduler(self.optimizer, o.scheduler, o.warmup_steps, total)
        gen = torch.Generator().manual_seed(self.settings.seed * 7919 + round_)
        last: dict[str, float] = {}
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc=f"{phase} ({n} episodes)", unit="step", disable=not self.settings.progress_bar)
        try:
            for epoch in range(s.epochs):
                perm = torch.randperm(n, generator=gen)
                for k in range(per_epoch):
                    t0 = time.perf_counter()
                    m = self.sft_update(data[perm[k * mb:(k + 1) * mb]], step=self.step)
                    scheduler.step()
                    self.step += 1
                    last = {(key if "/" in key else f"sft/{key}"): v for key, v in m.items()
                            if isinstance(v, float) and math.isfinite(v)}  # no ESS / ratio: NaN for this loss
                    last.update({"sft/epoch": float(epoch), "sft/round": float(round_),
                                 "sft/lr": scheduler.get_last_lr()[0], "time/step_s": time.perf_counter() - t0})
                    self.logger.log(last, step=self.step)
                    bar.update(1)
                    bar.set_postfix({"nll": f"{last.get('sft/nll', float('nan')):.3g}"})
        finally:
            bar.close()
        self.collector.update_policy_weights_(self.model)  # the rollout engine samples the fine-tuned policy
        return last

    def rft_round(self, round_: int) -> TensorDict | None:
        """Sample ``sft.rft_samples`` episodes per train task (all usable ones; ``train_dataset.limit`` caps them)
        with the current policy; the successful ones (:func:`~torchrl_grpo.rollout.demonstrations.successful_episodes`),
        logged as ``rft/*``."""
        tasks = [{"index": i} for i in self.train_tasks]
        batch = self.collector.collect(tasks, self.sft.rft_samples, step=10_000 + round_)
        kept = successful_episodes(batch, self.sft.min_reward)
        stats = {"rft/round": float(round_), "rft/episodes": float(batch.shape[0]),
                 "rft/kept": float(0 if kept is None else kept.shape[0]),
                 "rft/success_rate": float((batch["reward"] >= self.sft.min_reward).float().mean()),
                 "rft/reward_mean": float(batch["reward"].mean()),
                 **{f"rft/{k.split('/')[-1]}": v for k, v in self.collector.last_stats.items()}}
        self.logger.log(stats, step=self.step)
        log.info("RFT round %d: %d of %d episodes kept", round_, int(stats["rft/kept"]), batch.shape[0])
        return kept

    def fit(self) -> dict[str, Any]:
        """Run the recipe (class docstring). Returns ``eval_start`` / ``eval_end`` metrics, the demonstration and RFT
        stats, the last step's metrics and the ``model_dir`` written."""
        s, st = self.sft, self.settings
        summary: dict[str, Any] = {"load_time_s": self.load_time_s}
        (self.run_dir / "config.yaml").write_text(st.config_yaml)  # the resolved config of this run
        if st.eval_at_start and st.eval_n_problems > 0:
            summary["eval_start"] = ev = self.evaluate()
            self.logger.log(ev, step=self.step)
        last: dict[str, float] = {}
        if s.source == "gold":
            data, stats = gold_demonstrations(self.collector, self.train_tasks, min_reward=s.min_reward,
                                              progress=st.progress_bar)
            summary["demonstrations"] = stats
            self.logger.log(stats, step=self.step)
            if data is None:
                raise RuntimeError(f"no gold demonstration of the {len(self.train_tasks)} train tasks scored >= "
                                   f"{s.min_reward} when replayed (demo/reward_mean {stats['demo/reward_mean']:.3f})")
            last = self._fine_tune(data, "gold")
        summary["rft"] = []
        for r in range(s.rft_rounds):
            kept = self.rft_round(r)
            summary["rft"].append(0 if kept is None else int(kept.shape[0]))
            if kept is not None:
                last = self._fine_tune(kept, "rft", round_=r + 1)
        if s.save_model:  # before the final eval: an eval that dies (or a cut session) must not lose the training
            summary["model_dir"] = str(save_merged_model(self.model, self.tokenizer, self.run_dir / "sft_model"))
            log.info("fine-tuned model written to %s: python grpo.py actor.path=%s ...", summary["model_dir"],
                     summary["model_dir"])
        if st.eval_at_end and st.eval_n_problems > 0:
            summary["eval_end"] = ev = self.evaluate()
            self.logger.log(ev, step=self.step)
        summary["last"] = last
        summary["learning_curve"] = self._draw_learning_curve()
        return summary
