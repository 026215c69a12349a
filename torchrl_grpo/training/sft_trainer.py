r"""Supervised fine-tuning (SFT) before RL: gold demonstrations, then rounds of rejection-sampling fine-tuning (RFT),
evaluated on the valid/test split, written as a model directory that ``grpo.py actor.path=`` starts from.

The recipe of slime's tau2 cookbook and of the GSM8K guides (SFT -> RFT -> GRPO): RL from a model that can
already act. Data: :mod:`torchrl_grpo.rollout.demonstrations` (gold replays through the RL collector and env, so the
tokens are the ones the policy will later sample; the policy's own successful episodes for RFT).

Objective: the token-mean negative log-likelihood of the assistant tokens,
:class:`torchrl_grpo.objectives.sft_loss.SFTLoss` (formula and source there). The optimizer side is
:class:`torchrl_grpo.training.update.GRPOUpdate` with this loss (micro-batches by token budget, the shared-prefix forward, gradient clipping, non-finite skips), one
optimizer step per minibatch (:func:`sft_update`). The trainer (:class:`SFTTrainer`) is composed from the run's
components, not derived from the GRPO trainer, and runs on the shared loop shell (:mod:`torchrl_grpo.training.loop`).

Checkpoints and resume (the run's ``checkpoint.*``, ``eval.every`` and ``train.resume_from``, as in a GRPO run):
``<run_dir>/checkpoints/step_<n>/`` (:func:`torchrl_grpo.training.checkpoint.save_checkpoint`) every
``checkpoint.every`` optimizer steps, at the end (``checkpoint.save_final``) and on SIGINT / SIGTERM
(``checkpoint.on_interrupt``). Besides the weights, optimizer and RNG it holds where the recipe stands
(``trainer_state.pt`` ``extra["sft"]``: :class:`SFTProgress`), the current phase's LR schedule (``scheduler.pt``)
and, when it stopped inside a phase, that phase's episodes (``sft_phase_data.pt``: an RFT round's episodes were
sampled by a policy that no longer exists). ``train.resume_from`` (:func:`read_sft_resume`) continues with the next
minibatch of that phase, in the same seeded order, under the same schedule, then the rounds after it; a checkpoint
that is not an SFT one is refused before the model loads.
"""
from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from tensordict import TensorDict

from torchrl_grpo.config.choices import SFT_SOURCES  # sft.source, defined once in the config
from torchrl_grpo.objectives.sft_loss import SFTLoss
from torchrl_grpo.rollout.demonstrations import gold_demonstrations, successful_episodes
from torchrl_grpo.training.checkpoint import latest_checkpoint, save_checkpoint
from torchrl_grpo.training.components import Components
from torchrl_grpo.training.evaluator import Evaluator
from torchrl_grpo.training.loop import CheckpointSchedule, EvalSchedule, Progress, draw_learning_curve, run_loop
from torchrl_grpo.training.optimizer import make_scheduler
from torchrl_grpo.training.update import GRPOUpdate

__all__ = ["SFTSettings", "SFTProgress", "SFTTrainer", "SFT_SOURCES", "PHASE_DATA", "read_sft_resume",
           "save_merged_model", "sft_update"]

#: the file of an SFT checkpoint that holds the episodes of the phase it stopped in
PHASE_DATA = "sft_phase_data.pt"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTSettings:
    """What the SFT recipe reads besides the loop's :class:`~torchrl_grpo.training.components.LoopSettings`:
    ``sft.*`` and the ``optimizer.*`` values of each phase's LR schedule (derived from the config by
    :func:`torchrl_grpo.assembly.build_trainer`; choices and ranges checked by the config's validation)."""

    source: str  # sft.source: gold (demonstrations, then RFT rounds) | rft (RFT rounds only)
    epochs: int  # passes over each phase's data
    minibatch_size: int  # episodes per optimizer step
    min_reward: float  # a demonstration / RFT episode is kept when its reward reaches this
    rft_rounds: int
    rft_samples: int  # episodes per train task in each RFT round
    save_model: bool  # <run_dir>/sft_model before the final evaluation
    lr: float  # optimizer.lr: each phase's schedule peaks here
    scheduler: str  # optimizer.scheduler, over the phase's optimizer steps
    warmup_steps: int  # optimizer.warmup_steps, at the start of each phase


