"""The run / summary harness every experiment driver of ``benchmarks/experiments/`` shares.

A driver (``gsm8k_vs_trl.py``, ``tau2_sft_table.py``, ``time_to_accuracy.py``, ``default_run_seeds.py``, the
``*_summary.py`` tables) is three steps, each its own process so that a table can be built across sessions:

1. **run**: one ``grpo.py`` / ``sft.py`` process per (arm or stage, seed) with :func:`run_logged` (command line and
   output appended to the run's ``run.log``; pinned by ``taskset`` and thread-limited when asked), then a
   ``result.json`` with the run's evaluations (:func:`read_metrics`, :func:`evaluations`, :func:`final_eval`) and its
   metadata (:func:`git_commit`, :func:`process_meta`, :func:`package_versions`, :func:`utc_date`, load average);
2. **load**: the ``result.json`` files under one root (:func:`load_json`), refusing results whose budgets differ
   (:func:`budget_diff`);
3. **summary**: a markdown table with the intervals of :mod:`stats`, its numbers as JSON and a PNG
   (:func:`write_outputs`, :func:`pyplot`).

Import it as ``from harness import ...``: ``python benchmarks/experiments/<driver>.py`` puts this folder first on
``sys.path``; the package itself is installed (``pip install -e .``). ``grpo.py`` children get the checkout first
on ``PYTHONPATH`` (:func:`child_env`), so that ``--py`` another interpreter (the vLLM venv) runs this checkout's code.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

#: the checkout root (``benchmarks/experiments/`` is two levels below it)
REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------ running
def child_env(threads: int = 0) -> dict:
    """The environment of a child ``grpo.py`` / ``sft.py``: this checkout first on ``PYTHONPATH``, tokenizers'
    parallelism and wandb off (unless set), ``OMP/MKL_NUM_THREADS = threads`` when ``threads`` > 0."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("WANDB_MODE", "disabled")
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def run_logged(cmd: list[str], log: Path, *, cores: str | None = None, threads: int = 0) -> float:
    """Run ``cmd`` (``[interpreter, script, ...]``) in the checkout, pinned with ``taskset -c cores`` when ``cores``
    is given and with ``threads`` OMP/MKL threads (0: leave as is), appending ``$ <command line>`` and its output
    (stdout + stderr) to ``log``; returns its wall seconds.

    Raises:
        RuntimeError: the command exited non-zero; the message names the script and holds the log's last 20 lines.
    """
    script = Path(cmd[1]).name
    cmd = (["taskset", "-c", cores] if cores else []) + list(cmd)
    t0 = time.time()
    with open(log, "a") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        rc = subprocess.run(cmd, cwd=REPO, env=child_env(threads), stdout=f, stderr=subprocess.STDOUT,
                            check=False).returncode
    if rc != 0:
        tail = "".join(log.read_text().splitlines(True)[-20:])
        raise RuntimeError(f"{script} exited {rc}; {log}:\n{tail}")
    return time.time() - t0


# ------------------------------------------------------------------------------------------------ TRL arms
def trl_prompt_order(seed: int, n_train: int, n: int) -> list[int]:
    """The train problems TRL gets, in order (an unshuffled dataset): the first ``n`` of the permutation our trainer
    draws its epoch-0 prompts from (:meth:`torchrl_grpo.training.grpo_trainer.GRPOTrainer.tasks_for_step`,
    ``default_rng([seed, epoch])``), so both arms train on the same problems in the same order at a given seed
    (a paired comparison; tests/test_experiments_harness.py checks it against the trainer's own method).

    Raises:
        ValueError: ``n > n_train`` (the budget would need a second epoch).
    """
    import numpy as np

    if n > n_train:
        raise ValueError(f"the budget needs {n} train problems, the split has {n_train} (one epoch only)")
    return [int(i) for i in np.random.default_rng([seed, 0]).permutation(n_train)[:n]]


