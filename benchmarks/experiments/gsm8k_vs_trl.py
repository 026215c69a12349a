#!/usr/bin/env python
"""GSM8K learning evidence measured like a paper table: ours vs TRL's ``GRPOTrainer`` at one budget, several seeds
(issue 14 section 1; section 3 runs the same script on a GPU at a larger budget).

    R=outputs/gsm8k_vs_trl
    # 1. the base model's greedy accuracy on the fixed test problems: the "before" of every run (computed once)
    python benchmarks/experiments/gsm8k_vs_trl.py base --out-root $R
    # 2. one run per (arm, seed), each into $R/<arm>/seed<N>/ (result.json, run.log, the run's own files)
    python benchmarks/experiments/gsm8k_vs_trl.py run --arm ours --seed 1 --out-root $R
    python benchmarks/experiments/gsm8k_vs_trl.py run --arm trl  --seed 1 --out-root $R
    # 3. the table (markdown + json) and the learning-curve PNG
    python benchmarks/experiments/gsm8k_vs_trl.py summary $R --write benchmarks/results/gsm8k_vs_trl

Every subcommand takes the same budget flags (defaults: the shipped Qwen recipe of ``results/gsm8k_seeds.md``:
Qwen2.5-Coder-0.5B-Instruct, LoRA r=32 / alpha 64 on all linear layers, lr 2e-5 constant, 10 steps x 2 prompts x 8
samples, 256 new tokens, temperature 1.0, micro-batches of 4, correctness-only reward, greedy eval on the first 250
GSM8K test problems); each run records its budget and ``summary`` refuses to put different budgets in one table.

The two arms share everything but the trainer:

* **same prompts format and reward**: the prompts are ``GSM8K-v1``'s own messages (system + question), the reward is
  :func:`envs.gsm8k.grading.gsm8k_reward` with ``format_reward=0`` (what the env returns, so 1 = correct);
* **same optimisation budget**: steps x prompts x samples, max new tokens, temperature 1 (no top-p/top-k), lr,
  constant schedule, AdamW (TRL's default ``adamw_torch``; ours fused AdamW, same betas/eps), grad-norm clip 1,
  no KL (beta 0), clip 0.2 / 0.28, token-mean loss (TRL ``loss_type="dapo"``), group-normalised advantages,
  one optimizer step per 2 x 8 completions in micro-batches of ``--micro-batch``; LoRA with the same r/alpha/targets;
* **same evaluation**: after training, each arm's final weights (LoRA merged) are scored by the same code —
  ``grpo.py`` greedy evaluation (``eval.n_problems`` fixed test problems, ``--backend`` engine) — ours with its
  end-of-run evaluation, TRL's merged model with ``grpo.py eval_only=true actor.path=<merged model>``.

What differs is what each system is: ours rolls out with ``--backend`` (vLLM by default: the recipe's engine; pass
``--backend transformers`` for our embedded one) and TRL with its default HF ``generate`` (``use_vllm=False``).
Train prompts: both arms get the same train problems in the same order at a given seed (ours: the trainer's seeded
epoch permutation; TRL: the same permutation as an unshuffled dataset, :func:`trl_prompt_order`), so a seed is a
paired comparison and seeds vary the prompts too.

Statistics (``summary``): per run, the Wilson 95% interval of the accuracy (n test problems); per arm, the mean
after-training accuracy and mean change with a Student-t 95% interval across seeds (n - 1 df); between arms, the
difference of mean changes with Welch's t interval (Welch 1947; Welch-Satterthwaite df, t quantile interpolated).

Interpreters: ``run --arm trl`` needs ``trl`` (``pip install -e ".[bench]"``) in this interpreter; ``grpo.py``
(ours, ``base`` and TRL's evaluation) runs under ``--py`` (default: this interpreter), which needs ``vllm`` for
``--backend vllm`` (``benchmarks/vllm_env.sh`` builds such a venv). ``--cores`` pins every process (``taskset``) and
``--threads`` sets OMP/MKL threads, as ``gsm8k_seeds.sh`` does for CPU runs.

Running, metrics, metadata and outputs come from :mod:`harness`, the intervals from :mod:`stats` (this folder).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from harness import (REPO, budget_diff, final_eval, load_json, process_meta, pyplot, read_metrics, run_logged,
                     trl_prompt_order, write_outputs)
from stats import acc_wilson, mean_ci, welch_ci, wilson_yerr

#: budget keys recorded with every result; ``summary`` requires them equal across runs
BUDGET_KEYS = ("model", "steps", "prompts", "samples", "max_new_tokens", "temperature", "lr", "lora_r", "lora_alpha",
               "micro_batch", "n_eval", "max_context")


# ------------------------------------------------------------------------------------------------ running
def _budget(a) -> dict:
    return {k: getattr(a, k) for k in BUDGET_KEYS}


def _grpo_common(a) -> list[str]:
    """``grpo.py`` overrides every invocation shares: engine, context, eval set and length (the greedy eval generates
    up to ``gconfig.max_new_tokens``, the training budget's), logging."""
    out = [f"rollout.backend={a.backend}", f"rollout.max_context_tokens={a.max_context}",
           f"gconfig.max_new_tokens={a.max_new_tokens}",
           f"eval.n_problems={a.n_eval}", "eval.greedy=true", "checkpoint.every=0", "checkpoint.save_final=false",
           "stats_logger.progress_bar=false", "stats_logger.wandb.mode=disabled"]
    if a.backend == "vllm":
        out.append(f"rollout.vllm.max_model_len={a.max_context}")
    return out


def _run_grpo(a, overrides: list[str], run_dir: Path, log: Path) -> float:
    """Run ``grpo.py`` under ``--py`` with ``overrides`` into ``run_dir``; returns wall seconds.

    Raises:
        RuntimeError: grpo.py exited non-zero (the log's tail is in the message).
    """
    return run_logged([a.py, str(REPO / "grpo.py"), "--config-name", "grpo_gsm8k", *overrides,
                       f"hydra.run.dir={run_dir}"], log, cores=a.cores, threads=a.threads)


def _meta(a) -> dict:
    return process_meta(a.cores, a.threads, a.backend)


def cmd_base(a) -> dict:
    """Greedy accuracy of the untrained model: ``grpo.py eval_only=true`` on the base weights."""
    d = Path(a.out_root) / "base"
    d.mkdir(parents=True, exist_ok=True)
    wall = _run_grpo(a, [f"actor.path={a.model}", "eval_only=true", f"seed={a.seed}", *_grpo_common(a)], d,
                     d / "run.log")
    res = {"arm": "base", "budget": _budget(a), "eval": final_eval(read_metrics(d)), "wall_s": wall, **_meta(a)}
    (d / "result.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res["eval"]))
    return res


def _ours(a, d: Path) -> dict:
    over = [f"actor.path={a.model}", "actor.peft.enable=true", f"actor.peft.r={a.lora_r}",
            f"actor.peft.lora_alpha={a.lora_alpha}", "actor.peft.lora_dropout=0.0", "actor.peft.target_modules=all-linear",
            f"optimizer.lr={a.lr}", "optimizer.scheduler=constant", "optimizer.warmup_steps=0",
            "optimizer.weight_decay=0.0", "optimizer.max_grad_norm=1.0",
            f"train.steps={a.steps}", f"train.batch_size={a.prompts}", f"gconfig.n_samples={a.samples}",
            f"gconfig.temperature={a.temperature}", "gconfig.top_p=1.0",
            f"train.micro_batch_size={a.micro_batch}", "train.minibatch_size=0", "train.ppo_epochs=1",
            "loss.kl_coef=0.0", "loss.entropy_coef=0.0", "loss.aggregation=token_mean", "loss.adv_scale=group",
            "loss.clip_eps_low=0.2", "loss.clip_eps_high=0.28", "econfig.format_reward=0.0",
            "eval.at_start=false", "eval.at_end=true", "eval.every=0", f"seed={a.seed}", *_grpo_common(a)]
    wall = _run_grpo(a, over, d, d / "run.log")
    rows = read_metrics(d)
    train = [{"step": int(r["step"]), "reward": float(r["reward/mean"]),
              "response_tokens": r.get("episode/response_tokens"), "truncated": r.get("episode/truncated_fraction")}
             for r in rows if "reward/mean" in r and "step" in r]
    return {"train": train, "eval": final_eval(rows), "wall_s": wall, "overrides": over}


def _trl(a, d: Path) -> dict:
    import gymnasium as gym
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import envs
    from envs.gsm8k.grading import gsm8k_reward
    from torchrl_grpo.model_store import load_model_and_tokenizer

    mdir, done_p = d / "model", d / "trl_train.json"
    if a.resume and done_p.is_file() and (mdir / "config.json").is_file():
        print(f"--resume: TRL training of {d} already done ({done_p}); evaluating {mdir}", flush=True)
        return _trl_eval(a, d, json.loads(done_p.read_text()))
    per_step = a.prompts * a.samples
    if per_step % a.micro_batch:
        raise SystemExit(f"--micro-batch {a.micro_batch} must divide prompts x samples = {per_step}")
    gym.register_envs(envs)
    env = gym.make("GSM8K-v1", split="train", format_reward=0.0, disable_env_checker=True).unwrapped
    order = trl_prompt_order(a.seed, env.num_problems, a.steps * a.prompts)
    rows = []
    for i in order:
        obs, info = env.reset(seed=0, options={"index": int(i)})
        rows.append({"prompt": list(obs), "answer": info["answer"], "index": int(i)})
    ds = Dataset.from_list(rows)

    def gsm8k_reward_func(completions, answer, **kwargs):
        return [gsm8k_reward(c[0]["content"] if isinstance(c, list) else c, g, format_reward=0.0)[0]
                for c, g in zip(completions, answer)]

    cuda = torch.cuda.is_available()
    model, tok = load_model_and_tokenizer(a.model, dtype="float32", device="cuda" if cuda else "cpu")
    targs = GRPOConfig(
        output_dir=str(d / "trl"), seed=a.seed, data_seed=a.seed,
        per_device_train_batch_size=a.micro_batch, gradient_accumulation_steps=per_step // a.micro_batch,
        num_generations=a.samples, max_completion_length=a.max_new_tokens,
        temperature=a.temperature, top_p=1.0, top_k=0,
        learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, num_iterations=1, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group",
        max_steps=a.steps, shuffle_dataset=False, use_vllm=False, bf16=cuda, fp16=False,
        gradient_checkpointing=False, use_cpu=not cuda, report_to="none", save_strategy="no", eval_strategy="no",
        logging_steps=1, disable_tqdm=True, log_completions=False, dataloader_num_workers=0,
    )
    lora = LoraConfig(r=a.lora_r, lora_alpha=a.lora_alpha, lora_dropout=0.0, target_modules="all-linear",
                      task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=[gsm8k_reward_func], args=targs, train_dataset=ds,
                          processing_class=tok, peft_config=lora)
    steps_log: list[dict] = []

    class Log(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            lg = logs
            if lg and "reward" in lg:
                steps_log.append({"step": int(state.global_step), **{k: v for k, v in lg.items()
                                                                 if isinstance(v, (int, float))}})
                print(f"[trl] step {state.global_step}: reward {lg['reward']:.3f}  "
                      f"len {lg.get('completions/mean_length', float('nan')):.0f}", flush=True)

    trainer.add_callback(Log())
    t0 = time.time()
    trainer.train()
    train_s = time.time() - t0
    if len(steps_log) != a.steps:
        raise RuntimeError(f"TRL logged {len(steps_log)} steps, expected {a.steps}")
    merged = trainer.model.merge_and_unload()
    if getattr(merged.config, "quantization_config", None) is not None:  # a GGUF-dequantized model: plain weights now
        del merged.config.quantization_config
    merged.save_pretrained(mdir, safe_serialization=True)
    tok.save_pretrained(mdir)
    del trainer, merged, model
    train = [{"step": r["step"], "reward": float(r["reward"]), "response_tokens": r.get("completions/mean_length"),
              "truncated": r.get("completions/clipped_ratio")} for r in steps_log]
    done = {"train": train, "train_s": train_s, "budget": _budget(a), "prompt_indices": order,
            "trl_args": {k: str(getattr(targs, k)) for k in (
                "per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
                "num_generations", "max_completion_length", "temperature", "top_p", "top_k", "learning_rate",
                "lr_scheduler_type", "beta", "num_iterations", "epsilon", "epsilon_high", "loss_type",
                "scale_rewards", "bf16", "use_vllm", "optim", "seed")}}
    done_p.write_text(json.dumps(done, indent=1))  # training kept apart: --resume evaluates without retraining
    return _trl_eval(a, d, done)


def _trl_eval(a, d: Path, done: dict) -> dict:
    """Score TRL's merged model (``d/model``) with ``grpo.py eval_only=true``: the same evaluation as ours.

    Raises:
        ValueError: the saved training used another budget than this call's.
    """
    if done["budget"] != _budget(a):
        diff = budget_diff(_budget(a), done["budget"], BUDGET_KEYS)
        raise ValueError(f"{d}/trl_train.json was trained with another budget ({diff}); run without --resume")
    ev_dir = d / "eval"
    eval_s = _run_grpo(a, [f"actor.path={d / 'model'}", "eval_only=true", f"seed={a.seed}", *_grpo_common(a)],
                       ev_dir, d / "run.log")
    return {**done, "eval": final_eval(read_metrics(ev_dir)), "wall_s": done["train_s"] + eval_s, "eval_s": eval_s}


def cmd_run(a) -> dict:
    d = Path(a.out_root) / a.arm / f"seed{a.seed}"
    d.mkdir(parents=True, exist_ok=True)
    meta = _meta(a)
    out = _ours(a, d) if a.arm == "ours" else _trl(a, d)
    res = {"arm": a.arm, "seed": a.seed, "budget": _budget(a), **out, **meta, "loadavg_end": os.getloadavg()}
    (d / "result.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({"arm": a.arm, "seed": a.seed, "eval": res["eval"], "wall_s": round(res["wall_s"])}))
    return res


# ------------------------------------------------------------------------------------------------ summary
def load_results(root: Path) -> tuple[dict | None, dict[str, list[dict]]]:
    """``(base, {arm: [result, ...] sorted by seed})`` from ``root``.

    Raises:
        ValueError: results with different budgets (naming the keys that differ).
    """
    base = next(iter(load_json([root / "base" / "result.json"])), None)
    arms: dict[str, list[dict]] = {}
    for r in load_json(sorted(root.glob("*/seed*/result.json"))):
        arms.setdefault(r["arm"], []).append(r)
    for v in arms.values():
        v.sort(key=lambda r: r["seed"])
    every = ([base] if base else []) + [r for v in arms.values() for r in v]
    if every:
        ref = every[0]["budget"]
        for r in every[1:]:
            diff = budget_diff(ref, r["budget"], BUDGET_KEYS)
            if diff:
                raise ValueError(f"different budgets in {root}: {r['arm']} seed {r.get('seed')} differs in {diff}")
    return base, arms


def _acc(e: dict) -> str:
    return acc_wilson(e["accuracy"], e["n"])


def _pm(m: float, h: float) -> str:
    return f"{m:+.3f} ± {h:.3f}" if not math.isnan(h) else f"{m:+.3f} (one seed: no interval)"


def summarise(root: Path) -> dict:
    """The table's numbers: per run, per arm (mean ± t-interval), and ours - TRL (Welch)."""
    base, arms = load_results(root)
    if base is None:
        raise SystemExit(f"no {root}/base/result.json: run the 'base' subcommand first")
    b = base["eval"]["accuracy"]
    out = {"base": base["eval"], "budget": base["budget"], "runs": [], "arms": {}}
    for arm, rs in arms.items():
        for r in rs:
            out["runs"].append({"arm": arm, "seed": r["seed"], "after": r["eval"], "change": r["eval"]["accuracy"] - b,
                                "wall_s": r["wall_s"], "device": r.get("device"), "commit": r.get("commit")})
        changes = [r["eval"]["accuracy"] - b for r in rs]
        m, h = mean_ci([r["eval"]["accuracy"] for r in rs])
        mc, hc = mean_ci(changes)
        out["arms"][arm] = {"seeds": [r["seed"] for r in rs], "after_mean": m, "after_ci": h, "change_mean": mc,
                            "change_ci": hc, "wall_s_mean": sum(r["wall_s"] for r in rs) / len(rs)}
    if "ours" in arms and "trl" in arms:
        d, h = welch_ci([r["eval"]["accuracy"] for r in arms["ours"]], [r["eval"]["accuracy"] for r in arms["trl"]])
        out["ours_minus_trl"] = {"after_diff": d, "ci": h,
                                 "outside_noise": (not math.isnan(h)) and abs(d) > h}
    return out


def to_markdown(s: dict, root: Path) -> str:
    bud = s["budget"]
    lines = [
        "# GSM8K: ours vs TRL GRPOTrainer, same budget, several seeds (issue 14 section 1)", "",
        (f"Results root: `{root}`. Budget (every run): {bud['model']}, LoRA r={bud['lora_r']} "
         f"alpha={bud['lora_alpha']}, lr {bud['lr']}, {bud['steps']} steps x {bud['prompts']} prompts x "
         f"{bud['samples']} samples, {bud['max_new_tokens']} new tokens, temperature {bud['temperature']}, "
         f"micro-batch {bud['micro_batch']}; greedy eval on the first {bud['n_eval']} GSM8K test problems."), "",
        f"Base model (before, every run): {_acc(s['base'])}", "",
        "| arm | seed | greedy acc. after [Wilson 95%] | change vs base | wall (train + eval) | device |",
        "|---|---|---|---|---|---|",
    ]
    for r in s["runs"]:
        lines.append(f"| {r['arm']} | {r['seed']} | {_acc(r['after'])} | {r['change']:+.3f} | "
                     f"{r['wall_s'] / 60:.1f} min | {r['device']} |")
    lines += ["", "| arm | seeds | mean acc. after ± 95% t-interval | mean change ± 95% t-interval | mean wall |",
              "|---|---|---|---|---|"]
    for arm, v in s["arms"].items():
        lines.append(f"| {arm} | {len(v['seeds'])} | {_pm(v['after_mean'], v['after_ci']).lstrip('+')} | "
                     f"{_pm(v['change_mean'], v['change_ci'])} | {v['wall_s_mean'] / 60:.1f} min |")
    if "ours_minus_trl" in s:
        o = s["ours_minus_trl"]
        verdict = "outside noise" if o["outside_noise"] else "within noise"
        lines += ["", f"Ours - TRL, mean accuracy after: {_pm(o['after_diff'], o['ci'])} (Welch 95%): **{verdict}**."]
    return "\n".join(lines) + "\n"


def plot(root: Path, out_png: Path) -> Path:
    """Train reward per step (one line per seed, colour per arm) and greedy eval accuracy before/after with Wilson
    intervals, into ``out_png``."""
    plt = pyplot()
    base, arms = load_results(root)
    colours = {"ours": "tab:blue", "trl": "tab:orange"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, rs in arms.items():
        c = colours.get(arm, "tab:gray")
        for k, r in enumerate(rs):
            tr = r.get("train", [])
            ax1.plot([t["step"] for t in tr], [t["reward"] for t in tr], color=c, alpha=0.8, marker=".",
                     label=arm if k == 0 else None)
            if base is not None:
                steps = [0, r["budget"]["steps"]]
                accs = [base["eval"]["accuracy"], r["eval"]["accuracy"]]
                errs = wilson_yerr(accs, [base["eval"]["n"], r["eval"]["n"]])
                ax2.errorbar([s + (0.15 * k if arm == "ours" else -0.15 * (k + 1)) for s in steps], accs, yerr=errs,
                             color=c, marker="o", capsize=3, alpha=0.8, label=f"{arm} seed {r['seed']}")
    ax1.set(xlabel="train step", ylabel="train reward (mean of the step's samples)", title="train reward")
    ax2.set(xlabel="train step", ylabel="greedy accuracy (Wilson 95%)", title="GSM8K test accuracy")
    ax1.legend()
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def cmd_summary(a) -> None:
    root = Path(a.root)
    s = summarise(root)
    md = to_markdown(s, root)
    print(md)
    if a.write:
        write_outputs(a.write, md + f"\nProduced by `python benchmarks/experiments/gsm8k_vs_trl.py summary {root} --write "
                      f"{a.write}`; per-run commands in each result.json.\n", s, lambda png: plot(root, png))


def _add_budget(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out-root", default=str(REPO / "outputs" / "gsm8k_vs_trl"))
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--lora-r", type=int, default=32)
    p.add_argument("--lora-alpha", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--n-eval", type=int, default=250)
    p.add_argument("--max-context", type=int, default=1024)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--backend", default="vllm", choices=("vllm", "transformers"),
                   help="our rollout + evaluation engine (both arms are evaluated with it)")
    p.add_argument("--py", default=sys.executable, help="interpreter for grpo.py (needs vllm for --backend vllm)")
    p.add_argument("--cores", default="", help="taskset CPU list for every process (CPU runs), e.g. 1")
    p.add_argument("--threads", type=int, default=0, help="OMP/MKL threads (0: leave as is)")
    p.add_argument("--resume", action="store_true",
                   help="run --arm trl: reuse a finished training (trl_train.json + model/) and only evaluate")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    _add_budget(sub.add_parser("base", help="greedy accuracy of the untrained model (the shared 'before')"))
    pr = sub.add_parser("run", help="one (arm, seed) run")
    pr.add_argument("--arm", required=True, choices=("ours", "trl"))
    _add_budget(pr)
    ps = sub.add_parser("summary", help="table + learning-curve PNG over root/{base,ours,trl}")
    ps.add_argument("root")
    ps.add_argument("--write", default="", help="path stem for .md/.json/.png (e.g. benchmarks/results/gsm8k_vs_trl)")
    a = ap.parse_args(argv)
    if a.cmd == "summary":
        cmd_summary(a)
    elif a.cmd == "base":
        cmd_base(a)
    else:
        cmd_run(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
