#!/usr/bin/env python
"""The issue-35 table in one command: ours vs TRL on the device at hand, every row naming its device.

    # on a GPU machine (the lent image: through /work/shared/tools/gpu/run.sh, $MODEL = the converted HF dir)
    python benchmarks/gpu_table.py --model $MODEL --out $OUT/gpu_table
    # CPU smoke (tiny random model, a few tokens; what CI runs)
    python benchmarks/gpu_table.py --tiny --device cpu --out /tmp/gpu_table_smoke

Stages, in this order (the most informative first, so a budget cut loses the least), each its own process with its
own timeout (a failed or timed-out stage is a row saying so; the others still run), the table rewritten after each:

1. ``train_bench``: ``benchmarks/train_bench.py`` ours vs TRL at identical settings (GSM8K, interleaved steps);
2. ``time_to_accuracy`` base evaluation, then for seed 1: arms ``ours`` (its config's own micro-batching,
   ``--tta-micro-batch 0``: one pass per step on CUDA when it fits), ``trl`` (micro-batches of ``--micro-batch``, the
   earlier results' setting) and ``trl_same_mb`` (TRL with as many forward/backward passes per step as ours);
3. the default run: ``python grpo.py actor.path=<model>`` (its own config, ``--default-steps`` steps);
4. ``time_to_accuracy`` seeds 2 .. ``--seeds`` (all three arms), then its ``summary``.

``--budget-s`` (default 480 s) is the whole table's wall-clock budget: a stage gets ``min(its timeout, what is
left)`` and a stage that cannot start with ``--min-stage-s`` left is recorded as not run. Outputs under ``--out``:
``table.md`` (the table), ``table.json`` (its numbers), ``logs/<stage>.log`` and each instrument's own results
(``train_bench.{json,md}``, ``tta/`` with ``time_to_accuracy.{md,json}``, ``default_run/metrics.jsonl``).
Device, dtype and versions come from the instruments' own records (``harness.instrument_meta``).

Targets (issue 35): our step >= 2x TRL's at identical settings and against ``trl_same_mb``; time to the 0.36 target
>= 2x sooner. The table states each ratio; it does not judge it.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

# the instruments' shared harness: the package experiments/ beside this script (benchmarks/ is sys.path[0] for
# ``python benchmarks/gpu_table.py``)
from experiments.harness import child_env, instrument_meta, read_metrics, resolve_device, same_weights

REPO = Path(__file__).resolve().parents[1]

TTA = REPO / "benchmarks" / "experiments" / "time_to_accuracy.py"
ARMS = ("ours", "trl", "trl_same_mb")

#: settings of ``--tiny``: a tiny random model and a few tokens, for a CPU smoke of every stage
TINY = {"model": "tiny-random", "train_bench": ["--warmup", "0", "--steps", "1", "--prompts", "1", "--samples", "2",
                                                "--max-new-tokens", "8", "--micro-batch", "2"],
        "tta": ["--steps", "2", "--prompts", "2", "--samples", "2", "--max-new-tokens", "8", "--micro-batch", "2",
                "--eval-every", "1", "--n-eval", "4"],
        "default": ["train.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=8", "eval.n_problems=4",
                    "econfig.train_size=20", "econfig.test_size=8"]}


class Table:
    """The table's rows, rewritten to ``out/table.{md,json}`` after every stage."""

    def __init__(self, out: Path, meta: dict, args) -> None:
        self.out, self.meta, self.args, self.rows = out, meta, args, []
        self.t0 = time.time()

    def add(self, **row) -> None:
        self.rows.append(row)
        self.write()

    def write(self) -> None:
        (self.out / "table.json").write_text(json.dumps({"meta": self.meta, "rows": self.rows,
                                                         "elapsed_s": time.time() - self.t0}, indent=1, default=str))
        m, v = self.meta, self.meta["versions"]
        lines = ["# ours vs TRL on the device at hand (issue 35)", "",
                 f"`{m['command']}` ({m['date']}, commit {m['commit'][:10]}); device {m['device']} "
                 f"({m['device_name']}), weights {m['dtype']}; torch {v['torch']}, transformers {v['transformers']}, "
                 f"trl {v['trl']}; {m['cpus']} CPUs; load at start {m['loadavg'][0]:.2f}; "
                 f"{time.time() - self.t0:.0f} s so far of a {self.args.budget_s:.0f} s budget.", "",
                 "| stage | device | status | wall (s) | ours | TRL | ratio TRL/ours | notes |",
                 "|---|---|---|---:|---|---|---:|---|"]
        for r in self.rows:
            lines.append(f"| {r['stage']} | {r.get('device', m['device_name'])} | {r['status']} | {r.get('wall_s', 0):.0f} "
                         f"| {r.get('ours', '')} | {r.get('trl', '')} | {r.get('ratio', '')} | {r.get('notes', '')} |")
        (self.out / "table.md").write_text("\n".join(lines) + "\n")


