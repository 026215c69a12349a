"""Synchronous GRPO trainer.

One step: sample ``train.batch_size`` tasks → collect ``gconfig.n_samples`` episodes each (a group) with the
rollout backend → group-relative advantages → ``train.ppo_epochs`` passes of minibatch updates (gradient
accumulation over micro-batches, grad-norm clipping, AdamW) → push the new weights to the backend → log,
evaluate and checkpoint on schedule.

Everything random is derived from ``seed`` and the step number (task order, sampling seeds), and the
checkpoint stores model, optimizer, scheduler and RNG states, so ``train.resume_from`` continues exactly.
"""
from __future__ import annotations

import copy
import logging
import math
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from .advantage import group_advantages, group_reward_std
from .backends.base import RolloutBackend, SamplingConfig
from .checkpoint import load_checkpoint, save_checkpoint
from .collector import GroupCollector
from .env_factory import env_kwargs_from_config, make_env_fn, usable_task_indices
from .evaluation import do_nothing_baseline, evaluate, format_eval_table
from .log_probs import token_log_probs
from .collector import INFRA_TERMINATIONS  # noqa: F401  (documented with the infra_error column)
from .dropout import disable_dropout
from .loss import GRPOLoss, combine_ess, total_loss
from .micro_batch import split_micro_batches
from .models import load_model_and_tokenizer
from .stats_logger import StatsLogger
from .weight_sync import export_hf_weights

__all__ = ["GRPOTrainer", "seed_everything"]

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device=cuda but no CUDA device is available")
    return torch.device(name)


def _make_scheduler(opt: torch.optim.Optimizer, kind: str, warmup: int, total: int):
    """LR schedule over *trainer steps* (``train.steps``), stepped once per trainer step whatever the number of
    optimizer steps it took: zero-variance filtering and skipped minibatches change that number from step to step,
    so a schedule counted in planned optimizer steps never reached its end (a linear schedule stopped at half its
    decay with half the groups filtered)."""

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _non_tensor_list(batch: TensorDict, key: str) -> list:
    """A non-tensor column of a collected batch (``task``, ``info``) as a Python list, one entry per episode."""
    col = batch[key]
    return col.tolist() if hasattr(col, "tolist") else list(col)


