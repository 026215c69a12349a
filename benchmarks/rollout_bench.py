#!/usr/bin/env python
"""Rollout throughput of each backend as a ratio to plain HF ``generate``, same model, prompts and batch, one run.

Workloads (real prompts, rendered with the model's chat template):

* ``gsm8k``: ``--gsm8k-prompts`` GSM8K test questions x ``--samples`` samples each (GRPO groups).
* ``tau2``: the opening prompt of ``--tau2-tasks`` tau2 ``mock`` tasks (domain policy + tool schemas; a shared
  system prefix) x ``--samples`` samples — the multi-turn agent case, where prefix reuse matters.
* ``telecom`` (issue 12, target 2; its own model, ``--telecom-model``, default Qwen2.5-Coder-0.5B-Instruct: SmolLM2's
  8k context is too short): the real opening prompt of ``--telecom-tasks`` tau2 ``telecom`` small-split solo tasks
  (~9.9k tokens: solo policy, 44 tool schemas, ticket) x ``--samples`` samples, ``--telecom-max-new-tokens`` new
  tokens, one timed run per backend after a short-prompt warm-up (HF generate prefills every sample, so repeats are
  expensive). With ``--telecom-turns 2`` a second turn continues each episode: the sampled reply is stepped in the
  env and the env's answer appended token-in/token-out, so a prefix cache kept across turns prefills only the new
  tokens. Backends: HF generate, ours (shared-prefix KV cache kept across calls), vLLM with prefix caching off and on
  (all in ``--telecom-dtype``). Written to ``--out`` + ``_telecom.{json,md}``.

Backends: ``hf_generate`` (baseline: ``model.generate(do_sample=True)`` on the left-padded batch, the way a
plain HF loop or TRL samples), ``transformers`` (our :class:`TransformersBackend`: prefix-shared prefill, finished
rows dropped, behaviour log-probs returned), ``vllm_fp32`` / ``vllm_bf16`` (our :class:`VLLMBackend`, when vLLM is
importable — run this script from the vllm venv to include them).

Tokens/s counts sampled tokens up to and including the stop token (what a trainer gets), for every backend.
Each backend runs ``--repeats`` times after one warm-up; the median is reported. Results:
``benchmarks/results/rollout_bench.{json,md}``.

    GSM8K_DATA_DIR=<folder with train.jsonl/test.jsonl> python benchmarks/rollout_bench.py
    ... python benchmarks/rollout_bench.py --device cuda --dtype bfloat16 --workloads gsm8k --no-vllm --out <stem>

Device (issue 35): ``--device auto|cpu|cuda`` (auto: cuda when available) and ``--dtype float32|bfloat16``: HF
``generate`` and our backend sample on that device with weights in that dtype (no autocast for either); the results
record the device name, dtype, versions, load and command (``harness.instrument_meta``). A ``--model`` given as a
``.gguf`` file is converted once to a cached HF directory (the same weights as the trainers' benchmarks load).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

# the instruments' shared harness (device, metadata): the package experiments/ beside this script (benchmarks/ is
# sys.path[0] for ``python benchmarks/rollout_bench.py``)
from experiments.harness import add_device_args, instrument_meta, meta_line, resolve_device, same_weights  # noqa: E402

from torchrl_grpo.backends.base import SamplingConfig  # noqa: E402
from torchrl_grpo.backends.transformers_backend import TransformersBackend  # noqa: E402
from torchrl_grpo.rollout.chat_tokens import ChatRenderer  # noqa: E402
from torchrl_grpo.model_store import load_model_and_tokenizer, resolve_model_path  # noqa: E402


def gsm8k_prompts(tok, n: int) -> list[list[int]]:
    import gymnasium as gym

    import envs

    gym.register_envs(envs)
    env = gym.make("GSM8K-v1", split="test").unwrapped
    ren = ChatRenderer(tok)
    out = []
    for i in range(n):
        obs, _ = env.reset(options={"index": i})
        out.append(ren.prompt_ids(obs))
    return out


def tau2_prompts(tok, n: int) -> list[list[int]]:
    import gymnasium as gym

    import envs

    gym.register_envs(envs)
    env = gym.make("tau2/mock-v0", split="base", user="solo").unwrapped
    out, i = [], 0
    while len(out) < n and i < len(env.tasks):
        try:
            obs, info = env.reset(options={"index": i})
            out.append(ChatRenderer(tok, info["tools"]).prompt_ids(obs))
        except ValueError:
            pass
        i += 1
    return out


def telecom_prompts(tok, n: int) -> tuple[list[list[int]], list[int], object]:
    """Opening prompts of the first ``n`` usable telecom small-split solo tasks, their task indices, and the env."""
    import gymnasium as gym

    import envs

    gym.register_envs(envs)
    env = gym.make("tau2/telecom-v0", split="small", user="solo").unwrapped
    out, idx = [], []
    for i in env.usable_task_indices():
        if len(out) >= n:
            break
        obs, info = env.reset(options={"index": i})
        out.append(ChatRenderer(tok, info["tools"]).prompt_ids(obs))
        idx.append(i)
    return out, idx, env


def second_turn_prompts(env, tok, task_idx: list[int], prompts: list[list[int]], gens: list[list[int]]) -> list[list[int]]:
    """Each episode's prompt for its second turn: first prompt + sampled reply (closed with end-of-turn) + the
    env's answer to that reply (tool result, tool error or user message), rendered token-in/token-out."""
    import gymnasium as gym  # noqa: F401

    out = []
    for ti, p, g in zip(task_idx, prompts, gens):
        obs, info = env.reset(options={"index": ti})
        ren = ChatRenderer(tok, info["tools"])
        eot = ren.end_of_turn_ids()
        reply = list(g) if g and g[-1] in eot else list(g) + [tok.convert_tokens_to_ids("<|im_end|>")]
        text = tok.decode(reply, skip_special_tokens=True)
        obs2, _, term, trunc, _ = env.step(text)
        if term or trunc or not obs2:
            obs2 = [{"role": "user", "content": "Please go on."}]
        out.append(p + reply + ren.assistant_suffix + ren.continuation_ids(obs2))
    return out