def run_stage(name: str, cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> tuple[str, float]:
    """Run ``cmd`` in the checkout with ``timeout`` seconds, output appended to ``log``; ``(status, wall s)`` with
    status ``ok``, ``failed (exit N)`` or ``timed out``. Never raises for the command's own failure."""
    t0 = time.time()
    with open(log, "a") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        print(f"[gpu_table] {name}: {shlex.join(cmd)} (timeout {timeout:.0f} s)", flush=True)
        try:
            rc = subprocess.run(cmd, cwd=REPO, env=env or child_env(), stdout=f, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
            status = "ok" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            status = "timed out"
    wall = time.time() - t0
    print(f"[gpu_table] {name}: {status} in {wall:.0f} s", flush=True)
    return status, wall


def _tail(log: Path, n: int = 3) -> str:
    try:
        lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return " / ".join(lines[-n:])[-300:].replace("|", "\\|")


def _f(x, fmt="{:.2f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="alias, HF dir or .gguf (converted once)")
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--tiny", action="store_true", help="tiny random model, a few tokens: a quick smoke of every stage")
    p.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget of the whole table (s)")
    p.add_argument("--min-stage-s", type=float, default=20.0, help="a stage needs at least this much budget left")
    p.add_argument("--seeds", type=int, default=3, help="time_to_accuracy seeds")
    p.add_argument("--tta-steps", type=int, default=8, help="time_to_accuracy steps per run")
    p.add_argument("--tta-eval-every", type=int, default=4)
    p.add_argument("--n-eval", type=int, default=200, help="held-out problems per evaluation")
    p.add_argument("--micro-batch", type=int, default=4,
                   help="train_bench: both arms' micro-batch (identical settings); time_to_accuracy: the trl arm's")
    p.add_argument("--tta-micro-batch", type=int, default=0,
                   help="time_to_accuracy: our arm's micro-batch (0: our config's own micro-batching)")
    p.add_argument("--default-steps", type=int, default=16, help="steps of the default grpo.py run")
    p.add_argument("--bench-steps", type=int, default=3, help="train_bench timed steps (after 1 warm-up)")
    p.add_argument("--stage-timeout-s", type=float, default=240.0, help="timeout of any one stage (s)")
    a = p.parse_args(argv)

    out = Path(a.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    device = resolve_device(a.device)
    model = same_weights(TINY["model"] if a.tiny else a.model)  # a .gguf: converted once, every stage loads the dir
    meta = {**instrument_meta(device, a.dtype), "model": a.model if not a.tiny else TINY["model"], "model_path": model}
    table = Table(out, meta, a)
    deadline = time.time() + a.budget_s
    py = sys.executable
    env = child_env()
    env.setdefault("GSM8K_DATA_DIR", "")
    if not env["GSM8K_DATA_DIR"]:
        from envs.gsm8k.data import PACKAGED_DATA_DIR

        env["GSM8K_DATA_DIR"] = str(PACKAGED_DATA_DIR)
    dev = ["--device", device, "--dtype", a.dtype]

    def budget(name: str) -> float | None:
        left = deadline - time.time()
        if left < a.min_stage_s:
            table.add(stage=name, status=f"not run ({left:.0f} s of budget left)")
            return None
        return min(a.stage_timeout_s, left)

    # 1. train_bench
    t = budget("train_bench")
    if t:
        extra = TINY["train_bench"] if a.tiny else ["--warmup", "1", "--steps", str(a.bench_steps),
                                                    "--micro-batch", str(a.micro_batch)]
        log = out / "logs" / "train_bench.log"
        st, wall = run_stage("train_bench", [py, str(REPO / "benchmarks" / "train_bench.py"), "--model", model, *dev,
                                             *extra, "--out-dir", str(out)], log, t, env)
        row = {"stage": "train_bench (GSM8K, identical settings)", "status": st, "wall_s": wall}
        res = out / "train_bench.json"
        if st == "ok" and res.is_file():
            r = json.loads(res.read_text())
            o, tr = r["ours"]["summary"], r["trl"]["summary"]
            row.update(device=r["meta"]["device_name"], ours=f"step {o['step_s_mean']:.2f} s",
                       trl=f"step {tr['step_s_mean']:.2f} s", ratio=f"**{tr['step_s_mean'] / o['step_s_mean']:.2f}x**",
                       notes=f"{r['settings']['prompts']}x{r['settings']['samples']} per step, micro-batch "
                             f"{r['settings']['micro_batch']}, {r['settings']['max_new_tokens']} new tokens; "
                             f"completions/s ours/TRL {r['ratio_ours_over_trl']['completions_per_s']:.2f}x")
        else:
            row["notes"] = _tail(log)
        table.add(**row)

    # 2-4. time_to_accuracy (base, seed 1) / default run / seeds 2..n
    root = out / "tta"
    tta_args = ["--out-root", str(root), "--model", model, *dev]
    tta_args += TINY["tta"] if a.tiny else ["--steps", str(a.tta_steps), "--eval-every", str(a.tta_eval_every),
                                            "--n-eval", str(a.n_eval), "--micro-batch", str(a.tta_micro_batch)]
    tlog = out / "logs" / "time_to_accuracy.log"
    base_ok = False
    t = budget("time_to_accuracy base")
    if t:
        st, wall = run_stage("tta base", [py, str(TTA), "base", *tta_args], tlog, t, env)
        base_ok = st == "ok"
        row = {"stage": "time_to_accuracy base (step 0)", "status": st, "wall_s": wall}
        if base_ok:
            ev = json.loads((root / "base" / "result.json").read_text())["eval"]
            row["notes"] = f"greedy accuracy {ev['accuracy']:.3f} on {ev['n']} held-out problems"
        else:
            row["notes"] = _tail(tlog)
        table.add(**row)

    def tta_seed(seed: int) -> None:
        for arm in ARMS:
            t = budget(f"time_to_accuracy {arm} seed {seed}")
            if not t:
                continue
            if not base_ok:
                table.add(stage=f"time_to_accuracy {arm} seed {seed}", status="not run (no base evaluation)")
                continue
            st, wall = run_stage(f"tta {arm} {seed}", [py, str(TTA), "run", "--arm", arm, "--seed", str(seed), *tta_args,
                                                       "--trl-micro-batch", str(a.micro_batch)], tlog, t, env)
            row = {"stage": f"time_to_accuracy {arm} seed {seed}", "status": st, "wall_s": wall}
            res = root / arm / f"seed{seed}" / "result.json"
            if st == "ok" and res.is_file():
                r = json.loads(res.read_text())
                med = statistics.median(s["step_s"] for s in r["steps"])
                cell = (f"step {med:.2f} s; acc. " + ", ".join(f"{e['step']}: {e['accuracy']:.3f}" for e in r["evals"]))
                row.update(device=r.get("device_name", ""), **{"ours" if arm == "ours" else "trl": cell})
                if arm == "trl_same_mb" and r.get("our_passes"):
                    row["notes"] = (f"our passes/step {r['our_passes']['passes']} ({r['our_passes']['source']}): TRL "
                                    f"micro-batch {r['trl_args']['per_device_train_batch_size']}")
                elif arm == "trl":
                    row["notes"] = f"TRL micro-batch {r['trl_args']['per_device_train_batch_size']}"
            else:
                row["notes"] = _tail(tlog)
            table.add(**row)

    tta_seed(1)

    t = budget("default run")
    if t:
        run_dir = out / "default_run"
        over = [f"actor.path={model}", f"train.device={device}", f"actor.dtype={a.dtype}",
                f"train.steps={a.default_steps}", "checkpoint.every=0", "checkpoint.save_final=false",
                "stats_logger.progress_bar=false", f"hydra.run.dir={run_dir}"] + (TINY["default"] if a.tiny else [])
        log = out / "logs" / "default_run.log"
        st, wall = run_stage("default run", [py, str(REPO / "grpo.py"), *over], log, t, env)
        rows = read_metrics(run_dir)
        steps = [float(r["time/step_s"]) for r in rows if "time/step_s" in r]
        evs = [(int(r.get("step", 0)), float(r["eval/accuracy"])) for r in rows if "eval/accuracy" in r]
        table.add(stage=f"default run: python grpo.py actor.path=<model> ({a.default_steps} steps)", status=st,
                  wall_s=wall, ours=(f"median step {statistics.median(steps):.2f} s, {len(steps)} steps" if steps else ""),
                  notes=("greedy accuracy " + " -> ".join(f"{acc:.3f} (step {s})" for s, acc in evs)) if evs
                  else _tail(log))

    for seed in range(2, a.seeds + 1):
        tta_seed(seed)

    if base_ok and any(root.glob("*/seed*/result.json")):
        log = out / "logs" / "summary.log"
        st, wall = run_stage("tta summary", [py, str(TTA), "summary", str(root), "--write",
                                             str(out / "time_to_accuracy")], log, 120, env)
        row = {"stage": "time_to_accuracy summary (medians over seeds)", "status": st, "wall_s": wall}
        res = out / "time_to_accuracy.json"
        if st == "ok" and res.is_file():
            s = json.loads(res.read_text())
            o = s["arms"]["ours"]
            parts = []
            for arm in ARMS[1:]:
                if arm in s["arms"]:
                    v = s["arms"][arm]
                    parts.append(f"{arm}: step {_f(v['step_s'].get('median'))} s, reached {v['reached']}/{v['runs']}, "
                                 f"to target {_f(v['time_to_target_min'].get('median'), '{:.2f}')} min; step ratio "
                                 f"{_f(s['ratios_step_s'].get(arm))}x, time-to-target ratio "
                                 f"{_f(s['ratios_time_to_target'].get(arm))}x")
            row.update(device=s.get("device") or "", ours=f"step {_f(o['step_s'].get('median'))} s, reached "
                       f"{o['reached']}/{o['runs']}, to target {_f(o['time_to_target_min'].get('median'))} min",
                       trl="; ".join(parts), ratio="time to target " + _f(s.get("ratio_trl_over_ours"), "**{:.2f}x**"),
                       notes=f"target {s['target']}; base {s['base']['accuracy']:.3f}")
        else:
            row["notes"] = _tail(log)
        table.add(**row)
    table.write()
    print((out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