# ------------------------------------------------------------------------------------------------ a run's metrics
def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of ``run_dir/metrics.jsonl`` (the trainer's per-step log), ``[]`` when the file is not there."""
    p = Path(run_dir) / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.is_file() else []


def evaluations(rows: list[dict]) -> list[dict]:
    """Every evaluation in ``rows``, in order: ``{"step", "accuracy" (eval/accuracy), "n" (eval/n_tasks)}``; a row
    without a step counts as step 0 and one without ``eval/n_tasks`` as n = 0."""
    return [{"step": int(r.get("step", 0)), "accuracy": float(r["eval/accuracy"]), "n": int(r.get("eval/n_tasks", 0))}
            for r in rows if "eval/accuracy" in r]


def last_eval_row(rows: list[dict]) -> dict:
    """The last row holding ``eval/accuracy`` (the run's final evaluation), as logged.

    Raises:
        RuntimeError: no evaluation in the metrics.
    """
    ev = [r for r in rows if "eval/accuracy" in r]
    if not ev:
        raise RuntimeError("no eval/accuracy in metrics.jsonl")
    return ev[-1]


def final_eval(rows: list[dict]) -> dict:
    """The final evaluation: accuracy, n (``eval/n_tasks``, 0 if not logged), seconds and generated tokens/s.

    Raises:
        RuntimeError: no evaluation in the metrics.
    """
    e = last_eval_row(rows)
    return {"accuracy": float(e["eval/accuracy"]), "n": int(e.get("eval/n_tasks", 0)), "time_s": e.get("eval/time_s"),
            "tokens_per_s": e.get("eval/tokens_per_s")}


# ------------------------------------------------------------------------------------------------ metadata
def git_commit() -> str:
    """``git rev-parse HEAD`` of the checkout ("" when git is missing or this is no git checkout)."""
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        return ""


def utc_date() -> str:
    """Now, ``"2026-11-25 22:14:02 UTC"``."""
    return time.strftime("%F %T UTC", time.gmtime())


def package_versions(packages: tuple[str, ...]) -> dict:
    """``{distribution: version or None}`` of the installed ``packages``."""
    out = {}
    for p in packages:
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = None
    return out


def device() -> str:
    """``"cuda: <name>"`` of GPU 0 when CUDA is available, else ``"cpu x<cores>"`` (imports torch)."""
    import torch

    return "cuda: " + torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu x{os.cpu_count()}"


def process_meta(cores: str | None, threads: int, backend: str | None) -> dict:
    """What a ``result.json`` records about the process that made it: commit, this command line, date, device,
    pinning, threads, rollout backend and the 1/5/15-min load average at the start."""
    return {"commit": git_commit(), "command": shlex.join([sys.executable, *sys.argv]), "date": utc_date(),
            "device": device(), "cores": cores, "threads": threads, "backend": backend,
            "loadavg_start": os.getloadavg()}


# ------------------------------------------------------------------------------------------------ results
def budget_diff(ref: dict, other: dict, keys: tuple[str, ...]) -> list[str]:
    """The ``keys`` whose values differ between two recorded budgets (a key missing on one side differs)."""
    return [k for k in keys if other.get(k) != ref.get(k)]


def load_json(paths) -> list[dict]:
    """The parsed ``result.json`` files of ``paths`` (an iterable of paths), skipping those that do not exist."""
    return [json.loads(Path(p).read_text()) for p in paths if Path(p).is_file()]


def write_outputs(stem: str | Path, md: str, summary: dict, draw: Callable[[Path], object]) -> None:
    """``stem``.md (``md``), .json (``summary``) and .png (``draw(path)``), creating the folder."""
    w = Path(stem)
    w.parent.mkdir(parents=True, exist_ok=True)
    w.with_suffix(".md").write_text(md)
    w.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    draw(w.with_suffix(".png"))


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (the drivers only write PNG files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