def hf_generate_tokens(model, tok, prompts, sampling: SamplingConfig) -> tuple[int, list[list[int]]]:
    """HF generate on the batch (one left-padded batch when all prompts have the same length, else one call per
    prompt: a padded 10k-token batch would need an O(B L^2) attention mask). Returns (tokens, per-row tokens)."""
    groups = [prompts] if len({len(p) for p in prompts}) == 1 else [[p] for p in prompts]
    n, rows = 0, []
    stops = set(sampling.stop_token_ids)
    for grp in groups:
        P = len(grp[0])
        ids = torch.tensor(grp, dtype=torch.long, device=model.device)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                 temperature=sampling.temperature, top_p=sampling.top_p, top_k=0,
                                 max_new_tokens=sampling.max_new_tokens, eos_token_id=sampling.stop_token_ids,
                                 pad_token_id=tok.pad_token_id)
        for row in out[:, P:].tolist():
            kept = []
            for t in row:
                kept.append(t)
                if t in stops:
                    break
            n += len(kept)
            rows.append(kept)
    return n, rows


def run_telecom(args) -> None:
    """The telecom-length workload (see the module docstring); writes ``<out>_telecom.{json,md}``."""
    import transformers

    t_load = time.perf_counter()
    model, tok = load_model_and_tokenizer(args.telecom_model, dtype=args.telecom_dtype, device=args.device)
    print(f"loaded {args.telecom_model} ({args.telecom_dtype}) in {time.perf_counter() - t_load:.1f} s", flush=True)
    stop = sorted(ChatRenderer(tok).end_of_turn_ids())
    sampling = SamplingConfig(max_new_tokens=args.telecom_max_new_tokens, temperature=1.0, top_p=1.0,
                              stop_token_ids=stop, seed=0)
    warm = SamplingConfig(max_new_tokens=4, temperature=1.0, top_p=1.0, stop_token_ids=stop, seed=0)
    base_prompts, task_idx, env = telecom_prompts(tok, args.telecom_tasks)
    prompts = [p for p in base_prompts for _ in range(args.samples)]
    row_tasks = [t for t in task_idx for _ in range(args.samples)]
    short = [prompts[0][:64]]
    out = Path(str(args.out) + "_telecom")
    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "model": args.telecom_model, "dtype": args.telecom_dtype, "max_new_tokens": args.telecom_max_new_tokens,
        "tasks": task_idx, "samples": args.samples, "turns": args.telecom_turns,
        "prompt_tokens": [len(p) for p in base_prompts],
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "nproc": os.cpu_count(), "threads": torch.get_num_threads(), "loadavg_before": os.getloadavg(),
        **instrument_meta(args.device, args.telecom_dtype),
    }
    rows: list[dict] = []

    def record(turn: int, name: str, tokens: int, secs: float, prompt_lens: list[int], **extra) -> None:
        rows.append({"turn": turn, "backend": name, "tokens": tokens, "seconds": secs, "tokens_per_s": tokens / secs,
                     "prompt_tokens_mean": sum(prompt_lens) / len(prompt_lens), "loadavg": os.getloadavg(), **extra})
        print(f"telecom turn {turn} {name:18s} {tokens / secs:7.2f} tok/s  ({tokens} tokens, {secs:.1f} s)", flush=True)
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))

    # 1. HF generate (baseline) and ours, same model object
    use = set(args.telecom_backends.split(","))
    hf_generate_tokens(model, tok, short, warm)
    turn_prompts = {1: prompts}
    gens_for_turn2 = None
    if "hf_generate" in use:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        n, hf_rows = hf_generate_tokens(model, tok, prompts, sampling)
        record(1, "hf_generate", n, time.perf_counter() - t0, [len(p) for p in prompts])
    ours = TransformersBackend(model, pad_token_id=tok.pad_token_id)
    ours.generate(short, warm)
    ours._prefix = None
    t0 = time.perf_counter()
    gens = ours.generate(prompts, sampling)
    record(1, "transformers", sum(len(g.token_ids) for g in gens), time.perf_counter() - t0,
           [len(p) for p in prompts], prefilled_tokens=ours.stats["prefilled_tokens"])
    if args.telecom_turns == 2:
        gens_for_turn2 = [g.token_ids for g in gens]
        turn_prompts[2] = second_turn_prompts(env, tok, row_tasks, prompts, gens_for_turn2)
        p2 = turn_prompts[2]
        if "hf_generate" in use:
            torch.manual_seed(1)
            t0 = time.perf_counter()
            n, _ = hf_generate_tokens(model, tok, p2, sampling)
            record(2, "hf_generate", n, time.perf_counter() - t0, [len(p) for p in p2])
        before = ours.stats["prefilled_tokens"]
        t0 = time.perf_counter()
        g2 = ours.generate(p2, sampling)  # the turn-1 prefix cache is kept (same weights)
        record(2, "transformers", sum(len(g.token_ids) for g in g2), time.perf_counter() - t0, [len(p) for p in p2],
               prefilled_tokens=ours.stats["prefilled_tokens"] - before, prefix_hits=ours.stats["prefix_hits"])
    del ours, model
    # 2. vLLM without and with prefix caching (same prompts, turn 2 = the same continuation prompts as above)
    if not args.no_vllm and "vllm" in use:
        try:
            from torchrl_grpo.backends.vllm_backend import VLLMBackend
        except ImportError as exc:
            print(f"vLLM backend skipped: {exc}", file=sys.stderr)
        else:
            path = resolve_model_path(args.telecom_model).path
            max_len = max(len(p) for ps in turn_prompts.values() for p in ps) + args.telecom_max_new_tokens + 64
            for name, caching in (("vllm_no_prefix_cache", False), ("vllm_prefix_cache", True)):
                t0 = time.perf_counter()
                eng = VLLMBackend(path, tokenizer=tok, dtype=args.telecom_dtype, max_model_len=max_len, seed=0,
                                  kv_cache_memory_bytes=3 << 30, enable_prefix_caching=caching)
                startup = time.perf_counter() - t0
                eng.generate(short, warm)
                for turn, ps in sorted(turn_prompts.items()):
                    t0 = time.perf_counter()
                    n = sum(len(g.token_ids) for g in eng.generate(ps, sampling))
                    record(turn, name, n, time.perf_counter() - t0, [len(p) for p in ps], startup_s=startup)
                del eng
                import gc

                gc.collect()
    meta["loadavg_after"] = os.getloadavg()
    base = {r["turn"]: r["tokens_per_s"] for r in rows if r["backend"] == "hf_generate"}
    for r in rows:
        r["ratio_vs_hf_generate"] = r["tokens_per_s"] / base[r["turn"]] if r["turn"] in base else None
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [f"## Telecom length (issue 12, target 2): {args.telecom_model} {args.telecom_dtype}", "",
             f"`{meta['command']}` — {meta['date']}; tasks {task_idx} (prompt tokens {meta['prompt_tokens']}) x "
             f"{args.samples} samples, {args.telecom_max_new_tokens} new tokens, temperature 1.0, one timed run each "
             f"after a short warm-up; torch {meta['torch']}, transformers {meta['transformers']}, {meta['nproc']} cores, "
             f"{meta['threads']} threads; load avg before {', '.join(f'{x:.1f}' for x in meta['loadavg_before'])}, "
             f"after {', '.join(f'{x:.1f}' for x in meta['loadavg_after'])}", "",
             "| turn | backend | prompt tokens (mean) | generated tokens | seconds | tokens/s | x HF generate |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['turn']} | {r['backend']} | {r['prompt_tokens_mean']:.0f} | {r['tokens']} | {r['seconds']:.1f} | "
                     f"{r['tokens_per_s']:.2f} | " + ("—" if r['ratio_vs_hf_generate'] is None else f"{r['ratio_vs_hf_generate']:.2f}") + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}", flush=True)


