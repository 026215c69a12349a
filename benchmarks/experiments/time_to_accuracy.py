#!/usr/bin/env python
"""Time-to-accuracy: our GRPO trainer vs TRL's ``GRPOTrainer`` on the default task, several seeds (issue 26 s.3).

    R=outputs/time_to_accuracy
    python benchmarks/experiments/time_to_accuracy.py base --out-root $R                   # step 0 of every run (once)
    python benchmarks/experiments/time_to_accuracy.py run --arm ours --seed 1 --out-root $R
    python benchmarks/experiments/time_to_accuracy.py run --arm trl  --seed 1 --out-root $R
    python benchmarks/experiments/time_to_accuracy.py run --arm trl_same_mb --seed 1 --out-root $R   # optional
    ...                                                                        # seeds 2, 3; arms interleaved
    python benchmarks/experiments/time_to_accuracy.py summary $R --write benchmarks/results/time_to_accuracy

Like a training benchmark (MLPerf Training's time-to-train): each run trains on the default task of ``python grpo.py``
(``configs/grpo_reasoning.yaml``: ReasoningGym-v1 ``chain_sum``, 2 terms of 1-2 digits, SmolLM2-135M-Instruct full
fine-tuning in fp32) and is scored by held-out greedy accuracy (the 200 test problems) every ``--eval-every`` steps.
The figure of merit is the **training wall-clock time to the first evaluation at or above ``--target``** and the
accuracy each run has reached at equal training time.

The target is fixed before any run: halfway from the base model's greedy accuracy (0.195) to the mean of our
three final accuracies of ``results/default_run.md`` (0.527), i.e. 0.195 + (0.527 - 0.195) / 2 = 0.361 -> **0.36**.

The two arms share everything but the trainer:

* **task, prompts and reward**: the rows are ``ReasoningGym-v1``'s own opening messages (:func:`envs.adapters.trl_env.dataset`),
  the reward is the env's own grader (:func:`envs.adapters.trl_env.reward_function`), the same train problems in the same order at
  a given seed (:func:`harness.trl_prompt_order`: our trainer's seeded epoch permutation);
* **budget**: 16 steps x 8 prompts x 8 samples (group size 8), 48 new tokens, temperature 1 (no top-p/top-k), lr 1e-5
  constant, AdamW (TRL ``adamw_torch``; ours fused AdamW, same betas/eps), grad-norm clip 1, fp32, no KL, clip
  0.2 / 0.28, token-mean loss (TRL ``loss_type="dapo"``), group-normalised advantages, one optimizer step per step in
  micro-batches of 4 sequences, full fine-tuning;
* **evaluation**: the same code scores both: ours with its in-run greedy evaluation (``eval.every``), TRL's model
  saved every ``--eval-every`` steps (``save_only_model``) and scored afterwards by ``grpo.py eval_only=true
  actor.path=<checkpoint>``; step 0 is the base model's evaluation (``base``), the same for both arms.

What differs is what each system is: our embedded transformers backend for rollouts vs TRL's HF ``generate``
(``use_vllm=False``), and each one's update.

**Clock.** Training time only, the same definition for both: the sum of the per-step wall times (rollout + update +
weight sync), excluding model loading, evaluation and checkpoint saving. Ours: the trainer's ``time/step_s``
(``torchrl_grpo.training.grpo_trainer.GRPOTrainer.train_step``); TRL: ``on_step_begin`` -> ``on_step_end`` of a
``TrainerCallback`` (the generation of a step happens inside it; saving runs after ``on_step_end``). The whole
process wall time of each run is recorded beside it.

``summary``: per run, time to target (minutes) and the accuracy at each evaluation; per arm, the median and range
over seeds; the ratio TRL / ours of the median times to target; accuracy at equal training time ``T`` (each run's
last evaluation at or before ``T`` = the smallest final training clock over all runs); Wilson 95% intervals (Wilson
1927) for every accuracy; the PNG: accuracy vs training minutes, one line per run, both arms.

**Device** (issue 35): ``--device auto|cpu|cuda`` (auto: cuda when available) and ``--dtype float32|bfloat16`` put
both arms, the base evaluation and the scoring of TRL's checkpoints on one device with one weights' dtype (ours
``train.device`` / ``actor.dtype``; TRL the model loaded there, ``use_cpu`` only on CPU, bf16 autocast on CUDA as
ours: :func:`harness.precision`); both are part of the budget, so ``summary`` refuses to mix devices, and every
``result.json`` records the device name, dtype, versions, load and command (:func:`harness.instrument_meta`). A
``--model`` given as a ``.gguf`` file is converted once to a cached HF directory that both arms load
(:func:`harness.same_weights`).

**The same micro-batch budget** (arm ``trl_same_mb``): TRL's ``per_device_train_batch_size`` /
``gradient_accumulation_steps`` chosen so that it runs a step's sequences in as many forward/backward passes as our
trainer does (:func:`our_passes`), so that a step-time ratio measures the two systems rather than a micro-batch
setting. ``--micro-batch 0`` lets our arm use its config's own micro-batching (``train.micro_batch_size`` and the
``train.max_tokens_per_mb`` token budget, ``auto`` by default: one pass per step on CUDA when it fits) instead of
``--micro-batch`` sequences per pass; the ``trl`` arm then runs ``--trl-micro-batch`` sequences per pass (default 4,
the identical-settings value of the earlier results), and ``trl_same_mb`` is the like-for-like pairing.

Run one process at a time on an idle machine (``uptime``; two OpenMP processes on 2 cores collapse decode speed);
interleave the arms (ours 1, trl 1, ours 2, ...) so a drift of the machine hits both.

Running, metrics, metadata and outputs come from :mod:`harness` (this folder).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from harness import (REPO, add_device_args, evaluations, git_commit, instrument_meta, load_json, package_versions,
                     precision, pyplot, read_metrics, resolve_device, run_logged, same_weights, trl_prompt_order,
                     utc_date, write_outputs)

from torchrl_grpo.reporting.learning_curve import wilson_interval

#: fixed before the runs (module docstring): halfway from base 0.195 to our 3-seed final mean 0.527
TARGET = 0.36
#: the task of configs/grpo_reasoning.yaml, as gym.make kwargs (TRL's rows and reward function)
TASK = {"task": "chain_sum", "task_config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
        "train_seed": 11, "test_seed": 22, "train_size": 1000, "test_size": 200}
#: the budget both arms train with (recorded in every result; ``summary`` refuses to mix budgets)
BUDGET_KEYS = ("model", "steps", "prompts", "samples", "max_new_tokens", "lr", "micro_batch", "eval_every", "n_eval",
               "device", "dtype")
#: the arms: ours, TRL at identical settings, TRL with our trainer's number of forward/backward passes per step
ARMS = ("ours", "trl", "trl_same_mb")


def _budget(a) -> dict:
    return {k: getattr(a, k) for k in BUDGET_KEYS}


def _meta(a) -> dict:
    return {**instrument_meta(a.device, a.dtype), "commit": git_commit(), "command": " ".join([sys.executable, *sys.argv]),
            "versions": package_versions(("torch", "transformers", "trl", "accelerate", "reasoning-gym")),
            "date": utc_date(), "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}


def _grpo(a, overrides: list[str], run_dir: Path, log: Path) -> float:
    """``python grpo.py`` (the default config) with ``overrides`` into ``run_dir``; returns wall seconds."""
    common = [f"actor.path={a.model_path}", f"actor.dtype={a.dtype}", f"train.device={a.device}",
              f"gconfig.max_new_tokens={a.max_new_tokens}", f"eval.n_problems={a.n_eval}",
              "eval.greedy=true", "checkpoint.every=0", "checkpoint.save_final=false",
              "stats_logger.progress_bar=false", "stats_logger.wandb.mode=disabled"]
    cmd = [sys.executable, str(REPO / "grpo.py"), *common, *overrides, f"hydra.run.dir={run_dir}"]
    return run_logged(cmd, log)


def cmd_base(a) -> dict:
    d = Path(a.out_root) / "base"
    d.mkdir(parents=True, exist_ok=True)
    meta = _meta(a)
    wall = _grpo(a, ["eval_only=true", "seed=1"], d, d / "run.log")
    ev = evaluations(read_metrics(d))
    if not ev:
        raise RuntimeError(f"{d}: no evaluation in metrics.jsonl")
    res = {"arm": "base", "budget": _budget(a), "eval": {**ev[-1], "step": 0}, "wall_s": wall, **meta}
    (d / "result.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res["eval"]))
    return res


def _ours_overrides(a) -> list[str]:
    """Our arm's ``grpo.py`` overrides beyond :func:`_grpo`'s (``--micro-batch 0``: the config's own micro-batching)."""
    return [f"seed={a.seed}", f"train.steps={a.steps}", f"train.batch_size={a.prompts}", f"gconfig.n_samples={a.samples}",
            f"optimizer.lr={a.lr}", *([f"train.micro_batch_size={a.micro_batch}"] if a.micro_batch else []),
            "gconfig.temperature=1.0", "gconfig.top_p=1.0", "loss.kl_coef=0.0", "loss.aggregation=token_mean",
            "loss.adv_scale=group", "loss.clip_eps_low=0.2", "loss.clip_eps_high=0.28", "optimizer.max_grad_norm=1.0",
            f"eval.every={a.eval_every}", "eval.at_start=false", "eval.at_end=true"]


#: metrics keys under which our trainer may log its forward/backward passes of a step (read when present)
PASSES_KEYS = ("train/micro_batches", "train/micro_batches_per_step")


def our_passes(a, max_prompt_tokens: int, out_root: Path | None = None) -> dict:
    """Forward/backward passes our trainer runs per step at this budget: ``{"passes", "source", ...}``.

    Measured when our run of this seed under ``out_root`` logged them (:data:`PASSES_KEYS`; the median over its
    steps); otherwise computed from our composed config (``configs/grpo_reasoning.yaml`` + our arm's overrides):
    :func:`torchrl_grpo.training.micro_batch.split_micro_batches` over the step's ``prompts x samples`` sequences, each
    at the worst-case length ``max_prompt_tokens + max_new_tokens``, with ``train.micro_batch_size`` sequences per
    pass (<= 0: all) and the token budget ``train.micro_batch_tokens`` when the config has that key, else
    ``train.max_tokens_per_mb``: an int > 0 caps each pass's padded tokens; ``auto`` (one pass when the step fits the
    activation allowance: on CUDA half the free memory, always the case for this task's ~150-token episodes of a
    135M model) and 0 add no cap. Worst-case lengths make an int budget's count an upper bound of the passes; on CPU
    ``auto`` may run more passes than counted here (its allowance is a fixed 4 GiB), so TRL then gets fewer.
    """
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from torchrl_grpo.config import register_configs
    from torchrl_grpo.training.micro_batch import split_micro_batches

    per_step = a.prompts * a.samples
    res = Path(out_root or a.out_root) / "ours" / f"seed{a.seed}" / "result.json"
    if res.is_file():
        measured = [s["passes"] for s in json.loads(res.read_text()).get("steps", []) if s.get("passes")]
        if measured:
            return {"passes": int(round(statistics.median(measured))), "source": f"measured ({res})"}
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="grpo_reasoning", overrides=[
            f"actor.dtype={a.dtype}", f"train.device={a.device}", f"gconfig.max_new_tokens={a.max_new_tokens}",
            *_ours_overrides(a)])
    count = int(cfg.train.micro_batch_size)
    tokens = OmegaConf.select(cfg, "train.micro_batch_tokens", default=None)
    key = "train.micro_batch_tokens"
    if tokens is None:
        tokens, key = OmegaConf.select(cfg, "train.max_tokens_per_mb", default=0), "train.max_tokens_per_mb"
    budget = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else 0
    length = max_prompt_tokens + a.max_new_tokens
    mbs = split_micro_batches([length] * per_step, count if count > 0 else per_step, budget)
    return {"passes": len(mbs), "source": "config", "micro_batch_size": count, "token_key": key,
            "token_budget": tokens, "worst_case_tokens": length}