@dataclass(frozen=True)
class SFTProgress:
    """Where an SFT run stands: ``round`` -1 before its first phase, 0 the gold phase, ``r >= 1`` RFT round r (the
    policy's successes of ``rft_round(r - 1)``); ``phase_step`` of ``phase_steps`` optimizer steps of that phase done
    (equal: the phase is complete, the next round comes next). Saved in every SFT checkpoint."""

    round: int = -1
    phase_step: int = 0
    phase_steps: int = 0

    @property
    def in_phase(self) -> bool:
        """Stopped inside a phase (its episodes are needed to continue it)."""
        return self.phase_step < self.phase_steps


@dataclass
class _Minibatch:  # one optimizer step: its episodes, the phase's LR schedule, epoch, round (0: gold; r: RFT round r)
    data: TensorDict
    scheduler: Any
    epoch: int
    round: int
    index: int = 0  # this step's number in its phase, 1..total
    total: int = 0  # the phase's optimizer steps


def read_sft_resume(path: str | Path) -> dict[str, Any]:
    """The SFT state of the checkpoint ``train.resume_from`` names (resolved as
    :func:`~torchrl_grpo.training.checkpoint.latest_checkpoint` does: the newest complete one of a run or
    ``checkpoints/`` dir), read before any model loads.

    Returns:
        ``{"path": the checkpoint dir, "step": its step, "progress": SFTProgress, "data": the phase's episodes (a
        TensorDict) when it stopped inside a phase, else None}``.

    Raises:
        FileNotFoundError: no complete checkpoint there, or an SFT checkpoint inside a phase without its
            ``sft_phase_data.pt``.
        ValueError: the checkpoint is not an SFT one (a GRPO checkpoint: start SFT from a model with ``actor.path=``).
    """
    ckpt = latest_checkpoint(path)
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    sft = (state.get("extra") or {}).get("sft")
    if sft is None:
        raise ValueError(f"train.resume_from={path}: {ckpt} is not an SFT checkpoint (no SFT progress in its "
                         f"trainer_state.pt; a GRPO checkpoint?): to fine-tune a model start from it with actor.path=")
    progress = SFTProgress(**sft)
    data = None
    if progress.in_phase:
        if not (ckpt / PHASE_DATA).is_file():
            raise FileNotFoundError(f"{ckpt} stopped inside an SFT phase but has no {PHASE_DATA}")
        data = torch.load(ckpt / PHASE_DATA, weights_only=False)
    return {"path": str(ckpt), "step": int(state["step"]), "progress": progress, "data": data}