class GRPOTrainer:
    """Sync GRPO trainer driven by a :class:`torchrl_grpo.config.GRPOConfig` (an OmegaConf node).

    Args:
        cfg: the resolved config.
        run_dir: output directory (``metrics.jsonl``, ``checkpoints/``).
        model / tokenizer: optional preloaded policy (tests, notebooks); otherwise loaded from ``actor.path``.
        backend: optional rollout backend; otherwise built from ``rollout.backend``.

    Raises:
        ValueError: bad config values; FileNotFoundError: missing data or checkpoint.
    """

    def __init__(self, cfg, run_dir: str | Path, *, model=None, tokenizer=None, backend: RolloutBackend | None = None) -> None:
        from .config import validate_config

        validate_config(cfg)
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        seed_everything(cfg.seed)
        self.device = _device(cfg.train.device)
        t0 = time.perf_counter()
        if model is None:
            model, tokenizer = load_model_and_tokenizer(cfg.actor.path, dtype=cfg.actor.dtype, device=self.device)
        elif tokenizer is None:
            raise ValueError("a preloaded model needs its tokenizer")
        self.load_time_s = time.perf_counter() - t0
        self.tokenizer = tokenizer
        max_pos = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        if isinstance(max_pos, int) and cfg.rollout.max_context_tokens > max_pos:
            log.warning("rollout.max_context_tokens=%d exceeds the trained context of %s (%d positions): longer "
                        "episodes run on extrapolated positions (RoPE) or fail (absolute positions); lower it or pick "
                        "a longer-context model", cfg.rollout.max_context_tokens, cfg.actor.path, max_pos)
        model.to(self.device)
        if cfg.actor.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        self.ref_model = None
        if cfg.actor.peft.enable:
            from peft import LoraConfig, get_peft_model

            p = cfg.actor.peft
            target = p.target_modules if isinstance(p.target_modules, str) else list(p.target_modules)
            model = get_peft_model(model, LoraConfig(r=p.r, lora_alpha=p.lora_alpha, lora_dropout=p.lora_dropout,
                                                     target_modules=target, task_type="CAUSAL_LM"))
        elif cfg.loss.kl_coef > 0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        if cfg.train.disable_dropout:  # see torchrl_grpo/dropout.py: dropout alone moved on-policy ratios to 1.14
            disable_dropout(model)
        self.model = model
        self.backend = backend or self._build_backend()
        self.sampling = SamplingConfig(max_new_tokens=cfg.gconfig.max_new_tokens, temperature=cfg.gconfig.temperature,
                                       top_p=cfg.gconfig.top_p, top_k=cfg.gconfig.top_k)
        user_fn = None
        if cfg.econfig.user == "local" or cfg.econfig.user_llm == "local":
            from .local_user import LocalUser

            user_fn = LocalUser(self.backend, tokenizer, SamplingConfig(max_new_tokens=cfg.gconfig.max_new_tokens,
                                                                        temperature=0.7, seed=cfg.seed))
        env_id, kw = env_kwargs_from_config(cfg, cfg.train_dataset.split, cfg.train_dataset.path, user_fn=user_fn)
        self.collector = GroupCollector(make_env_fn(env_id, **kw), self.backend, tokenizer, self.sampling,
                                        max_turns=cfg.econfig.max_turns, max_context_tokens=cfg.rollout.max_context_tokens,
                                        seed=cfg.seed, user_batcher=user_fn)
        self.train_tasks = usable_task_indices(self.collector._envs(1)[0], cfg.train_dataset.limit)
        self.n_train_tasks = len(self.train_tasks)
        if self.n_train_tasks < 1:
            raise ValueError(f"train split {cfg.train_dataset.split!r} of {env_id} has no tasks")
        vid, vkw = env_kwargs_from_config(cfg, cfg.valid_dataset.split, cfg.valid_dataset.path or cfg.train_dataset.path,
                                          user_fn=user_fn)
        self._valid_env = (vid, vkw)
        self._baseline: dict[str, float] | None = None
        self._eval_tasks: list[int] | None = None
        self.eval_collector = GroupCollector(make_env_fn(vid, **vkw), self.backend, tokenizer, self.sampling,
                                             max_turns=cfg.econfig.max_turns,
                                             max_context_tokens=cfg.rollout.max_context_tokens, seed=cfg.seed + 1,
                                             user_batcher=user_fn)
        self.loss_fn = GRPOLoss(
            self.model, clip_eps_low=cfg.loss.clip_eps_low, clip_eps_high=cfg.loss.clip_eps_high,
            kl_coef=cfg.loss.kl_coef, entropy_coef=cfg.loss.entropy_coef, aggregation=cfg.loss.aggregation,
            max_tokens=cfg.gconfig.max_new_tokens * cfg.econfig.max_turns,
            temperature=cfg.gconfig.temperature if cfg.gconfig.temperature > 0 else 1.0,
            # greedy rollouts report the raw softmax: no truncation then (see torchrl_grpo/loss.py)
            top_p=cfg.gconfig.top_p if cfg.gconfig.temperature > 0 else 1.0,
            top_k=cfg.gconfig.top_k if cfg.gconfig.temperature > 0 else 0,
            behaviour_weight_cap=cfg.loss.behaviour_weight_cap, behaviour_weight_mode=cfg.loss.behaviour_weight_mode,
        )
        params = [p for p in self.model.parameters() if p.requires_grad]
        o = cfg.optimizer
        # fused AdamW: one kernel over all parameters (0.48 -> 0.07 s per step on SmolLM2-135M, CPU)
        fused = self.device.type in ("cpu", "cuda") and all(p.is_floating_point() for p in params)
        self.optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay,
                                           fused=fused or None)
        self.scheduler = _make_scheduler(self.optimizer, o.scheduler, o.warmup_steps, cfg.train.steps)
        self.optimizer_steps = 0  # optimizer steps actually taken (logged as train/optimizer_steps_total)
        self.step = 0
        if cfg.train.resume_from:
            state = load_checkpoint(cfg.train.resume_from, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)
            self.step = int(state["step"])
            self.optimizer_steps = int(state.get("extra", {}).get("optimizer_steps", 0))
            self.backend.load_weights(self._weights_for_backend())
            log.info("resumed from %s at step %d", state["path"], self.step)
        self.logger = StatsLogger(
            self.run_dir, OmegaConf.to_container(cfg, resolve=True), wandb_mode=cfg.stats_logger.wandb.mode,
            project=cfg.stats_logger.wandb.project, entity=cfg.stats_logger.wandb.entity,
            name=cfg.stats_logger.wandb.name, console=cfg.stats_logger.console, resume=bool(cfg.train.resume_from),
        )

    # ------------------------------------------------------------------ setup helpers
    def _build_backend(self) -> RolloutBackend:
        r = self.cfg.rollout
        if r.backend == "transformers":
            from .backends.transformers_backend import TransformersBackend

            return TransformersBackend(self.model, pad_token_id=self.tokenizer.pad_token_id, share_module=True,
                                       max_batch_size=r.max_batch_size)
        from .backends.vllm_backend import VLLMBackend  # raises a clear ImportError without the [vllm] extra
        from .models import resolve_model_path

        src = resolve_model_path(self.cfg.actor.path)
        extra = {"gpu_memory_utilization": r.vllm.gpu_memory_utilization} if torch.cuda.is_available() else {}
        backend = VLLMBackend(src.path, tokenizer=self.tokenizer, dtype=r.vllm.dtype, max_model_len=r.vllm.max_model_len,
                              seed=self.cfg.seed, **extra)
        if self.cfg.actor.peft.enable:  # LoRA layers may be initialised non-zero: push the merged policy
            backend.load_weights(export_hf_weights(self.model))
        return backend

    def _weights_for_backend(self):
        from .backends.transformers_backend import TransformersBackend

        if isinstance(self.backend, TransformersBackend) and self.backend.share_module:
            return None
        return export_hf_weights(self.model)

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    # ------------------------------------------------------------------ data
    def tasks_for_step(self, step: int) -> list[dict]:
        """The task indices of ``step``: an epoch-wise permutation of the train tasks seeded by (seed, epoch)."""
        bs, n = self.cfg.train.batch_size, self.n_train_tasks
        out = []
        for k in range(step * bs, (step + 1) * bs):
            epoch, pos = divmod(k, n)
            perm = np.random.default_rng([self.cfg.seed, epoch]).permutation(n)
            out.append({"index": self.train_tasks[int(perm[pos])]})
        return out

    # ------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, Any]:
        """Run one GRPO step (collect, advantages, updates, weight sync). Returns its metrics."""
        cfg = self.cfg
        t0 = time.perf_counter()
        batch = self.collector.collect(self.tasks_for_step(self.step), cfg.gconfig.n_samples, step=self.step)
        metrics: dict[str, Any] = dict(self.collector.last_stats)
        metrics.update(self._learn(batch))
        t_sync = time.perf_counter()
        self.backend.load_weights(self._weights_for_backend())
        metrics["time/sync_s"] = time.perf_counter() - t_sync
        every = self.cfg.rollout.vllm.check_sync_every
        if every and self.cfg.rollout.backend == "vllm" and self.backend.policy_version % every == 0:
            from .backends.vllm_backend import check_weight_sync

            row = batch[0]
            seq = row["tokens"][row["attention_mask"]].tolist()[: self.cfg.rollout.vllm.max_model_len]
            chk = check_weight_sync(self.backend, self.model, seq)
            metrics["sync/max_abs_logprob_diff"] = chk["max_abs_diff"]
            metrics["sync/mean_abs_logprob_diff"] = chk["mean_abs_diff"]
            if not chk["ok"]:
                log.warning("step %d: vLLM and trainer log-probs disagree after sync: %s", self.step, chk)
        metrics["time/step_s"] = time.perf_counter() - t0
        metrics["policy_version"] = self.backend.policy_version
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        self.step += 1
        return metrics

    def _learn(self, batch: TensorDict, *, stale: bool = False) -> dict[str, Any]:
        """Advantages, group filters (infrastructure failures, zero variance) and the optimizer updates on one
        collected batch. ``stale``: the batch was generated by an older policy than the one being trained (async)."""
        cfg = self.cfg
        metrics: dict[str, Any] = self._batch_metrics(batch)
        self._log_samples(batch)
        reward = batch["reward"]
        batch["advantage"] = group_advantages(reward, batch["group_id"], scale=cfg.loss.adv_scale,
                                              baseline=cfg.loss.adv_baseline)
        # a group with an episode that ended on an env exception or a customer-simulator failure is dropped whole:
        # its reward 0 says nothing about the policy, and the rest of the group's advantages were computed against it
        infra = batch["infra_error"] if "infra_error" in batch.keys() else torch.zeros_like(reward, dtype=torch.bool)
        bad_groups = batch["group_id"][infra].unique()
        drop = torch.isin(batch["group_id"], bad_groups)
        metrics["groups/dropped_infra"] = float(bad_groups.numel())
        if bad_groups.numel():
            log.warning("step %d: %d group(s) dropped for infrastructure failures (env_error/user_error), not trained",
                        self.step, bad_groups.numel())
        zero_var = group_reward_std(reward, batch["group_id"]) == 0
        metrics["groups/zero_variance_fraction"] = zero_var.float().mean().item()
        keep = ~drop
        if cfg.loss.filter_zero_variance_groups:
            keep &= ~zero_var
        if not keep.all():
            batch = batch[keep]
        metrics["groups/kept_episodes"] = float(batch.shape[0])
        t_train = time.perf_counter()
        if batch.shape[0] == 0 or not batch["response_mask"].any():
            reason = ("no episodes left after zero-variance/infrastructure group filtering" if batch.shape[0] == 0
                      else "no response tokens")
            log.warning("step %d: optimizer step skipped (%s)", self.step, reason)
            metrics["train/skipped"] = 1.0
            metrics["train/skip_reason"] = reason
            metrics["train/optimizer_steps"] = 0.0
        else:
            metrics.update(self._update(batch.exclude("task", "info"), stale=stale))
        with warnings.catch_warnings():  # a step with no optimizer step still advances the schedule, on purpose
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()  # one schedule step per trainer step (see _make_scheduler)
        metrics["train/optimizer_steps_total"] = float(self.optimizer_steps)
        metrics["time/train_s"] = time.perf_counter() - t_train
        return metrics

    def _log_samples(self, batch: TensorDict) -> None:
        k = self.cfg.stats_logger.samples_per_step
        if k <= 0:
            return
        gids = batch["group_id"].tolist()
        firsts = [i for i, g in enumerate(gids) if i == 0 or gids[i - 1] != g][:k]
        tasks = _non_tensor_list(batch, "task")
        out = []
        for i in firsts:
            row = batch[i]
            ids = row["tokens"][row["attention_mask"]][int(row["prompt_length"]):]  # everything after the prompt
            out.append({"group_id": gids[i], "task": tasks[i], "reward": float(row["reward"]),
                        "response_tokens": int(row["response_mask"].sum()),
                        "text": self.tokenizer.decode(ids, skip_special_tokens=False)})
        try:
            self.logger.log_samples(out, step=self.step + 1)
        except OSError as exc:  # samples are a convenience; never stop training for them
            log.warning("could not write samples.jsonl: %s", exc)

    def _batch_metrics(self, batch: TensorDict) -> dict[str, float]:
        r = batch["reward"]
        infos = _non_tensor_list(batch, "info")
        out = {
            "reward/mean": r.mean().item(), "reward/std": r.std().item() if r.numel() > 1 else 0.0,
            "reward/max": r.max().item(), "reward/success_rate": (r >= 1.0).float().mean().item(),
            "episode/response_tokens": batch["response_tokens"].float().mean().item(),
            "episode/total_tokens": batch["attention_mask"].sum(-1).float().mean().item(),
            "episode/turns": batch["num_turns"].float().mean().item(),
            "episode/context_truncated": batch["context_truncated"].float().mean().item(),
            "episode/truncated_fraction": batch["length_truncated"].float().mean().item(),
            "episode/empty_response_fraction": (batch["response_tokens"] == 0).float().mean().item(),
        }
        # Guard against length-driven reward hacking (issue 14: a format credit made a wrong one-line answer beat
        # reasoning cut off at max_new_tokens, and responses shrank 236 -> 52 tokens while accuracy fell).
        resp, trunc = out["episode/response_tokens"], out["episode/truncated_fraction"]
        if getattr(self, "_first_response_tokens", None) is None:
            self._first_response_tokens = resp
        elif resp < 0.4 * self._first_response_tokens:
            log.warning("step %d: mean response length %.1f tokens is below 40%% of the first step's %.1f: the policy "
                        "may be learning to skip reasoning (check the reward for credit a short answer can earn, "
                        "e.g. econfig.format_reward)", self.step + 1, resp, self._first_response_tokens)
        if trunc > 0.5:
            log.warning("step %d: %.0f%% of episodes were truncated at max_new_tokens=%d (unfinished attempts score "
                        "as failures); raise gconfig.max_new_tokens", self.step + 1, 100 * trunc,
                        self.cfg.gconfig.max_new_tokens)
        out["episode/action_errors"] = batch["action_errors"].float().mean().item()
        out["episode/action_error_rate"] = (batch["action_errors"].sum() / batch["num_turns"].sum().clamp_min(1)).item()
        reasons: dict[str, int] = {}
        for i in infos:
            if isinstance(i, dict) and i.get("termination_reason"):
                reasons[str(i["termination_reason"])] = reasons.get(str(i["termination_reason"]), 0) + 1
        for k, v in reasons.items():
            out[f"termination/{k}"] = v / len(infos)
        return out

    def _micro_batches(self, td: TensorDict):
        """Micro-batches of ``td`` by ``train.micro_batch_size`` and the ``train.max_tokens_per_mb`` token budget
        (:func:`~torchrl_grpo.micro_batch.split_micro_batches`), each cut to its own longest episode."""
        lengths = td["attention_mask"].sum(-1)
        full_T = td["tokens"].shape[-1]
        for rows in split_micro_batches(lengths.tolist(), self.cfg.train.micro_batch_size,
                                        self.cfg.train.max_tokens_per_mb):
            mb = td[torch.tensor(rows)] if len(rows) != td.shape[0] else td
            T = int(lengths[rows].max().item())
            yield rows, mb.apply(lambda x: x[:, :T] if x.ndim == 2 and x.shape[-1] == full_T else x,
                                 batch_size=mb.batch_size)

    @torch.no_grad()
    def _fill_log_probs(self, td: TensorDict, key: str, model) -> None:
        """``td[key]`` = no-grad log-probs of the sampled tokens under ``model``, in eval mode (dropout off, the
        same network the sampler ran), with the loss's processed distribution (temperature, top-k, top-p)."""
        out = torch.zeros_like(td["sample_log_probs"])
        was_training = model.training
        model.eval()
        try:
            for rows, mb in self._micro_batches(td):
                with self._autocast():
                    lp, _ = token_log_probs(model, mb["tokens"].to(self.device), mb["attention_mask"].to(self.device),
                                            temperature=self.loss_fn.temperature,
                                            top_p=self.loss_fn.top_p, top_k=self.loss_fn.top_k,
                                            response_mask=mb["response_mask"].to(self.device))
                T = lp.shape[-1]
                out[torch.tensor(rows), :T] = lp.float().cpu()
        finally:
            model.train(was_training)
        td[key] = out

    def _needs_anchor_recompute(self, multi_update: bool, stale: bool) -> bool:
        """Whether the PPO anchor π_old must be the trainer's own no-grad recompute rather than the sampler's
        behaviour log-probs (``loss.anchor``; see :mod:`torchrl_grpo.loss`). ``auto`` recomputes when the anchor
        would otherwise differ from the first update's π_θ: several updates per batch, a stale batch (async), a
        sampler with other numerics (vLLM bf16, a weight copy), or bf16 autocast in the trainer."""
        mode = self.cfg.loss.anchor
        if mode == "recompute" or multi_update or stale:
            return True
        if mode == "behaviour":
            return False
        exact = bool(getattr(self.backend, "exact_log_probs", False))
        return not exact or self.device.type == "cuda"

    def _update(self, batch: TensorDict, *, stale: bool = False) -> dict[str, float]:
        cfg = self.cfg
        n = batch.shape[0]
        mb_size = min(cfg.train.minibatch_size or n, n)
        multi_update = cfg.train.ppo_epochs > 1 or mb_size < n
        if cfg.loss.kl_coef > 0:
            if self.ref_model is not None:
                self._fill_log_probs(batch, "ref_log_probs", self.ref_model)
            else:  # LoRA: the reference is the base model, i.e. the adapter switched off
                with self.model.disable_adapter():
                    self._fill_log_probs(batch, "ref_log_probs", self.model)
        if self._needs_anchor_recompute(multi_update, stale):
            self._fill_log_probs(batch, "old_log_probs", self.model)
        self.model.train()
        agg_tokens = cfg.loss.aggregation == "token_mean"
        sums: dict[str, float] = {}
        weights: dict[str, float] = {}
        log_sw, log_sw2, ratio_max, ess_tokens = [], [], float("-inf"), 0.0
        n_opt, n_skipped, grad_norms = 0, 0, []
        gen = torch.Generator().manual_seed(cfg.seed * 31 + self.step)
        for _epoch in range(cfg.train.ppo_epochs):
            perm = torch.randperm(n, generator=gen) if multi_update else torch.arange(n)
            for ms in range(0, n, mb_size):
                mini = batch[perm[ms : ms + mb_size]]
                denom = float(mini["response_mask"].sum() if agg_tokens else (mini["response_tokens"] > 0).sum())
                self.optimizer.zero_grad(set_to_none=True)
                finite = True
                for _rows, micro in self._micro_batches(mini):
                    num = float(micro["response_mask"].sum() if agg_tokens else (micro["response_tokens"] > 0).sum())
                    if num == 0:
                        continue
                    micro = micro.to(self.device)
                    with self._autocast():
                        losses = self.loss_fn(micro)
                    loss = total_loss(losses)
                    if not torch.isfinite(loss):
                        finite = False
                        break
                    (loss * (num / max(denom, 1.0))).backward()
                    tok = float(micro["response_mask"].sum())
                    for k, v in losses.items():
                        if k in ("ess", "ratio_max", "ess_log_sum_w", "ess_log_sum_w2", "num_tokens"):
                            continue  # batch-level, accumulated below
                        v = float(v.detach())
                        if math.isfinite(v):
                            sums[k] = sums.get(k, 0.0) + v * tok
                            weights[k] = weights.get(k, 0.0) + tok
                    if tok > 0:
                        log_sw.append(float(losses["ess_log_sum_w"]))
                        log_sw2.append(float(losses["ess_log_sum_w2"]))
                        ratio_max = max(ratio_max, float(losses["ratio_max"]))
                        ess_tokens += tok
                    sums["loss/total"] = sums.get("loss/total", 0.0) + float(loss.detach()) * num / max(denom, 1.0)
                if not finite:
                    self.optimizer.zero_grad(set_to_none=True)
                    n_skipped += 1
                    log.warning("step %d: non-finite loss, minibatch skipped", self.step)
                    continue
                gn = torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad],
                                                    cfg.optimizer.max_grad_norm)
                if not torch.isfinite(gn):
                    self.optimizer.zero_grad(set_to_none=True)
                    n_skipped += 1
                    log.warning("step %d: non-finite gradient norm, minibatch skipped", self.step)
                    continue
                grad_norms.append(float(gn))
                self.optimizer.step()
                n_opt += 1
        self.optimizer_steps += n_opt
        self.model.eval()
        out = {k: sums[k] / weights[k] for k in sums if k in weights and weights[k] > 0}
        if "loss/total" in sums:
            out["loss/total"] = sums["loss/total"] / max(1, n_opt + n_skipped)
        # batch-level importance-weight metrics over every response token of the step (not micro-batch means)
        out["ess"] = combine_ess(log_sw, log_sw2, ess_tokens)
        out["ratio_max"] = ratio_max if log_sw else float("nan")
        out["num_tokens"] = ess_tokens
        out["train/anchor_recomputed"] = float("old_log_probs" in batch.keys())
        out["train/optimizer_steps"] = float(n_opt)
        out["train/skipped_minibatches"] = float(n_skipped)
        if grad_norms:
            out["grad_norm"] = float(np.mean(grad_norms))
        return out

    # ------------------------------------------------------------------ eval / checkpoint / loop
    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy / pass@k / pass^k on the first ``eval.n_problems`` tasks of the valid split, plus the
        do-nothing baseline on the same tasks for envs that define one (``do_nothing_action``, e.g. tau2)."""
        e = self.cfg.eval
        if self._eval_tasks is None:
            self._eval_tasks = usable_task_indices(self.eval_collector._envs(1)[0], e.n_problems)
        n = len(self._eval_tasks)
        out = evaluate(self.eval_collector, task_indices=self._eval_tasks, greedy=e.greedy, pass_k=e.pass_k,
                       temperature=self.cfg.gconfig.temperature or 1.0, max_new_tokens=self.cfg.gconfig.max_new_tokens,
                       step=self.step)
        if self._baseline is None:
            vid, vkw = self._valid_env
            self._baseline = do_nothing_baseline(make_env_fn(vid, **vkw), self._eval_tasks)  # {} without one
        out.update(self._baseline)
        log.info("evaluation at step %d (%d tasks):\n%s", self.step, n, format_eval_table(out))
        return out

    def save(self) -> Path:
        c = self.cfg.checkpoint
        return save_checkpoint(self.run_dir / "checkpoints", self.step, model=self.model, tokenizer=self.tokenizer,
                               optimizer=self.optimizer, scheduler=self.scheduler,
                               config_yaml=OmegaConf.to_yaml(self.cfg, resolve=True), keep_last=c.keep_last,
                               extra={"optimizer_steps": self.optimizer_steps})

    def fit(self) -> dict[str, Any]:
        """Train for ``train.steps`` steps (from the resumed step). Returns the last metrics (and eval).

        SIGINT / SIGTERM stop it cleanly (:mod:`torchrl_grpo.interrupt`): the step in flight is finished and logged,
        a checkpoint of it is written (``checkpoint.on_interrupt``, unless one exists) and the exception re-raised.
        A second signal abandons the step in flight; its half-updated weights are not saved.

        Raises:
            TrainingInterrupted: on SIGINT / SIGTERM (a ``KeyboardInterrupt``; ``exit_code`` 130 / 143).
        """
        from .interrupt import TrainingInterrupted, finish_step, handle_signals

        cfg = self.cfg
        summary: dict[str, Any] = {"load_time_s": self.load_time_s}
        last: dict[str, Any] = {}
        start = step_began = self.step
        bar = None
        with handle_signals():
            try:
                if cfg.eval.at_start and self.step == 0 and cfg.eval.n_problems > 0:
                    ev = self.evaluate()
                    self.logger.log(ev, step=0)
                    summary["eval_start"] = ev
                try:
                    from tqdm.auto import tqdm

                    bar = tqdm(total=cfg.train.steps, initial=self.step, desc="GRPO",
                               disable=not cfg.stats_logger.progress_bar)
                except ImportError:  # pragma: no cover
                    pass
                while self.step < cfg.train.steps:
                    step_began = self.step
                    with finish_step():  # a signal in here lets the step finish (update, log, checkpoint) first
                        last = self.train_step()
                        if (cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.train.steps
                                and cfg.eval.n_problems > 0):
                            last.update(self.evaluate())
                        self.logger.log(last, step=self.step)
                        if bar is not None:
                            bar.update(1)
                            bar.set_postfix({k: f"{last[k]:.3g}" for k in ("reward/mean", "loss/total", "ess")
                                             if isinstance(last.get(k), float)})
                        if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                            summary["checkpoint"] = str(self.save())
                if bar is not None:
                    bar.close()
                if cfg.eval.at_end and cfg.eval.n_problems > 0:
                    ev = self.evaluate()
                    self.logger.log(ev, step=self.step)
                    summary["eval_end"] = ev
                if cfg.checkpoint.save_final and not str(summary.get("checkpoint", "")).endswith(f"step_{self.step:06d}"):
                    summary["checkpoint"] = str(self.save())
            except TrainingInterrupted as e:
                if bar is not None:
                    bar.close()
                # consistent: raised between steps, or after train_step returned (the step counter is its last write)
                completed = not e.mid_step or self.step > step_began
                saved = (self.run_dir / "checkpoints" / f"step_{self.step:06d}").is_dir()
                if cfg.checkpoint.on_interrupt and completed and self.step > start and not saved:
                    log.warning("%s: saved the last completed step to %s", e, self.save())
                elif not completed:
                    log.warning("%s: step %d abandoned, not saved", e, self.step + 1)
                raise
        summary["last"] = last
        return summary

    def close(self) -> None:
        """Flush the logger, close the environments and shut the rollout backend down (a vLLM engine frees its
        memory; the trainer owns its backend, also one passed in)."""
        try:
            self.logger.close()
            self.collector.close()
            self.eval_collector.close()
        finally:
            self.backend.close()