def trl_micro_batch(per_step: int, passes: int) -> int:
    """TRL's ``per_device_train_batch_size`` for ``passes`` passes over ``per_step`` sequences: the smallest divisor of
    ``per_step`` that is >= ``per_step / passes`` (TRL needs whole micro-batches), so TRL runs at most ``passes``.

    Raises:
        ValueError: ``per_step < 1`` or ``passes < 1``.
    """
    if per_step < 1 or passes < 1:
        raise ValueError(f"per_step and passes must be >= 1, got {per_step}, {passes}")
    need = -(-per_step // passes)
    return min(d for d in range(need, per_step + 1) if per_step % d == 0)


def _ours(a, d: Path) -> dict:
    over = _ours_overrides(a)
    wall = _grpo(a, over, d, d / "run.log")
    rows = read_metrics(d)
    clock, steps = 0.0, []
    for r in rows:
        if "time/step_s" in r:
            clock += float(r["time/step_s"])
            passes = next((r[k] for k in PASSES_KEYS if k in r), None)
            steps.append({"step": int(r["step"]), "step_s": float(r["time/step_s"]), "clock_s": clock,
                          "reward": float(r["reward/mean"]), "response_tokens": r.get("episode/response_tokens"),
                          "passes": passes})
    clock_at = {s["step"]: s["clock_s"] for s in steps}
    evals = [{**e, "clock_s": clock_at[e["step"]]} for e in evaluations(rows) if e["step"] in clock_at]
    return {"steps": steps, "evals": evals, "wall_s": wall, "overrides": over}


def _trl(a, d: Path, same_mb: bool = False) -> dict:
    import gymnasium as gym
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import envs
    from envs.adapters.trl_env import dataset, reward_function
    from torchrl_grpo.model_store import load_model_and_tokenizer

    t_start = time.time()
    torch.manual_seed(a.seed)
    gym.register_envs(envs)
    per_step = a.prompts * a.samples
    full = dataset("ReasoningGym-v1", "train", **TASK)
    order = trl_prompt_order(a.seed, len(full), a.steps * a.prompts)
    ds = full.select(order)
    reward = reward_function("ReasoningGym-v1", split="train", **TASK)
    model, tok = load_model_and_tokenizer(a.model_path, dtype=a.dtype, device=a.device)
    passes = None
    if same_mb:
        longest = max(len(tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"]) for row in ds)
        passes = our_passes(a, longest)
        micro = trl_micro_batch(per_step, passes["passes"])
        print(f"[trl_same_mb] our passes per step {passes}: TRL micro-batch {micro} x {per_step // micro}", flush=True)
    else:
        micro = a.micro_batch if a.micro_batch >= 1 else a.trl_micro_batch
        if micro < 1 or per_step % micro:
            raise SystemExit(f"TRL's micro-batch {micro} (--micro-batch, or --trl-micro-batch when it is 0) must be >= 1 "
                             f"and divide prompts x samples = {per_step}")
    prec = precision(a.device, a.dtype)
    out_dir = d / "trl"
    targs = GRPOConfig(
        output_dir=str(out_dir), seed=a.seed, data_seed=a.seed,
        per_device_train_batch_size=micro, gradient_accumulation_steps=per_step // micro,
        num_generations=a.samples, max_completion_length=a.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, num_iterations=1, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group",
        max_steps=a.steps, shuffle_dataset=False, use_vllm=False, bf16=prec["trl_bf16"], fp16=False,
        gradient_checkpointing=False, use_cpu=a.device == "cpu", report_to="none", save_strategy="steps", save_steps=a.eval_every,
        save_only_model=True, eval_strategy="no", logging_steps=1, disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=targs, train_dataset=ds, processing_class=tok)
    steps: list[dict] = []
    clock = {"t0": 0.0, "sum": 0.0}

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            clock["t0"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            dt = time.perf_counter() - clock["t0"]
            clock["sum"] += dt
            steps.append({"step": int(state.global_step), "step_s": dt, "clock_s": clock["sum"]})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs and steps and steps[-1]["step"] == state.global_step:
                steps[-1].update(reward=float(logs["reward"]), response_tokens=logs.get("completions/mean_length"))
                print(f"[trl] step {state.global_step}: reward {logs['reward']:.3f} step {steps[-1]['step_s']:.1f} s",
                      flush=True)

    trainer.add_callback(Clock())
    trainer.train()
    if len(steps) != a.steps:
        raise RuntimeError(f"TRL ran {len(steps)} steps, expected {a.steps}")
    del trainer, model
    train_wall = time.time() - t_start
    clock_at = {s["step"]: s["clock_s"] for s in steps}
    evals = []
    for ck in sorted(out_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])):
        step = int(ck.name.split("-")[1])
        ev_dir = d / f"eval_step{step}"
        _grpo(a, [f"actor.path={ck}", "eval_only=true", f"seed={a.seed}"], ev_dir, d / "run.log")
        ev = evaluations(read_metrics(ev_dir))
        if not ev:
            raise RuntimeError(f"{ev_dir}: no evaluation")
        evals.append({**ev[-1], "step": step, "clock_s": clock_at[step]})
        shutil.rmtree(ck)  # 0.5 GB each; the accuracy is what is kept
    return {"steps": steps, "evals": evals, "wall_s": time.time() - t_start, "train_process_s": train_wall,
            "our_passes": passes, "trl_args": {k: str(getattr(targs, k)) for k in (
                "per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
                "num_generations", "max_completion_length", "temperature", "top_p", "top_k", "learning_rate",
                "lr_scheduler_type", "beta", "num_iterations", "epsilon", "epsilon_high", "loss_type",
                "scale_rewards", "bf16", "use_vllm", "optim", "seed")}}


def cmd_run(a) -> dict:
    d = Path(a.out_root) / a.arm / f"seed{a.seed}"
    d.mkdir(parents=True, exist_ok=True)
    meta = _meta(a)
    out = _ours(a, d) if a.arm == "ours" else _trl(a, d, same_mb=a.arm == "trl_same_mb")
    res = {"arm": a.arm, "seed": a.seed, "budget": _budget(a), **out, **meta, "loadavg_end": os.getloadavg()}
    (d / "result.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({"arm": a.arm, "seed": a.seed, "evals": [(e["step"], e["accuracy"]) for e in res["evals"]],
                      "train_min": round(out["steps"][-1]["clock_s"] / 60, 2), "wall_s": round(res["wall_s"])}))
    return res