def save_merged_model(model: torch.nn.Module, tokenizer, out_dir: str | Path) -> Path:
    """Write ``model`` (LoRA merged into the base weights, HF names) and ``tokenizer`` to ``out_dir`` as one Hugging
    Face model directory: what ``actor.path=`` (:func:`torchrl_grpo.model_store.load_model_and_tokenizer`) loads. The
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


def sft_update(update: GRPOUpdate) -> GRPOUpdate:
    """The optimizer side of the SFT loss: a :class:`~torchrl_grpo.training.update.GRPOUpdate` over
    :class:`SFTLoss` on ``update``'s model and optimizer with its micro-batching (``micro_batch_size``,
    ``max_tokens_per_mb``, shared prefix), autocast, gradient clipping and seed; one epoch, one optimizer step per
    minibatch it is given, no reference model, exact log-probs (no anchor recompute)."""
    u = update
    out = GRPOUpdate(u.model, SFTLoss(u.model), u.optimizer, reference=None, device=u.device, autocast=u.autocast,
                     ppo_epochs=1, minibatch_size=0, micro_batch_size=u.micro_batch_size,
                     max_tokens_per_mb=u.max_tokens_per_mb, max_grad_norm=u.max_grad_norm, anchor="behaviour",
                     exact_log_probs=True, seed=u.seed, shared_prefix=u.shared_prefix)
    out.optimizer_steps = u.optimizer_steps  # a resumed run continues the count (build() restored it)
    return out


class SFTTrainer:
    """SFT (gold demonstrations) and RFT rounds with a GRPO run's components (model, LoRA, backend, collectors,
    logger, evaluation): ``python sft.py``. Not a GRPO trainer: it runs its own steps (optimizer steps of
    :func:`sft_update`) on the same loop shell (:func:`torchrl_grpo.training.loop.run_loop`).

    ``fit()``: evaluate (``eval.at_start``) -> ``sft.epochs`` epochs over the gold demonstrations of the train split
    (``sft.source=gold``) -> ``sft.rft_rounds`` rounds of: sample ``sft.rft_samples`` episodes per train task with
    the policy, keep those with reward ``>= sft.min_reward``, ``sft.epochs`` epochs on them -> ``<run_dir>/sft_model``
    (``sft.save_model``: merged weights + tokenizer; ``grpo.py actor.path=`` that dir; written before the final eval
    so a failed or interrupted eval keeps the training) -> evaluate (``eval.at_end``) -> ``learning_curve.png``.
    ``self.step`` counts optimizer steps (the metrics' x axis). Evaluation also every ``eval.every`` optimizer steps
    and checkpoints every ``checkpoint.every``, at the end (``checkpoint.save_final``) and on SIGINT / SIGTERM
    (``checkpoint.on_interrupt``; the shell's rules: the optimizer step in flight finishes and is logged, saved, then
    the run stops); ``train.resume_from`` continues from a checkpoint (module docstring).

    Built by :func:`torchrl_grpo.assembly.build_trainer` ``(cfg, run_dir, trainer_cls=SFTTrainer)``, which refuses Ray
    rollout workers before anything is built (:func:`torchrl_grpo.config.check_sft_run`) and derives ``settings`` and
    ``update`` from the config and the components.

    Args:
        components: the built :class:`~torchrl_grpo.training.components.Components` (GRPO loss, update, schedule unused).
        settings: :class:`SFTSettings`. update: the SFT update (:func:`sft_update` of ``components.update``).
        resume: :func:`read_sft_resume` of the checkpoint ``components`` were resumed from (``start_step`` > 0),
            else None (``eval_only`` builds resumed components without it: :meth:`fit` refuses them).

    Raises:
        TypeError: ``components`` is not :class:`~torchrl_grpo.training.components.Components`.
        ValueError: torchrun ranks; ``resume`` of another step than ``components.start_step``; from :meth:`fit`:
            components resumed (``start_step`` > 0) without ``resume`` (they can only be evaluated).
            RuntimeError (from :meth:`fit`): no demonstration survives the replay.
    """

    own_backend_copy = False  # build(): the rollout engine may share the model (colocated, synced after each phase)

    def __init__(self, components: Components, *, settings: SFTSettings, update: GRPOUpdate,
                 resume: dict[str, Any] | None = None) -> None:
        if not isinstance(components, Components):
            raise TypeError(f"SFTTrainer takes built Components, got {type(components).__name__}: build it from a "
                            f"config with torchrl_grpo.assembly.build_trainer(cfg, run_dir, trainer_cls=SFTTrainer)")
        c = self.components = components
        if c.dp is not None and c.dp.enabled:
            raise ValueError("sft.py runs in one process (no torchrun / FSDP yet)")
        self.sft, self.update = settings, update
        self.cfg = None  # build_trainer sets the config it built from, for callers; never read here
        self.settings, self.run_dir, self.device, self.load_time_s = c.settings, c.run_dir, c.device, c.load_time_s
        self.model, self.tokenizer, self.backend, self.optimizer = c.model, c.tokenizer, c.backend, c.optimizer
        self.collector, self.train_tasks = c.env_side.collector, c.env_side.train_tasks  # SFT never switches env
        self.logger, self.step = c.logger, c.start_step
        if resume is not None and resume["step"] != self.step:
            raise ValueError(f"SFTTrainer: components start at step {self.step} but the SFT resume state is of step "
                             f"{resume['step']}: pass read_sft_resume() of the checkpoint they were resumed from")
        if c.placement is not None:  # a disjoint CPU plan: this thread trains on the train cores
            c.placement.pin_thread("train")
        self.evaluator = Evaluator(c)
        self._resume = resume
        self.progress = resume["progress"] if resume is not None else SFTProgress()
        self._phase_data: TensorDict | None = None  # the current phase's episodes and LR schedule (checkpoints)
        self._scheduler = None
        if resume is not None:  # resumed into the same run dir: the logs continue from the checkpoint's step
            self.logger.rewind(self.step)

    def evaluate(self) -> dict[str, float]:
        """The run's evaluation at this step (:class:`~torchrl_grpo.training.evaluator.Evaluator`)."""
        return self.evaluator(self.step)

    # ------------------------------------------------------------------ the steps
    def _step(self, mb: _Minibatch) -> dict[str, float]:
        """One optimizer step on one minibatch; its ``sft/*`` metrics (no ESS / ratio: NaN for this loss)."""
        t0 = time.perf_counter()
        lr = mb.scheduler.get_last_lr()[0]  # the rate this optimizer step uses (read before the schedule moves on)
        m = self.update(mb.data, step=self.step)
        mb.scheduler.step()
        self.progress = SFTProgress(mb.round, mb.index, mb.total)
        self.step += 1  # the step's last write (the loop shell's interrupt rule)
        out = {(k if "/" in k else f"sft/{k}"): v for k, v in m.items() if isinstance(v, float) and math.isfinite(v)}
        out.update({"sft/epoch": float(mb.epoch), "sft/round": float(mb.round), "sft/lr": lr,
                    "time/step_s": time.perf_counter() - t0})
        return out

    def _phase(self, data: TensorDict, phase: str, round_: int = 0, start: int = 0) -> Iterator[_Minibatch]:
        """The minibatches of one phase: ``sft.epochs`` epochs over ``data`` (a collector batch), ``sft.minibatch_size``
        episodes each in a seeded order, under a fresh LR schedule that peaks at ``optimizer.lr`` (not at the lr an
        earlier schedule left behind). After the phase's last step the rollout engine gets the fine-tuned weights.
        ``start``: the phase's optimizer steps already taken (a resumed run): their minibatches are skipped, in the
        same seeded order, and the schedule moved on past them."""
        s = self.sft
        data = data.select(*[k for k, v in data.items() if isinstance(v, torch.Tensor)])  # tensor columns only
        n = data.shape[0]
        mb = min(s.minibatch_size, n)
        per_epoch = -(-n // mb)
        total = per_epoch * s.epochs
        for g in self.optimizer.param_groups:  # LambdaLR's base
            g["initial_lr"] = s.lr
        scheduler = make_scheduler(self.optimizer, s.scheduler, s.warmup_steps, total)
        with warnings.catch_warnings():  # a resumed phase: the schedule at its step `start` (no optimizer step here)
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            for _ in range(start):
                scheduler.step()
        self._phase_data, self._scheduler = data, scheduler
        gen = torch.Generator().manual_seed(self.settings.seed * 7919 + round_)
        log.info("%s phase: %d episodes, %d optimizer steps%s", phase, n, total,
                 f" (resumed after {start})" if start else "")
        for epoch in range(s.epochs):
            perm = torch.randperm(n, generator=gen)
            for k in range(per_epoch):
                index = epoch * per_epoch + k + 1
                if index > start:
                    yield _Minibatch(data[perm[k * mb:(k + 1) * mb]], scheduler, epoch, round_, index, total)
        self._phase_data = None
        self.collector.update_policy_weights_(self.model)  # the rollout engine samples the fine-tuned policy

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
        # logged at the first optimizer step on its episodes: after a checkpoint of the step before (a resume from
        # that checkpoint repeats the round; its row is cut with the rest of the rows after the checkpoint)
        self.logger.log(stats, step=self.step + 1)
        log.info("RFT round %d: %d of %d episodes kept", round_, int(stats["rft/kept"]), batch.shape[0])
        return kept

    def _recipe(self, summary: dict[str, Any]) -> Iterator[_Minibatch]:
        """Every minibatch of the run: the gold phase, then each RFT round's (data gathered between steps). A resumed
        run skips the phases its checkpoint completed and continues the one it stopped in from the saved episodes
        (``summary`` then lists this run's rounds only)."""
        s = self.sft
        at = self._resume["progress"] if self._resume is not None else SFTProgress()
        saved = self._resume["data"] if self._resume is not None else None
        if s.source == "gold" and at.round <= 0:
            if at.round == 0:  # stopped inside the gold phase (a complete one is round 0 with nothing left)
                if at.in_phase:
                    yield from self._phase(saved, "gold", start=at.phase_step)
            else:
                data, stats = gold_demonstrations(self.collector, self.train_tasks, min_reward=s.min_reward,
                                                  progress=self.settings.progress_bar)
                summary["demonstrations"] = stats
                self.logger.log(stats, step=self.step)
                if data is None:
                    raise RuntimeError(f"no gold demonstration of the {len(self.train_tasks)} train tasks scored >= "
                                       f"{s.min_reward} when replayed (demo/reward_mean "
                                       f"{stats['demo/reward_mean']:.3f})")
                yield from self._phase(data, "gold")
        summary["rft"] = []
        for r in range(s.rft_rounds):
            if r + 1 < at.round:  # done before the checkpoint
                continue
            if r + 1 == at.round:  # the round the checkpoint stopped in (or completed)
                if at.in_phase:
                    yield from self._phase(saved, "rft", round_=r + 1, start=at.phase_step)
                continue
            kept = self.rft_round(r)
            summary["rft"].append(0 if kept is None else int(kept.shape[0]))
            if kept is not None:
                yield from self._phase(kept, "rft", round_=r + 1)

    # ------------------------------------------------------------------ the run
    def fit(self) -> dict[str, Any]:
        """Run the recipe (class docstring). Returns ``eval_start`` / ``eval_end`` metrics, the demonstration and RFT
        stats (``demonstrations``, ``rft``: episodes kept per round), the last step's metrics (``last``), the
        ``model_dir`` written and ``learning_curve``.

        Raises:
            RuntimeError: no gold demonstration scores ``>= sft.min_reward``.
            TrainingInterrupted: on SIGINT / SIGTERM (:mod:`torchrl_grpo.training.interrupt`).
        """
        st = self.settings
        if self.step and self._resume is None:  # weights resumed without the recipe's state (eval_only's build)
            raise ValueError(f"SFTTrainer.fit: the components were resumed at step {self.step} without the SFT "
                             f"state (read_sft_resume; build_trainer passes it unless eval_only): evaluate only")
        (self.run_dir / "config.yaml").write_text(st.config_yaml)  # the resolved config of this run
        ev = st.eval_n_problems > 0
        summary: dict[str, Any] = {"load_time_s": self.load_time_s}
        if self._resume is not None:
            summary["resumed_from"] = self._resume["path"]
        return run_loop(self._step, self._recipe(summary), position=lambda: self.step, logger=self.logger,
                        evaluation=EvalSchedule(lambda: self.evaluate(), at_start=ev and st.eval_at_start
                                                and self._resume is None, every=st.eval_every if ev else 0,
                                                at_end=ev and st.eval_at_end),
                        checkpoints=CheckpointSchedule(self.save, every=st.checkpoint_every,
                                                       at_end=st.checkpoint_save_final,
                                                       on_interrupt=st.checkpoint_on_interrupt,
                                                       exists=lambda: self._checkpoint_dir().is_dir()),
                        on_end=self._save_model if self.sft.save_model else None,
                        progress=Progress("SFT", st.progress_bar, ("sft/nll",)),
                        learning_curve=lambda: draw_learning_curve(self.logger, self.run_dir, self.step,
                                                                   self.evaluator.n_tasks),
                        summary=summary, log=log)

    def save(self) -> Path:
        """Checkpoint ``<run_dir>/checkpoints/step_<step>/`` (module docstring): weights, optimizer, the current
        phase's LR schedule, RNG, config, ``extra`` = ``optimizer_steps`` and ``sft`` (:class:`SFTProgress`), and the
        phase's episodes when inside one (``sft_phase_data.pt``). Returns its path."""
        p = self.progress
        payload = {PHASE_DATA: self._phase_data} if p.in_phase and self._phase_data is not None else None
        return save_checkpoint(self.run_dir / "checkpoints", self.step, model=self.model, tokenizer=self.tokenizer,
                               optimizer=self.optimizer, scheduler=self._scheduler,
                               config_yaml=self.settings.config_yaml, keep_last=self.settings.checkpoint_keep_last,
                               extra={"optimizer_steps": getattr(self.update, "optimizer_steps", self.step),
                                      "sft": asdict(p)},
                               payload=payload)

    def _checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints" / f"step_{self.step:06d}"

    def _save_model(self) -> dict[str, str]:
        """``<run_dir>/sft_model`` (:func:`save_merged_model`), before the final evaluation."""
        out = str(save_merged_model(self.model, self.tokenizer, self.run_dir / "sft_model"))
        log.info("fine-tuned model written to %s: python grpo.py actor.path=%s ...", out, out)
        return {"model_dir": out}

    def close(self) -> None:
        """Flush the logger, close the environments and shut the rollout backend down."""
        self.components.close()
