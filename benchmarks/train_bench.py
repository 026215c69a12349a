#!/usr/bin/env python
"""GRPO training throughput: our sync trainer vs TRL's ``GRPOTrainer`` at identical settings, one process.

    # in the project venv (``pip install -e ".[bench]"``), GSM8K from $GSM8K_DATA_DIR or --data-dir:
    python benchmarks/train_bench.py --data-dir $GSM8K_DATA_DIR                        # 2 warm-up + 4 timed steps each
    python benchmarks/train_bench.py --warmup 1 --steps 2 --no-write                  # quick smoke run
    python benchmarks/train_bench.py --device cuda --dtype float32 --out-dir <dir>      # both trainers on the GPU

Device (issue 35): ``--device auto|cpu|cuda`` (auto: cuda when available) and ``--dtype float32|bfloat16`` put both
trainers on one device with one weights' dtype (ours ``train.device`` / ``actor.dtype``, bf16 autocast in its update
on CUDA; TRL the model loaded there, ``use_cpu`` only on CPU, ``bf16=True`` on CUDA: ``harness.precision``); the
results record the device name, dtype, versions, load and command (``harness.instrument_meta``). A ``--model`` given as
a ``.gguf`` file is converted once to a cached HF directory that both trainers load (TRL refuses GGUF-loaded models).

Settings shared by both trainers (the project issue's): SmolLM2-135M-Instruct, fp32, CPU by default, GSM8K train prompts rendered
with the model's chat template (system + user message exactly as ``GSM8K-v1`` produces them), 2 prompts x 8 samples
per step, 128 new tokens, temperature 1.0 (top_p 1, top_k 0), KL/beta 0, one optimizer step per 16 completions
(micro-batches of ``--micro-batch``: ours ``train.micro_batch_size``, TRL ``per_device_train_batch_size`` with
``gradient_accumulation_steps`` = 16 / micro-batch, ``num_iterations=1``), same learning rate (constant schedule),
AdamW, grad-norm clip 1.0, token-mean loss (ours ``token_mean``; TRL ``loss_type="dapo"``), clip eps 0.2 / 0.28,
group-std advantages, same reward function (``envs.gsm8k.grading.gsm8k_reward`` with format reward 0.1), the same
prompts in the same order at every step (ours picks them, TRL gets them as an unshuffled dataset), same seed.

Timing: ``--warmup`` steps are run and excluded, then ``--steps`` timed steps. By default the two trainers
alternate step by step in this one process (TRL step k, then our step k, run from TRL's ``on_step_end``
callback), so that load drift on a shared machine hits both alike; ``--order ours,trl`` / ``trl,ours`` runs them one
after the other instead. Ours: wall time of ``trainer.train_step()`` (its own breakdown: rollout = generation +
env/reward, train = advantages + loss + backward + optimizer). TRL: from the end of the previous step (after the
interleaved step of ours) to its next ``on_step_end`` (one optimizer step: dataloader fetch, generation, reward,
advantages, 4 micro-batch forward/backward, optimizer, plus the previous step's logging); generation = wall time of
its ``_generate_single_turn`` (HF ``model.generate``), rollout = ``_generate_and_score_completions``,
train = step - rollout. Generated tokens: sampled completion tokens up to and including the stop token
(both trainers count the same way). Results: ``benchmarks/results/train_bench.{json,md}``.

``--ours-vllm`` adds a third trainer, ours with the vLLM rollout backend (``rollout.backend=vllm``, its default
bf16 engine, weights synced every step), interleaved with the other two (issue 12: beside the like-for-like row).
vLLM lives in its own venv (``benchmarks/vllm_env.sh``; ``$VLLM_VENV``) and TRL in the project's, so run it from the
vLLM venv with the project venv's site-packages appended after the vLLM venv's own (``--append-sys-path``; same
torch/transformers in both; ``python`` below is the project venv's interpreter):

    "$VLLM_VENV/bin/python" benchmarks/train_bench.py --ours-vllm \
        --append-sys-path "$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import site
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]

import torch  # noqa: E402
# the instruments' shared harness (device, metadata): the package experiments/ beside this script (benchmarks/ is
# sys.path[0] for ``python benchmarks/train_bench.py``)
from experiments.harness import add_device_args, instrument_meta, meta_line, precision, resolve_device, same_weights  # noqa: E402


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return []


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("torch", "torchrl", "tensordict", "transformers", "trl", "accelerate", "datasets", "torchrl-grpo"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def _machine() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "torch_threads": torch.get_num_threads(), "cpu": cpu, "mem_gib": mem,
            "platform": platform.platform()}


# ---------------------------------------------------------------------------------------------- ours
def build_ours_config(args, total_steps: int, backend: str = "transformers"):
    from hydra import compose, initialize_config_dir

    from torchrl_grpo.config import register_configs

    register_configs()
    overrides = [
        f"actor.path={args.model_path}", f"actor.dtype={args.dtype}", "actor.gradient_checkpointing=false", "actor.peft.enable=false",
        f"train_dataset.path={os.environ['GSM8K_DATA_DIR']}", "train_dataset.split=train",
        f"seed={args.seed}", f"train.steps={total_steps}", f"train.batch_size={args.prompts}",
        f"gconfig.n_samples={args.samples}", f"gconfig.max_new_tokens={args.max_new_tokens}",
        f"gconfig.temperature={args.temperature}", "gconfig.top_p=1.0",
        "loss.kl_coef=0.0", "loss.entropy_coef=0.0", "loss.aggregation=token_mean", "loss.adv_scale=group",
        "loss.clip_eps_low=0.2", "loss.clip_eps_high=0.28",
        f"optimizer.lr={args.lr}", "optimizer.scheduler=constant", "optimizer.warmup_steps=0",
        "optimizer.weight_decay=0.0", "optimizer.max_grad_norm=1.0",
        "train.minibatch_size=0", f"train.micro_batch_size={args.micro_batch}", "train.ppo_epochs=1",
        f"train.device={args.device}", f"rollout.backend={backend}",
        "eval.at_start=false", "eval.at_end=false", "eval.every=0", "eval.n_problems=0",
        "checkpoint.every=0", "checkpoint.save_final=false",
        "stats_logger.wandb.mode=disabled", "stats_logger.console=false", "stats_logger.progress_bar=false",
    ]
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="grpo_gsm8k", overrides=overrides)
    return cfg, overrides


class OursRunner:
    """Steps our trainer one ``train_step()`` at a time and records its per-step timings."""

    def __init__(self, args, trainer, name: str = "ours") -> None:
        self.args, self.trainer, self.steps, self.loads, self.name = args, trainer, [], [], name

    def step(self) -> None:
        args, k = self.args, len(self.steps)
        t0 = time.perf_counter()
        m = self.trainer.train_step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        rec = {
            "step": k, "warmup": k < args.warmup, "wall_s": wall,
            "rollout_s": m.get("rollout/time_s"), "generate_s": m.get("rollout/generate_time_s"),
            "env_s": m.get("rollout/env_time_s"), "train_s": m.get("time/train_s"), "sync_s": m.get("time/sync_s"),
            "generated_tokens": m.get("rollout/generated_tokens"),
            "completions": int(m.get("rollout/episodes", args.prompts * args.samples)),
            "reward_mean": m.get("reward/mean"), "loss": m.get("loss/total"),
            "optimizer_steps": m.get("train/optimizer_steps"),
            "mean_total_tokens": m.get("episode/total_tokens"),
        }
        self.steps.append(rec)
        print(f"[{self.name}] step {k}{' (warm-up)' if rec['warmup'] else ''}: {wall:.2f}s  rollout {rec['rollout_s']:.2f}s "
              f"(generate {rec['generate_s']:.2f}s)  train {rec['train_s']:.2f}s  "
              f"tokens {rec['generated_tokens']:.0f}  reward {rec['reward_mean']:.3f}  load {_loadavg()[0]}", flush=True)
        self.loads.append(_loadavg())


# ---------------------------------------------------------------------------------------------- TRL
def run_trl(args, model, tokenizer, prompts: list[dict], out_dir: Path, between_steps=None) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from envs.gsm8k.grading import gsm8k_reward

    total = args.warmup + args.steps
    per_step = args.prompts * args.samples
    if per_step % args.micro_batch:
        raise SystemExit(f"--micro-batch {args.micro_batch} must divide {per_step}")
    ds = Dataset.from_list([{"prompt": p["messages"], "answer": p["answer"]} for p in prompts])

    def gsm8k_reward_func(completions, answer, **kwargs):
        return [gsm8k_reward(c[0]["content"] if isinstance(c, list) else c, a, format_reward=args.format_reward)[0]
                for c, a in zip(completions, answer)]

    targs = GRPOConfig(
        output_dir=str(out_dir), seed=args.seed, data_seed=args.seed,
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=per_step // args.micro_batch,
        num_generations=args.samples, max_completion_length=args.max_new_tokens,
        temperature=args.temperature, top_p=1.0, top_k=0,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, num_iterations=1, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group",
        max_steps=total, shuffle_dataset=False,
        use_vllm=False, bf16=precision(args.device, args.dtype)["trl_bf16"], fp16=False, gradient_checkpointing=False,
        use_cpu=args.device == "cpu",
        report_to="none", save_strategy="no", eval_strategy="no", logging_steps=1, disable_tqdm=True,
        log_completions=False, dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[gsm8k_reward_func], args=targs, train_dataset=ds,
                          processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)  # we print our own per-step line

    rec: dict = {"gen_s": [], "rollout_s": [], "gen_tokens": [], "gen_max_len": [], "step_begin": [], "step_end": [],
                 "resume": [], "logs": []}
    orig_gen = trainer._generate_single_turn
    orig_score = trainer._generate_and_score_completions

    def timed_gen(*a, **kw):
        t0 = time.perf_counter()
        out = orig_gen(*a, **kw)
        rec["gen_s"].append(time.perf_counter() - t0)
        ids = out[0]
        rec["gen_tokens"].append(sum(len(c) for c in ids))
        rec["gen_max_len"].append(max(len(c) for c in ids))
        return out

    def timed_score(*a, **kw):
        t0 = time.perf_counter()
        out = orig_score(*a, **kw)
        rec["rollout_s"].append(time.perf_counter() - t0)
        return out

    trainer._generate_single_turn = timed_gen
    trainer._generate_and_score_completions = timed_score

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            rec["step_begin"].append(time.perf_counter())

        def on_step_end(self, a, state, control, **kw):
            if args.device == "cuda":
                torch.cuda.synchronize()
            rec["step_end"].append(time.perf_counter())
            if between_steps is not None:  # interleaved mode: one step of ours between two TRL steps (not timed as TRL)
                between_steps()
            rec["resume"].append(time.perf_counter())

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                rec["logs"].append(dict(logs))

    trainer.add_callback(Timer())
    t_train0 = time.perf_counter()
    trainer.train()
    rec["train_call_s"] = time.perf_counter() - t_train0
    n = len(rec["step_end"])
    if n != total or len(rec["gen_s"]) != total:
        raise RuntimeError(f"TRL ran {n} optimizer steps / {len(rec['gen_s'])} generations, expected {total}")
    steps = []
    for k in range(total):
        # from the end of the previous step (after any interleaved step of ours) to the end of this one: includes
        # TRL's logging of the previous step and its dataloader fetch, i.e. one of each per step
        start = rec["resume"][k - 1] if k > 0 else rec["step_begin"][0]
        wall = rec["step_end"][k] - start
        logs = rec["logs"][k] if k < len(rec["logs"]) else {}
        s = {"step": k, "warmup": k < args.warmup, "wall_s": wall, "rollout_s": rec["rollout_s"][k],
             "generate_s": rec["gen_s"][k], "train_s": wall - rec["rollout_s"][k],
             "generated_tokens": float(rec["gen_tokens"][k]), "max_completion_len": rec["gen_max_len"][k],
             "completions": per_step, "reward_mean": logs.get("reward"), "loss": logs.get("loss"),
             "mean_length": logs.get("completions/mean_length")}
        steps.append(s)
        print(f"[trl ] step {k}{' (warm-up)' if s['warmup'] else ''}: {wall:.2f}s  rollout {s['rollout_s']:.2f}s "
              f"(generate {s['generate_s']:.2f}s)  train {s['train_s']:.2f}s  tokens {s['generated_tokens']:.0f}  "
              f"reward {s['reward_mean'] if s['reward_mean'] is None else round(s['reward_mean'], 3)}", flush=True)
    return {"steps": steps, "train_call_s": rec["train_call_s"], "trl_args": {
        k: getattr(targs, k) for k in ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
                                       "generation_batch_size", "num_generations", "max_completion_length", "temperature",
                                       "top_p", "top_k", "learning_rate", "lr_scheduler_type", "beta", "num_iterations",
                                       "epsilon", "epsilon_high", "loss_type", "scale_rewards", "bf16",
                                       "gradient_checkpointing", "use_vllm", "optim", "seed")}}


# ---------------------------------------------------------------------------------------------- summary
def summarize(run: dict) -> dict:
    timed = [s for s in run["steps"] if not s["warmup"]]
    wall = sum(s["wall_s"] for s in timed)
    comps = sum(s["completions"] for s in timed)
    toks = sum(s["generated_tokens"] for s in timed)
    gen = sum(s["generate_s"] for s in timed)
    roll = sum(s["rollout_s"] for s in timed)
    train = sum(s["train_s"] for s in timed)
    out = {
        "timed_steps": len(timed),
        "step_s_mean": wall / len(timed),
        "step_s_median": statistics.median(s["wall_s"] for s in timed),
        "completions_per_s": comps / wall,
        "generated_tokens_per_step": toks / len(timed),
        "generated_tokens_per_completion": toks / comps,
        "generated_tokens_per_s": toks / wall,
        "generate_s_per_step": gen / len(timed),
        "rollout_s_per_step": roll / len(timed),
        "train_s_per_step": train / len(timed),
        "generate_tokens_per_s_in_generation": toks / gen if gen > 0 else None,
        "generate_fraction": gen / wall,
        "reward_mean": statistics.mean(s["reward_mean"] for s in timed if s["reward_mean"] is not None)
        if any(s["reward_mean"] is not None for s in timed) else None,
    }
    return out


def to_markdown(res: dict) -> str:
    o, t, r = res["ours"]["summary"], res["trl"]["summary"], res["ratio_ours_over_trl"]
    s = res["settings"]
    lines = [
        "# GRPO training throughput: torchrl-grpo vs TRL GRPOTrainer",
        "",
        f"Command: `{res['command']}`  ",
        f"Date: {res['date']}  ",
        meta_line(res["meta"]) + "  ",
        f"Machine: {res['machine']['nproc']} CPU cores ({res['machine']['cpu']}), {res['machine']['mem_gib']} GiB, "
        f"torch threads {res['machine']['torch_threads']}; load average before {res['loadavg_before']}, "
        f"during (sampled between steps) {[x[0] for x in res['loadavg_between']]}, after {res['loadavg_after']}  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()),
        "",
        f"Settings: {s['model']} {s['dtype']} on {s['device']}; {s['prompts']} GSM8K train prompts x {s['samples']} samples per step; "
        f"{s['max_new_tokens']} new tokens; temperature {s['temperature']}; lr {s['lr']} constant; beta/KL 0; "
        f"one optimizer step per {s['prompts'] * s['samples']} completions in micro-batches of {s['micro_batch']}; "
        f"token-mean loss (TRL `dapo`), clip 0.2/0.28; reward `gsm8k_reward` (format 0.1); seed {s['seed']}; "
        f"{s['warmup']} warm-up step(s) excluded, {s['steps']} timed steps each; order: {', '.join(s['order'])}.",
        "",
        "| metric (mean over timed steps) | ours | TRL | ours/TRL |",
        "|---|---:|---:|---:|",
        f"| completions/s | {o['completions_per_s']:.3f} | {t['completions_per_s']:.3f} | **{r['completions_per_s']:.2f}x** |",
        f"| generated tokens/s (whole step) | {o['generated_tokens_per_s']:.1f} | {t['generated_tokens_per_s']:.1f} | "
        f"{r['generated_tokens_per_s']:.2f}x |",
        f"| step time (s, lower is better) | {o['step_s_mean']:.2f} | {t['step_s_mean']:.2f} | {o['step_s_mean'] / t['step_s_mean']:.2f} |",
        f"| generation time per step (s) | {o['generate_s_per_step']:.2f} | {t['generate_s_per_step']:.2f} | "
        f"{o['generate_s_per_step'] / t['generate_s_per_step']:.2f} |",
        f"| rollout time per step (gen + reward / scoring, s) | {o['rollout_s_per_step']:.2f} | "
        f"{t['rollout_s_per_step']:.2f} | {o['rollout_s_per_step'] / t['rollout_s_per_step']:.2f} |",
        f"| train time per step (s) | {o['train_s_per_step']:.2f} | {t['train_s_per_step']:.2f} | "
        f"{o['train_s_per_step'] / t['train_s_per_step']:.2f} |",
        f"| generation tokens/s (generation phase only) | {o['generate_tokens_per_s_in_generation']:.1f} | "
        f"{t['generate_tokens_per_s_in_generation']:.1f} | "
        f"{o['generate_tokens_per_s_in_generation'] / t['generate_tokens_per_s_in_generation']:.2f}x |",
        f"| generated tokens per step | {o['generated_tokens_per_step']:.0f} | {t['generated_tokens_per_step']:.0f} | "
        f"{o['generated_tokens_per_step'] / t['generated_tokens_per_step']:.2f} |",
        f"| tokens per completion | {o['generated_tokens_per_completion']:.1f} | "
        f"{t['generated_tokens_per_completion']:.1f} | |",
        f"| mean reward | {o['reward_mean']:.3f} | {t['reward_mean']:.3f} | |",
        "",
    ]
    if "ours_vllm" in res:
        v = res["ours_vllm"]["summary"]
        lines += [
            "Ours with the vLLM rollout backend (same run, interleaved; vLLM engine bf16, weights synced every step):",
            "",
            "| metric | ours (vLLM backend) | TRL | ours (vLLM)/TRL |",
            "|---|---:|---:|---:|",
            f"| completions/s | {v['completions_per_s']:.3f} | {t['completions_per_s']:.3f} | "
            f"**{v['completions_per_s'] / t['completions_per_s']:.2f}x** |",
            f"| step time (s) | {v['step_s_mean']:.2f} | {t['step_s_mean']:.2f} | {v['step_s_mean'] / t['step_s_mean']:.2f} |",
            f"| generation time per step (s) | {v['generate_s_per_step']:.2f} | {t['generate_s_per_step']:.2f} | "
            f"{v['generate_s_per_step'] / t['generate_s_per_step']:.2f} |",
            f"| train time per step (s, incl. weight sync) | {v['train_s_per_step']:.2f} | {t['train_s_per_step']:.2f} | "
            f"{v['train_s_per_step'] / t['train_s_per_step']:.2f} |",
            f"| generated tokens per step | {v['generated_tokens_per_step']:.0f} | {t['generated_tokens_per_step']:.0f} | |",
            "",
        ]
    lines += [
        "Per step (s; warm-up steps marked w):",
        "",
        "| trainer | step | wall | rollout | generate | train | gen. tokens | reward |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("ours", "ours_vllm", "trl"):
        for st in res.get(name, {}).get("steps", []):
            rw = "" if st["reward_mean"] is None else f"{st['reward_mean']:.3f}"
            lines.append(f"| {name} | {st['step']}{' w' if st['warmup'] else ''} | {st['wall_s']:.2f} | {st['rollout_s']:.2f} "
                         f"| {st['generate_s']:.2f} | {st['train_s']:.2f} | {st['generated_tokens']:.0f} | {rw} |")
    if res.get("notes"):
        lines += ["", "Notes:", ""] + [f"- {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    add_device_args(p)
    p.add_argument("--data-dir", default=os.environ.get("GSM8K_DATA_DIR"),
                   help="GSM8K folder with train.jsonl/test.jsonl (default: $GSM8K_DATA_DIR)")
    p.add_argument("--prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--samples", type=int, default=8, help="completions per prompt (group size)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per forward/backward (both trainers)")
    p.add_argument("--format-reward", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch default = nproc)")
    p.add_argument("--order", default="interleave",
                   help="interleave (TRL step k, then our step k, alternating: robust to load drift; default), "
                        "or sequential: ours,trl | trl,ours")
    p.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    p.add_argument("--no-write", action="store_true", help="print only, do not write results files")
    p.add_argument("--ours-vllm", action="store_true",
                   help="also run ours with the vLLM rollout backend (interleaved; run from the vLLM venv)")
    p.add_argument("--append-sys-path", action="append", default=[],
                   help="a site directory added after this venv's own (site.addsitedir: its .pth files processed), "
                        "e.g. the project venv's site-packages for trl when running from the vLLM venv")
    args = p.parse_args(argv)
    for site_dir in args.append_sys_path:  # the user's interpreter composition, not an import of ours
        site.addsitedir(site_dir)
    if args.ours_vllm and args.order != "interleave":
        raise SystemExit("--ours-vllm needs --order interleave")
    if not args.data_dir:
        raise SystemExit("no GSM8K data: pass --data-dir <folder with train.jsonl/test.jsonl> or set GSM8K_DATA_DIR")
    os.environ["GSM8K_DATA_DIR"] = args.data_dir  # read by build_ours_config, the GSM8K env and the results record
    args.device = resolve_device(args.device)
    args.model_path = same_weights(args.model)  # a .gguf: converted once, both trainers load that HF directory
    order = ["interleave"] if args.order == "interleave" else [x.strip() for x in args.order.split(",") if x.strip()]
    if order != ["interleave"] and sorted(order) != ["ours", "trl"]:
        raise SystemExit("--order must be interleave or name ours and trl once each")

    import gymnasium as gym
    from transformers import logging as hf_logging

    import envs
    from torchrl_grpo.rollout.chat_tokens import ChatRenderer
    from torchrl_grpo.model_store import load_model_and_tokenizer, resolve_model_path

    hf_logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    gym.register_envs(envs)
    t_start = time.perf_counter()
    load_before = _loadavg()
    print(f"load average before: {load_before}; nproc {os.cpu_count()}; torch threads {torch.get_num_threads()}", flush=True)

    total = args.warmup + args.steps
    cfg, overrides = build_ours_config(args, total)
    src = resolve_model_path(args.model_path)
    from torchrl_grpo.seeding import seed_everything
    from torchrl_grpo.assembly import build_trainer
    from torchrl_grpo.training.grpo_trainer import GRPOTrainer

    with tempfile.TemporaryDirectory(prefix="train_bench_") as tmp:
        # our trainer is built first (each trainer gets its own freshly loaded copy of the same weights); it also
        # picks the prompts of every step, which TRL then gets unshuffled in the same order
        t0 = time.perf_counter()
        model_ours, tok_ours = load_model_and_tokenizer(args.model_path, dtype=args.dtype, device=args.device)
        print(f"model {src.path} loaded in {time.perf_counter() - t0:.1f}s", flush=True)
        seed_everything(args.seed)
        ours = build_trainer(cfg, Path(tmp) / "ours", trainer_cls=GRPOTrainer, model=model_ours, tokenizer=tok_ours)
        env = gym.make("GSM8K-v1", split="train", format_reward=args.format_reward, disable_env_checker=True).unwrapped
        ren = ChatRenderer(tok_ours)
        prompts = []
        for step in range(total):
            for task in ours.tasks_for_step(step):
                obs, info = env.reset(seed=0, options=dict(task))
                ours_ids = ren.prompt_ids(list(obs))
                trl_ids = tok_ours.apply_chat_template(obs, add_generation_prompt=True, tokenize=True,
                                                       return_dict=True)["input_ids"]
                if list(trl_ids) != list(ours_ids):
                    raise RuntimeError(f"prompt rendering differs for task {task}: ours {len(ours_ids)} vs TRL "
                                       f"{len(trl_ids)} tokens")
                prompts.append({"index": info["index"], "messages": obs, "answer": info["answer"],
                                "prompt_tokens": len(ours_ids)})
        if len(prompts) != total * args.prompts:
            raise RuntimeError(f"expected {total * args.prompts} prompts, got {len(prompts)}")
        print(f"prompts (task indices per step): {[p['index'] for p in prompts]}; prompt tokens "
              f"{[p['prompt_tokens'] for p in prompts]} (identical token ids for both trainers)", flush=True)

        results: dict = {}
        loads_between = []
        runner = OursRunner(args, ours)
        ours_v = runner_v = None
        if args.ours_vllm:
            cfg_v, overrides_v = build_ours_config(args, total, backend="vllm")
            model_v, tok_v = load_model_and_tokenizer(args.model_path, dtype=args.dtype, device=args.device)
            seed_everything(args.seed)
            ours_v = build_trainer(cfg_v, Path(tmp) / "ours_vllm", trainer_cls=GRPOTrainer, model=model_v, tokenizer=tok_v)
            runner_v = OursRunner(args, ours_v, name="ours_vllm")

        def between_steps():
            runner.step()
            if runner_v is not None:
                runner_v.step()

        try:
            if order == ["interleave"]:
                model, tok = load_model_and_tokenizer(args.model_path, dtype=args.dtype, device=args.device)
                torch.manual_seed(args.seed)
                t0 = time.perf_counter()
                results["trl"] = run_trl(args, model, tok, prompts, Path(tmp) / "trl", between_steps=between_steps)
                results["ours"] = {"steps": runner.steps}
                if runner_v is not None:
                    results["ours_vllm"] = {"steps": runner_v.steps, "total_s": time.perf_counter() - t0}
                loads_between.extend(runner.loads)
                results["trl"]["total_s"] = results["ours"]["total_s"] = time.perf_counter() - t0
                del model, tok
            for name in order if order != ["interleave"] else []:
                if results:
                    loads_between.append(_loadavg())
                t0 = time.perf_counter()
                if name == "ours":
                    seed_everything(args.seed)
                    for _ in range(total):
                        runner.step()
                    results["ours"] = {"steps": runner.steps}
                else:
                    model, tok = load_model_and_tokenizer(args.model_path, dtype=args.dtype, device=args.device)
                    torch.manual_seed(args.seed)
                    t0 = time.perf_counter()
                    results["trl"] = run_trl(args, model, tok, prompts, Path(tmp) / "trl")
                    del model, tok
                results[name]["total_s"] = time.perf_counter() - t0
        finally:
            ours.close()
            if ours_v is not None:
                ours_v.close()
        if len(runner.steps) != total:
            raise RuntimeError(f"our trainer ran {len(runner.steps)} steps, expected {total}")
        del ours, model_ours
        runner = None  # frees its trainer (between_steps is not called after this)
    load_after = _loadavg()
    for name in results:
        results[name]["summary"] = summarize(results[name])
    o, t = results["ours"]["summary"], results["trl"]["summary"]
    ratio = {
        "completions_per_s": o["completions_per_s"] / t["completions_per_s"],
        "generated_tokens_per_s": o["generated_tokens_per_s"] / t["generated_tokens_per_s"],
        "generation_phase_tokens_per_s": o["generate_tokens_per_s_in_generation"] / t["generate_tokens_per_s_in_generation"],
        "train_time": o["train_s_per_step"] / t["train_s_per_step"],
    }
    notes = []
    worst = max([load_before[0] if load_before else 0.0] + [x[0] for x in loads_between] + [load_after[0] if load_after else 0.0])
    if worst > 2.5:
        notes.append(f"1-minute load average reached {worst:.2f} on {os.cpu_count()} cores during the run: other processes "
                     "competed for the CPU, absolute timings are inflated (with torch's default thread count, contention "
                     "slows multi-threaded kernels disproportionately); the interleaved order keeps the ratio meaningful")
    len_ratio = o["generated_tokens_per_step"] / t["generated_tokens_per_step"]
    if not 0.85 <= len_ratio <= 1.15:
        notes.append(f"generated lengths differ (ours/TRL tokens per step = {len_ratio:.2f}): compare generated tokens/s "
                     "as well as completions/s")
    notes.append("TRL's HF generate keeps finished rows in the batch until the longest completion ends (padding); "
                 "ours drops finished rows and prefills each distinct prompt once (prefix sharing).")
    notes.append("TRL's train time includes its per-step logging/metric gathers and the entropy computed in its loss; "
                 "ours includes the weight-sync no-op (colocated module).")
    res = {
        "benchmark": "train_bench",
        "command": "GSM8K_DATA_DIR=" + os.environ["GSM8K_DATA_DIR"] + " python " + " ".join(
            shlex.quote(x) for x in [os.path.relpath(__file__, REPO)] + (sys.argv[1:] if argv is None else argv)),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": _machine(), "versions": _versions(), "meta": instrument_meta(args.device, args.dtype),
        "loadavg_before": load_before, "loadavg_between": loads_between, "loadavg_after": load_after,
        "settings": {"model": args.model, "model_path": src.path, "dtype": args.dtype, "device": args.device,
                     "device_name": instrument_meta(args.device, args.dtype)["device_name"],
                     "prompts": args.prompts, "samples": args.samples, "max_new_tokens": args.max_new_tokens,
                     "temperature": args.temperature, "lr": args.lr, "micro_batch": args.micro_batch,
                     "format_reward": args.format_reward, "threads": torch.get_num_threads(), "seed": args.seed, "warmup": args.warmup, "steps": args.steps,
                     "order": order, "prompt_indices": [p["index"] for p in prompts],
                     "prompt_tokens": [p["prompt_tokens"] for p in prompts]},
        "ours": {**results["ours"], "config_overrides": overrides},
        "trl": results["trl"],
        **({"ours_vllm": {**results["ours_vllm"], "config_overrides": overrides_v}} if "ours_vllm" in results else {}),
        "ratio_ours_over_trl": ratio,
        "notes": notes,
        "script_wall_s": time.perf_counter() - t_start,
    }
    print()
    for name, s in (("ours", o), ("TRL ", t)):
        print(f"{name}: {s['completions_per_s']:.3f} completions/s, {s['generated_tokens_per_s']:.1f} gen tok/s, "
              f"step {s['step_s_mean']:.2f}s = generate {s['generate_s_per_step']:.2f}s + rest of rollout "
              f"{s['rollout_s_per_step'] - s['generate_s_per_step']:.2f}s + train {s['train_s_per_step']:.2f}s; "
              f"{s['generated_tokens_per_step']:.0f} tokens/step")
    print(f"ours/TRL: completions/s {ratio['completions_per_s']:.2f}x, generated tokens/s {ratio['generated_tokens_per_s']:.2f}x, "
          f"generation-phase tokens/s {ratio['generation_phase_tokens_per_s']:.2f}x, train time {ratio['train_time']:.2f}")
    print(f"load average before {load_before}, between {loads_between}, after {load_after}; "
          f"script wall {res['script_wall_s']:.0f}s")
    if not args.no_write:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_bench.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
        (out / "train_bench.md").write_text(to_markdown(res))
        print(f"wrote {out / 'train_bench.json'} and {out / 'train_bench.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