# ------------------------------------------------------------------------------------------------ summary
def time_to_target(evals: list[dict], target: float) -> float | None:
    """Training seconds at the first evaluation with accuracy >= ``target`` (``None``: never reached)."""
    for e in sorted(evals, key=lambda e: e["clock_s"]):
        if e["accuracy"] >= target:
            return e["clock_s"]
    return None


def accuracy_at(evals: list[dict], t: float) -> dict:
    """The last evaluation at or before training time ``t`` (step 0, clock 0, is always one)."""
    return max((e for e in evals if e["clock_s"] <= t + 1e-9), key=lambda e: e["clock_s"])


def load(root: Path) -> tuple[dict, list[dict]]:
    base_p = root / "base" / "result.json"
    if not base_p.is_file():
        raise SystemExit(f"no {base_p}: run `base` first")
    base = json.loads(base_p.read_text())
    runs = load_json(sorted(root.glob("*/seed*/result.json")))
    if not runs:
        raise SystemExit(f"no <arm>/seed*/result.json under {root}")
    budgets = {json.dumps(r["budget"], sort_keys=True) for r in [base, *runs]}
    if len(budgets) != 1:
        raise SystemExit(f"results under {root} were run with different budgets: {sorted(budgets)}")
    b = base["eval"]
    for r in runs:
        r["evals"] = [{**b, "step": 0, "clock_s": 0.0}] + [e for e in r["evals"] if e["step"] > 0]
    return base, runs


