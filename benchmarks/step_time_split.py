#!/usr/bin/env python
"""Where a GRPO step's time goes, from a run's ``metrics.jsonl`` (issue 48 item 4): a markdown table per run.

    python benchmarks/step_time_split.py RUN_DIR [RUN_DIR ...] [--skip-first 1]

``RUN_DIR`` is a run directory holding ``metrics.jsonl`` (or the file itself). Training rows are those with
``time/step_s``; ``--skip-first N`` leaves out each run's first N of them (the first step also builds the env pool
and warms the kernels up). Per row of the table: mean and median over the steps, and for the times the share of the
step, sum(part) / sum(step) over the same steps:

- generation ``rollout/generate_time_s``: the rollout backend's ``generate`` calls;
- env ``rollout/env_time_s``: resets, env steps with their grading and customer replies, decoding the actions and
  the replies' token ids;
- update ``time/train_s``: the optimizer side (recomputes, forward/backward passes, optimizer steps);
- weight sync ``time/sync_s``; other: the step minus those four (advantages, group filters, sample logging,
  building the batch). In async mode (rows with ``async/staleness``) collection overlaps the update, so the parts
  are not a split of the step: "other" is left out and the trainer's wait for a batch (``async/wait_s``) shown.

Then the tokens (generated; trained: real, padded, response), the update's model FLOPs, its FLOP/s, this machine's
matmul peak measured in the run's process and the ratio, MFU (docs/metrics.md, ``torchrl_grpo/reporting/flops.py``).
A metric a run did not log shows as "-". Reads files only (no torch import).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

#: (label, metrics.jsonl key): the parts of the step's time
TIMES = (
    ("generation", "rollout/generate_time_s"),
    ("env (reset, step, grading)", "rollout/env_time_s"),
    ("update (forward/backward, optimizer)", "time/train_s"),
    ("weight sync", "time/sync_s"),
)
#: (label, key, unit) of the work rows
WORK = (
    ("tokens generated (sampled)", "rollout/generated_tokens", "tokens"),
    ("tokens trained, real (attention mask)", "train/tokens", "tokens"),
    ("tokens trained, padded (rows x width)", "train/tokens_padded", "tokens"),
    ("tokens trained, response (loss)", "num_tokens", "tokens"),
    ("decoder positions run by the update", "perf/update_decoder_tokens", "tokens"),
    ("update model FLOPs", "perf/update_flops", "FLOP"),
    ("update achieved FLOP/s", "perf/update_flops_per_s", "FLOP/s"),
    ("matmul peak FLOP/s (same process, update's shapes)", "perf/matmul_peak_flops_per_s", "FLOP/s"),
    ("update MFU (achieved / peak)", "perf/update_mfu", "fraction"),
)


def read_rows(path: Path) -> list[dict]:
    """The training rows (with ``time/step_s``) of ``path`` (a run dir or its ``metrics.jsonl``), in file order.

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` there. ValueError: a line that is not a JSON object (its number
            is named).
    """
    f = path / "metrics.jsonl" if path.is_dir() else path
    if not f.is_file():
        raise FileNotFoundError(f"no metrics.jsonl at {path}")
    rows = []
    for n, line in enumerate(f.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{f}:{n}: not a JSON line ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{f}:{n}: not a JSON object")
        if _num(row.get("time/step_s")) is not None:
            rows.append(row)
    return rows


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def _values(rows: list[dict], key: str) -> list[float]:
    return [x for x in (_num(r.get(key)) for r in rows) if x is not None]


def _si(x: float | None, unit: str = "") -> str:
    """``x`` with 3 significant digits and an SI prefix for large values (``1.23 G``); "-" for None."""
    if x is None:
        return "-"
    if unit == "fraction":
        return f"{x:.4f}"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}"
    return f"{x:.3g}"


def _stats(xs: list[float]) -> tuple[float | None, float | None]:
    return (statistics.fmean(xs), statistics.median(xs)) if xs else (None, None)


def split(rows: list[dict]) -> dict:
    """The numbers of the table for ``rows`` (training rows): ``{"steps", "async", "times": [(label, key, mean,
    median, share)], "work": [(label, key, unit, mean, median)]}``; share = sum(part) / sum(step) over the rows
    that have both (None when none has)."""
    is_async = any("async/staleness" in r for r in rows)
    step_total = sum(_values(rows, "time/step_s"))
    times = []
    parts = list(TIMES) + ([("trainer wait for a batch (async)", "async/wait_s")] if is_async else [])
    for label, key in parts:
        xs = _values(rows, key)
        both = [(_num(r.get(key)), _num(r["time/step_s"])) for r in rows if _num(r.get(key)) is not None]
        share = sum(a for a, _ in both) / sum(b for _, b in both) if both and sum(b for _, b in both) > 0 else None
        times.append((label, key, *_stats(xs), share))
    if not is_async:
        other = []
        for r in rows:
            got = [_num(r.get(k)) for _, k in TIMES]
            if all(g is not None for g in got):
                other.append(_num(r["time/step_s"]) - sum(got))
        share = sum(other) / step_total if other and step_total > 0 else None
        times.append(("other (advantages, filters, batch)", None, *_stats(other), share))
    times.append(("step", "time/step_s", *_stats(_values(rows, "time/step_s")), 1.0 if rows else None))
    work = [(label, key, unit, *_stats(_values(rows, key))) for label, key, unit in WORK]
    return {"steps": len(rows), "async": is_async, "times": times, "work": work}


def table(name: str, rows: list[dict]) -> str:
    """The markdown table of one run (module docstring)."""
    s = split(rows)
    out = [f"### {name}: {s['steps']} step(s){' (async: parts overlap)' if s['async'] else ''}", "",
           "| part | mean | median | share of step |", "| --- | ---: | ---: | ---: |"]
    for label, key, mean, med, share in s["times"]:
        lab = f"{label} (`{key}`)" if key else label
        out.append(f"| {lab}, s | {_si(mean)} | {_si(med)} | {'-' if share is None else f'{100 * share:.1f}%'} |")
    out += ["", "| work per step | mean | median |", "| --- | ---: | ---: |"]
    for label, key, unit, mean, med in s["work"]:
        out.append(f"| {label} (`{key}`), {unit} | {_si(mean, unit)} | {_si(med, unit)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run dirs (or metrics.jsonl files)")
    p.add_argument("--skip-first", type=int, default=0, help="leave out each run's first N training steps")
    a = p.parse_args(argv)
    if a.skip_first < 0:
        p.error("--skip-first must be >= 0")
    status = 0
    for run in a.runs:
        try:
            rows = read_rows(run)[a.skip_first:]
        except (OSError, ValueError) as exc:
            print(f"{run}: {exc}", file=sys.stderr)
            status = 1
            continue
        if not rows:
            print(f"{run}: no training steps with time/step_s (after --skip-first {a.skip_first})", file=sys.stderr)
            status = 1
            continue
        print(table(str(run), rows))
        print()
    return status


if __name__ == "__main__":
    sys.exit(main())
