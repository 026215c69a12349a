#!/usr/bin/env python
"""Peak RSS of one GRPO forward+backward micro-batch vs its padded size (rows x tokens): the table behind the
``train.max_tokens_per_mb`` default of ``configs/grpo_tau2.yaml``.

    python benchmarks/microbatch_memory_probe.py                       # Qwen2.5-Coder-0.5B, bf16, grad ckpt, LoRA r=16
    python benchmarks/microbatch_memory_probe.py --sizes 1x1024 1x2048 2x2048 1x4096 --model qwen2.5-coder-0.5b-instruct

Each size runs in a fresh subprocess: load the model (LoRA r=16 on all linear layers, gradient checkpointing — the
tau2 config's setting), record RSS after loading and reset the kernel's peak-RSS mark, then one
``GRPOLoss`` forward + backward over ``rows`` random episodes of ``tokens`` tokens each (the last 300 are the
response), and print the peak. The baseline is the same process after loading, so "update GB" = peak - loaded.
Results: ``benchmarks/results/<--out, default microbatch_memory>.{json,md}`` with the command, versions and load average.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _status_gb(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak since start or since the last reset) of this process, in GB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1e6
    return float("nan")


def _reset_peak() -> None:
    """Reset the kernel's peak-RSS mark (``VmHWM``) to the current RSS (Linux >= 4.0: ``clear_refs`` value 5), so the
    peak measured next is the update's, not the model loading's (loading casts through a larger transient)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def child(model_name: str, dtype: str, gc: bool, rows: int, tokens: int) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from tensordict import TensorDict

    from torchrl_grpo.objectives.loss import GRPOLoss, total_loss
    from torchrl_grpo.model_store import load_model_and_tokenizer

    model, _tok = load_model_and_tokenizer(model_name, dtype=dtype)
    if gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    import gc as _gc

    _gc.collect()
    loaded = _status_gb("VmRSS")
    _reset_peak()
    rlen = min(300, tokens - 1)
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(100, 20000, (rows, tokens), generator=g)
    am = torch.ones_like(toks, dtype=torch.bool)
    rm = am.clone()
    rm[:, : tokens - rlen] = False
    td = TensorDict(tokens=toks, attention_mask=am, response_mask=rm, sample_log_probs=-torch.rand(rows, tokens),
                    advantage=torch.randn(rows), batch_size=[rows])
    model.train()
    t0 = time.perf_counter()
    total_loss(GRPOLoss(model)(td)).backward()
    dt = time.perf_counter() - t0
    peak = _status_gb("VmHWM")
    return {"rows": rows, "tokens": tokens, "padded_tokens": rows * tokens, "loaded_gb": round(loaded, 2),
            "peak_gb": round(peak, 2), "update_gb": round(peak - loaded, 2), "fwd_bwd_s": round(dt, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-gc", action="store_true", help="without gradient checkpointing")
    ap.add_argument("--sizes", nargs="+", default=["1x1024", "2x1024", "1x2048", "1x4096"], help="ROWSxTOKENS")
    ap.add_argument("--out", default="microbatch_memory", help="results name under benchmarks/results/")
    ap.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.dtype, not args.no_gc, *args.child)))
        return
    rows_out = []
    for size in args.sizes:
        r, t = (int(x) for x in size.lower().split("x"))
        cmd = [sys.executable, __file__, "--model", args.model, "--dtype", args.dtype, "--child", str(r), str(t)]
        if args.no_gc:
            cmd.append("--no-gc")
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"{size}: failed (exit {p.returncode}): {p.stderr[-500:]}", file=sys.stderr)
            rows_out.append({"rows": r, "tokens": t, "error": f"exit {p.returncode}"})
            continue
        res = json.loads(p.stdout.strip().splitlines()[-1])
        print(res, flush=True)
        rows_out.append(res)
    import torch
    import transformers

    meta = {"command": "python benchmarks/microbatch_memory_probe.py " + " ".join(sys.argv[1:]),
            "model": args.model, "dtype": args.dtype, "gradient_checkpointing": not args.no_gc,
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "threads": os.environ.get("OMP_NUM_THREADS", "default"), "loadavg": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"meta": meta, "rows": rows_out}, indent=2))
    ok = [x for x in rows_out if "error" not in x]
    lines = [f"# Micro-batch peak memory vs padded tokens ({args.model}, {args.dtype}, "
             f"{'no ' if args.no_gc else ''}gradient checkpointing, LoRA r=16)", "",
             f"Command: `{meta['command']}` ({meta['date']}; torch {meta['torch']}, transformers "
             f"{meta['transformers']}; OMP threads {meta['threads']}; load average {meta['loadavg']})", "",
             "| rows x tokens | padded tokens | RSS after load GB | peak RSS GB | update GB (peak - load) | fwd+bwd s |",
             "|---|---|---|---|---|---|"]
    for x in rows_out:
        if "error" in x:
            lines.append(f"| {x['rows']}x{x['tokens']} | {x['rows'] * x['tokens']} | | {x['error']} | | |")
        else:
            lines.append(f"| {x['rows']}x{x['tokens']} | {x['padded_tokens']} | {x['loaded_gb']} | {x['peak_gb']} | "
                         f"{x['update_gb']} | {x['fwd_bwd_s']} |")
    if len(ok) >= 2:
        import numpy as np

        slope, icpt = np.polyfit([x["padded_tokens"] for x in ok], [x["update_gb"] for x in ok], 1)
        lines += ["", f"Least-squares fit: update GB ≈ {icpt:.2f} + {slope * 1000:.3f} x (padded tokens / 1000)."]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