def _median_range(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else {}


def summarise(root: Path, target: float) -> dict:
    base, runs = load(Path(root))
    t_eq = min(r["evals"][-1]["clock_s"] for r in runs)
    rows = []
    for r in runs:
        ttt = time_to_target(r["evals"], target)
        at = accuracy_at(r["evals"], t_eq)
        fin = r["evals"][-1]
        rows.append({"arm": r["arm"], "seed": r["seed"], "time_to_target_min": None if ttt is None else ttt / 60,
                     "step_s_median": statistics.median(s["step_s"] for s in r["steps"]),
                     "train_min": r["steps"][-1]["clock_s"] / 60, "wall_min": r["wall_s"] / 60,
                     "final": fin["accuracy"], "final_ci": wilson_interval(fin["accuracy"], fin["n"]),
                     "at_equal_time": at["accuracy"], "at_equal_time_step": at["step"],
                     "evals": [(e["step"], round(e["clock_s"] / 60, 3), e["accuracy"]) for e in r["evals"]],
                     "load": [r["loadavg_start"][0], r["loadavg_end"][0]],
                     "device": r.get("device_name", r.get("device", "cpu (not recorded)")), "dtype": r.get("dtype")})
    arms = {}
    for arm in ARMS:
        xs = [x for x in rows if x["arm"] == arm]
        if not xs and arm != "ours":
            continue
        reached = [x["time_to_target_min"] for x in xs if x["time_to_target_min"] is not None]
        arms[arm] = {"runs": len(xs), "reached": len(reached), "time_to_target_min": _median_range(reached),
                     "step_s": _median_range([x["step_s_median"] for x in xs]),
                     "final": _median_range([x["final"] for x in xs]),
                     "at_equal_time": _median_range([x["at_equal_time"] for x in xs]),
                     "train_min": _median_range([x["train_min"] for x in xs])}
    ratios, step_ratios = {}, {}
    o = arms["ours"]
    for arm in ARMS[1:]:
        t = arms.get(arm)
        if t is None:
            continue
        ratios[arm] = (t["time_to_target_min"]["median"] / o["time_to_target_min"]["median"]
                       if o["reached"] and t["reached"] and o["time_to_target_min"]["median"] > 0 else None)
        step_ratios[arm] = (t["step_s"]["median"] / o["step_s"]["median"]
                            if o["step_s"] and t["step_s"] and o["step_s"]["median"] > 0 else None)
    return {"target": target, "base": base["eval"], "equal_time_min": t_eq / 60, "runs": rows, "arms": arms,
            "ratio_trl_over_ours": ratios.get("trl"), "ratios_time_to_target": ratios, "ratios_step_s": step_ratios,
            "budget": base["budget"], "device": base.get("device_name", base.get("device"))}


def _mr(d: dict, fmt: str = "{:.2f}") -> str:
    if not d:
        return "-"
    return f"{fmt.format(d['median'])} [{fmt.format(d['min'])}, {fmt.format(d['max'])}]"


def to_markdown(s: dict) -> str:
    b = s["base"]
    lo, hi = wilson_interval(b["accuracy"], b["n"])
    out = [f"Target accuracy {s['target']:.2f} (fixed before the runs); base {b['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] "
           f"on {b['n']} held-out problems; equal training time T = {s['equal_time_min']:.2f} min; device "
           f"{s.get('device') or 'cpu (not recorded)'}.\n",
           "| arm | seed | device | time to target (train min) | median step (s) | train min, all steps | accuracy at T | "
           "final [Wilson 95%] | evals (step, train min, acc.) | load start/end |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for x in s["runs"]:
        ttt = "not reached" if x["time_to_target_min"] is None else f"{x['time_to_target_min']:.2f}"
        ev = "; ".join(f"{st}: {m:.1f} → {acc:.3f}" for st, m, acc in x["evals"])
        out.append(f"| {x['arm']} | {x['seed']} | {x['device']} | {ttt} | {x['step_s_median']:.1f} | {x['train_min']:.2f} | "
                   f"{x['at_equal_time']:.3f} (step {x['at_equal_time_step']}) | {x['final']:.3f} "
                   f"[{x['final_ci'][0]:.3f}, {x['final_ci'][1]:.3f}] | {ev} | {x['load'][0]:.2f} / {x['load'][1]:.2f} |")
    out += ["", "| arm | runs reaching target | time to target, median [range] (min) | step (s) | accuracy at T | "
            "final accuracy |", "|---|---|---|---|---|---|"]
    for arm, v in s["arms"].items():
        out.append(f"| {arm} | {v['reached']}/{v['runs']} | {_mr(v['time_to_target_min'])} | {_mr(v['step_s'], '{:.1f}')} "
                   f"| {_mr(v['at_equal_time'], '{:.3f}')} | {_mr(v['final'], '{:.3f}')} |")
    for arm, r in s.get("ratios_time_to_target", {"trl": s["ratio_trl_over_ours"]}).items():
        st = s.get("ratios_step_s", {}).get(arm)
        out.append(f"\nTime to target, {arm} / ours (medians): "
                   + ("n/a (an arm never reached it)" if r is None else f"**{r:.2f}x**")
                   + ("" if st is None else f"; median step time {arm} / ours: **{st:.2f}x**"))
    return "\n".join(out) + "\n"


def plot(s: dict, root: Path, png: Path) -> Path:
    plt = pyplot()
    _, runs = load(Path(root))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = {"ours": "tab:blue", "trl": "tab:orange", "trl_same_mb": "tab:green"}
    for r in runs:
        xs = [e["clock_s"] / 60 for e in r["evals"]]
        ys = [e["accuracy"] for e in r["evals"]]
        ax.plot(xs, ys, marker="o", color=colors.get(r["arm"]), alpha=0.8,
                label=f"{r['arm']} seed {r['seed']}", linestyle=["-", "--", ":"][(r["seed"] - 1) % 3])
    ax.axhline(s["target"], color="grey", linestyle="--", linewidth=1, label=f"target {s['target']:.2f}")
    ax.set(xlabel=f"training wall-clock (minutes on {s.get('device') or 'CPU'}; evaluation and saving excluded)",
           ylabel="greedy accuracy, 200 held-out problems",
           title="chain_sum, SmolLM2-135M: ours vs TRL GRPOTrainer")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def cmd_summary(a) -> None:
    s = summarise(Path(a.root), a.target)
    md = to_markdown(s)
    print(md)
    if a.write:
        write_outputs(a.write, md, s, lambda png: plot(s, Path(a.root), png))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("base", "run"):
        q = sub.add_parser(name)
        q.add_argument("--out-root", required=True)
        q.add_argument("--model", default="smollm2-135m-instruct")
        q.add_argument("--steps", type=int, default=16)
        q.add_argument("--prompts", type=int, default=8)
        q.add_argument("--samples", type=int, default=8)
        q.add_argument("--max-new-tokens", type=int, default=48)
        q.add_argument("--lr", type=float, default=1e-5)
        q.add_argument("--micro-batch", type=int, default=4,
                       help="sequences per forward/backward of both arms (0: our config's own micro-batching; pairs "
                            "with arm trl_same_mb)")
        q.add_argument("--eval-every", type=int, default=4)
        q.add_argument("--n-eval", type=int, default=200)
        add_device_args(q)
        if name == "run":
            q.add_argument("--arm", required=True, choices=ARMS)
            q.add_argument("--trl-micro-batch", type=int, default=4,
                           help="the trl arm's sequences per pass when --micro-batch is 0 (recorded in trl_args)")
            q.add_argument("--seed", type=int, required=True)
    q = sub.add_parser("summary")
    q.add_argument("root")
    q.add_argument("--target", type=float, default=TARGET)
    q.add_argument("--write", default="", help="output stem: STEM.md, STEM.json, STEM.png")
    a = p.parse_args(argv)
    if a.cmd != "summary":
        a.device = resolve_device(a.device)
        a.model_path = same_weights(a.model)  # a .gguf: converted once, both arms load that HF directory
    {"base": cmd_base, "run": cmd_run, "summary": cmd_summary}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