def run_hf_generate(model, tok, prompts, sampling: SamplingConfig) -> int:
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), tok.pad_token_id, dtype=torch.long, device=model.device)
    am = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p, device=model.device)
        am[i, P - len(p):] = 1
    torch.manual_seed(sampling.seed or 0)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=am, do_sample=True, temperature=sampling.temperature,
                             top_p=sampling.top_p, top_k=0, max_new_tokens=sampling.max_new_tokens,
                             eos_token_id=sampling.stop_token_ids, pad_token_id=tok.pad_token_id)
    gen = out[:, P:]
    n = 0
    stops = set(sampling.stop_token_ids)
    for row in gen.tolist():
        for t in row:
            n += 1
            if t in stops:
                break
    return n


def timed(fn, repeats: int) -> tuple[float, float, int]:
    fn()  # warm-up
    rates, times, toks = [], [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        toks = fn()
        dt = time.perf_counter() - t0
        rates.append(toks / dt)
        times.append(dt)
    return statistics.median(rates), statistics.median(times), toks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    add_device_args(ap)
    ap.add_argument("--gsm8k-prompts", type=int, default=8)
    ap.add_argument("--tau2-tasks", type=int, default=2)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workloads", default="gsm8k,tau2")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--telecom-model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--telecom-tasks", type=int, default=1)
    ap.add_argument("--telecom-max-new-tokens", type=int, default=48)
    ap.add_argument("--telecom-turns", type=int, default=2, choices=(1, 2))
    ap.add_argument("--telecom-dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--telecom-backends", default="hf_generate,transformers,vllm",
                    help="subset of hf_generate,transformers,vllm (ours always generates turn 1 for turn 2's prompts)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rollout_bench"))
    args = ap.parse_args(argv)
    args.device = resolve_device(args.device)
    args.model = same_weights(args.model)  # a .gguf: its cached HF conversion (the trainers' benchmarks load it too)

    wls = args.workloads.split(",")
    if "telecom" in wls:
        run_telecom(args)
        wls = [w for w in wls if w != "telecom"]
        if not wls:
            return 0
    model, tok = load_model_and_tokenizer(args.model, dtype=args.dtype, device=args.device)
    stop = sorted(ChatRenderer(tok).end_of_turn_ids())
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0, stop_token_ids=stop, seed=0)
    vllm_engines = {}
    if not args.no_vllm:
        try:
            from torchrl_grpo.backends.vllm_backend import VLLMBackend

            path = resolve_model_path(args.model).path
            for dt in ("float32", "bfloat16"):  # vLLM: its own engine and device placement
                t0 = time.perf_counter()
                vllm_engines[f"vllm_{'fp32' if dt == 'float32' else 'bf16'}"] = (VLLMBackend(path, tokenizer=tok, dtype=dt, max_model_len=4096, seed=0), time.perf_counter() - t0)
        except ImportError as exc:
            print(f"vLLM backend skipped: {exc}", file=sys.stderr)
    ours = TransformersBackend(model, pad_token_id=tok.pad_token_id)
    results = []
    for wl in wls:
        base_prompts = gsm8k_prompts(tok, args.gsm8k_prompts) if wl == "gsm8k" else tau2_prompts(tok, args.tau2_tasks)
        prompts = [p for p in base_prompts for _ in range(args.samples)]
        rows = {}
        rate, secs, n = timed(lambda prompts=prompts: run_hf_generate(model, tok, prompts, sampling), args.repeats)
        rows["hf_generate"] = {"tokens_per_s": rate, "seconds": secs, "tokens": n}

        def ours_run(prompts=prompts):
            ours._prefix = None  # fair: no prefix reuse across repeats, only within a call
            return sum(len(g.token_ids) for g in ours.generate(prompts, sampling))

        rate, secs, n = timed(ours_run, args.repeats)
        rows["transformers"] = {"tokens_per_s": rate, "seconds": secs, "tokens": n}
        for name, (eng, startup) in vllm_engines.items():
            rate, secs, n = timed(lambda eng=eng, prompts=prompts: sum(len(g.token_ids) for g in eng.generate(prompts, sampling)),
                                  args.repeats)
            rows[name] = {"tokens_per_s": rate, "seconds": secs, "tokens": n, "startup_s": startup}
        base = rows["hf_generate"]["tokens_per_s"]
        for name, r in rows.items():
            r["ratio_vs_hf_generate"] = r["tokens_per_s"] / base
            print(f"{wl:6s} {name:13s} {r['tokens_per_s']:8.1f} tok/s  x{r['ratio_vs_hf_generate']:.2f}  "
                  f"({r['tokens']} tokens, {r['seconds']:.1f} s)")
        results.append({"workload": wl, "prompts": len(base_prompts), "samples": args.samples,
                        "prompt_tokens_mean": sum(map(len, base_prompts)) / len(base_prompts), "backends": rows})
    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": args.model, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
        "torch": torch.__version__, "python": platform.python_version(), "nproc": os.cpu_count(),
        "loadavg": os.getloadavg(), "threads": torch.get_num_threads(), **instrument_meta(args.device, args.dtype),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    lines = ["# Rollout throughput vs HF generate", "", f"`{meta['command']}` — model {args.model}, "
             f"{args.max_new_tokens} new tokens, temperature 1.0, torch {meta['torch']}, {meta['nproc']} cores, "
             f"load avg {', '.join(f'{x:.1f}' for x in meta['loadavg'])}", "", meta_line(meta), "",
             "| workload | prompts x samples | prompt tokens | device | backend | tokens/s | x HF generate |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        for name, b in r["backends"].items():
            lines.append(f"| {r['workload']} | {r['prompts']} x {r['samples']} | {r['prompt_tokens_mean']:.0f} | "
                         f"{meta['device_name']} ({args.dtype}) | {name} | "
                         f"{b['tokens_per_s']:.1f} | {b['ratio_vs_hf_generate']:.2f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
