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

The instruments that compare two systems (``benchmarks/train_bench.py``, ``rollout_bench.py``,
``experiments/time_to_accuracy.py``) share where they run: :func:`add_device_args` (``--device auto|cpu|cuda``,
``--dtype float32|bfloat16``), :func:`resolve_device`, :func:`precision` (what each arm runs at on that device),
:func:`instrument_meta` (device name, dtype, versions, load, command: recorded in every results file) and
:func:`same_weights` (a ``.gguf`` converted once, so both arms load the same Hugging Face directory).

Import it as ``from harness import ...``: ``python benchmarks/experiments/<driver>.py`` puts this folder first on
``sys.path`` (the instruments one folder up import it as ``from experiments.harness import ...``, theirs first); the package itself is installed (``pip install -e .``). ``grpo.py`` children get the checkout first
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


# ------------------------------------------------------------------------------------------------ where an instrument runs
#: ``--dtype``: the weights' dtype of both arms
DTYPES = ("float32", "bfloat16")
#: ``--device``: ``auto`` = cuda when available, else cpu
DEVICES = ("auto", "cpu", "cuda")


def add_device_args(parser) -> None:
    """``--device`` (:data:`DEVICES`, default ``auto``) and ``--dtype`` (:data:`DTYPES`, default ``float32``) on an
    ``argparse`` parser: both arms of the instrument run on that device with weights in that dtype."""
    parser.add_argument("--device", default="auto", choices=DEVICES,
                        help="device of both arms (auto: cuda when available, else cpu)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="weights' dtype of both arms")


def resolve_device(name: str) -> str:
    """``"cpu"`` or ``"cuda"`` for ``--device`` ``name`` (imports torch).

    Raises:
        SystemExit: ``name`` is not in :data:`DEVICES`, or ``cuda`` was asked and CUDA is not available.
    """
    import torch

    if name not in DEVICES:
        raise SystemExit(f"--device must be one of {DEVICES}, got {name!r}")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available here (torch.cuda.is_available() is False)")
    return name


def precision(device: str, dtype: str) -> dict:
    """What both arms run at on ``device`` (``cpu`` / ``cuda``) with ``dtype`` weights (:data:`DTYPES`).

    Our trainer loads the weights in ``actor.dtype`` and, on CUDA only, runs the update's forward passes under bf16
    autocast (:func:`torchrl_grpo.assembly.autocast_for`); its rollout backend samples at the weights' dtype. TRL gets the
    same weights' dtype and, on CUDA, ``bf16=True`` (accelerate's bf16 autocast: its mixed-precision mode, the one a
    TRL user runs on a GPU); on CPU ``bf16=False`` (no autocast, as ours). HF ``generate`` baselines sample at the
    weights' dtype, as our backend. Returns ``{"weights": dtype, "ours_autocast": "bf16" | None, "trl_bf16": bool}``.

    Raises:
        ValueError: ``dtype`` not in :data:`DTYPES` or ``device`` not ``cpu`` / ``cuda``.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda (resolve_device first), got {device!r}")
    cuda = device == "cuda"
    return {"weights": dtype, "ours_autocast": "bf16" if cuda else None, "trl_bf16": cuda}


def device_name(device: str) -> str:
    """``torch.cuda.get_device_name()`` on ``cuda``, else the CPU model from ``/proc/cpuinfo`` (``"cpu"`` when
    unreadable), with the core count."""
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(torch.cuda.current_device())
    cpu = "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu} x{os.cpu_count()}"


def instrument_meta(device: str, dtype: str) -> dict:
    """What every results file of a two-arm instrument records: ``device`` (cpu / cuda), ``device_name``,
    ``dtype``, ``precision`` (:func:`precision`), torch / transformers / trl / accelerate / torchrl-grpo versions,
    the 1/5/15-min load average now, this command line, the date and the commit."""
    return {"device": device, "device_name": device_name(device), "dtype": dtype, "precision": precision(device, dtype),
            "versions": package_versions(("torch", "transformers", "trl", "accelerate", "torchrl-grpo")),
            "loadavg": list(os.getloadavg()), "command": shlex.join([sys.executable, *sys.argv]), "date": utc_date(),
            "commit": git_commit(), "cpus": os.cpu_count()}


def meta_line(meta: dict) -> str:
    """One markdown line of :func:`instrument_meta`'s record (the line every ``.md`` result starts with)."""
    v = meta["versions"]
    return (f"Device: **{meta['device']}** ({meta['device_name']}), weights {meta['dtype']}, autocast ours "
            f"{meta['precision']['ours_autocast'] or 'none'} / TRL {'bf16' if meta['precision']['trl_bf16'] else 'none'}; "
            f"torch {v['torch']}, transformers {v['transformers']}, trl {v['trl']}; load {meta['loadavg'][0]:.2f}; "
            f"`{meta['command']}`")


def same_weights(spec: str) -> str:
    """The model spec both arms load for ``spec``: a ``.gguf`` file (or a directory holding one) becomes its cached
    Hugging Face conversion, made once (:func:`torchrl_grpo.model_store.loading.hf_model_dir`; TRL refuses a model loaded
    from a GGUF file); any other spec (alias, HF directory, hub id) is returned unchanged.

    Raises:
        ModelResolutionError: see :func:`torchrl_grpo.model_store.resolve_model_path`.
    """
    from torchrl_grpo.model_store.loading import hf_model_dir
    from torchrl_grpo.model_store.resolve import resolve_model_path

    return hf_model_dir(spec) if resolve_model_path(spec).gguf_file is not None else spec


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
