#!/usr/bin/env python
"""Quick performance regression guard for CI (issue 12): three speed *ratios*, each against a baseline run in the
same process on the same inputs, checked against the values measured when the guard was set up.

Ratios (higher is better; each is ``baseline seconds / ours seconds``):

* ``rollout_vs_hf_generate``: our :class:`~torchrl_grpo.backends.transformers_backend.TransformersBackend` vs HF
  ``model.generate(do_sample=True)`` on the same left-padded batch: ``--prompts`` GSM8K test prompts x
  ``--samples`` samples, exactly ``--new-tokens`` new tokens per row (no stop token, so both do the same work).
* ``update_vs_plain``: one :class:`~torchrl_grpo.training.update.GRPOUpdate` step (the trainer's update: response-window
  LM head, group-shared prompt, micro-batches) vs a plain loop over the same rows: one full forward, log-softmax,
  gather, policy-gradient loss and backward per row, then the same optimizer step.
* ``collector_vs_bare_env``: the GSM8K env resets/steps alone vs :class:`~torchrl_grpo.rollout.collector.GroupCollector`
  collecting the same episodes with a zero-cost backend (what the collector adds around generation per step; the
  one-off probe behind it, removed in issue 27, and its numbers: ``benchmarks/results/collector_overhead.md``).

Because both sides of each ratio run in one process, one after the other, machine speed and load mostly cancel;
CI fails only when a ratio drops below ``--factor`` (default 0.6) x its :data:`REFERENCE` value, i.e. when our side
gets more than 1/0.6 ≈ 1.67x slower relative to its baseline (a 2x slowdown, ratio x 0.5, fails), while noise of
tens of percent does not (the two reference runs differed by up to 18%).

    python benchmarks/quick_guard.py --check            # CI: exit 1 with a message naming each failed ratio
    python benchmarks/quick_guard.py --record           # also write benchmarks/results/quick_guard.{json,md}

Model: ``--model`` (default SmolLM2-135M-Instruct, fetched by the slow test stage; fp32 on CPU). The one recorded
run (``benchmarks/results/quick_guard.md``) took 974 s pinned to one core at load 6-9; an idle 2-core run has not
been timed. The :data:`REFERENCE` values hold for that model only; another model reports its ratios without a check.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_MODEL = "smollm2-135m-instruct"

#: Ratios measured when the guard was set up: the mean of two runs on 2026-11-23 (benchmarks/results/quick_guard.md;
#: SmolLM2-135M fp32, one thread on a shared core at load 6-9: 1.80 / 1.48, 4.20 / 3.74, 0.223 / 0.216), except
#: ``update_vs_plain``: its 2026-11-23 value (3.97) timed an update that trained 4 of the 8 rows. This batch is
#: left-padded and GRPOUpdate.micro_batches then cut every micro-batch to its longest row's width keeping the first
#: columns, so the shorter prompt's micro-batch (117 of 157 columns) lost all its response tokens and was skipped
#: (fixed in a95792c): 128 of 256 tokens scored, 256 decoder tokens, 183 GFLOP per update, vs 256 / 512 / 366 GFLOP
#: for the whole batch (the plain side: 1096 decoder tokens, 884 GFLOP). Re-recorded on the update that trains every
#: row: the mean of 2.479 / 2.698 (benchmarks/results/issue35_cpu_ratios.md, final code); :func:`check_update_work`
#: now refuses a measurement of an update that skips tokens or differs from the plain side's gradient.
REFERENCE: dict[str, float] = {
    "rollout_vs_hf_generate": 1.64,
    "update_vs_plain": 2.59,
    "collector_vs_bare_env": 0.22,
}
DEFAULT_FACTOR = 0.6


def check_ratios(measured: dict[str, float], reference: dict[str, float], factor: float) -> list[str]:
    """Failure messages, one per ratio below ``factor * reference`` (or missing / not a finite positive number).

    Args:
        measured: ratio name -> measured value (higher is better).
        reference: ratio name -> value recorded when the guard was set up.
        factor: in (0, 1]; the fraction of the reference a ratio must keep.

    Returns:
        Empty list when every reference ratio passes.

    Raises:
        ValueError: ``factor`` outside (0, 1].
    """
    if not 0 < factor <= 1:
        raise ValueError(f"factor must be in (0, 1], got {factor}")
    failures = []
    for name, ref in reference.items():
        got = measured.get(name)
        if got is None or not isinstance(got, (int, float)) or not math.isfinite(got) or got <= 0:
            failures.append(f"{name}: no valid measurement (got {got!r})")
        elif got < factor * ref:
            failures.append(f"{name}: {got:.3f} < {factor:g} x reference {ref:.3f} = {factor * ref:.3f} "
                            f"(our side is {ref / got:.2f}x slower relative to its baseline than when recorded)")
    return failures


def check_update_work(ours_metrics: dict, scored_tokens: int, plain_grad_norm: float, rel: float = 1e-3) -> None:
    """Check that the timed update did the plain side's work: its loss scored every response token of the batch
    (metric ``num_tokens``) and its gradient norm before clipping (metric ``grad_norm``) equals the plain side's.
    An update that skips rows runs less and would inflate ``update_vs_plain`` (the 2026-11-23 reference did).

    Args:
        ours_metrics: the metrics an update call returned. scored_tokens: response tokens in the batch, >= 1.
        plain_grad_norm: the plain side's gradient norm before clipping. rel: relative tolerance on the norms.

    Raises:
        RuntimeError: naming the mismatch.
    """
    got = ours_metrics.get("num_tokens")
    if got is None or not math.isfinite(got) or round(got) != scored_tokens:
        raise RuntimeError(f"update_vs_plain: the update scored {got} tokens, the batch has {scored_tokens}: "
                           "its timing is not comparable to the plain side's")
    norm = ours_metrics.get("grad_norm")
    if norm is None or not math.isclose(norm, plain_grad_norm, rel_tol=rel):
        raise RuntimeError(f"update_vs_plain: the update's gradient norm {norm} differs from the plain side's "
                           f"{plain_grad_norm:.6g} (rel. tolerance {rel:g}): the two sides compute different gradients")


def _paired(fn_a: Callable[[], object], fn_b: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median seconds of ``repeats`` calls of each side, the sides interleaved (a, b, a, b, ...) after one
    warm-up call each, so a burst of load from another process lands on both sides of a ratio rather than on
    whichever side happened to run during it."""
    fn_a()
    fn_b()
    times_a: list[float] = []
    times_b: list[float] = []
    for _ in range(repeats):
        for fn, times in ((fn_a, times_a), (fn_b, times_b)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times_a), statistics.median(times_b)


def measure(model_name: str, prompts: int, samples: int, new_tokens: int, repeats: int) -> tuple[dict, dict]:
    """Run the three comparisons; returns ``(ratios, details)`` (details: seconds of each side)."""
    import gymnasium as gym
    import torch
    from tensordict import TensorDict

    import envs
    from torchrl_grpo.backends.base import Generation, RolloutBackend, SamplingConfig
    from torchrl_grpo.backends.transformers_backend import TransformersBackend
    from torchrl_grpo.rollout.chat_tokens import ChatRenderer
    from torchrl_grpo.rollout.collector import GroupCollector
    from torchrl_grpo.objectives.loss import GRPOLoss
    from torchrl_grpo.model_store import load_model_and_tokenizer
    from torchrl_grpo.training.update import GRPOUpdate

    from rollout_bench import gsm8k_prompts  # the same prompts as the rollout benchmark (benchmarks/ is sys.path[0])

    gym.register_envs(envs)
    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer(model_name, dtype="float32")
    base = gsm8k_prompts(tok, prompts)
    rows = [p for p in base for _ in range(samples)]
    details: dict[str, float] = {}

    # 1. rollout: ours vs HF generate, exactly new_tokens per row
    P = max(map(len, rows))
    ids = torch.full((len(rows), P), tok.pad_token_id, dtype=torch.long)
    am = torch.zeros_like(ids)
    for i, p in enumerate(rows):
        ids[i, P - len(p):] = torch.tensor(p)
        am[i, P - len(p):] = 1
    eos = sorted(ChatRenderer(tok).end_of_turn_ids())

    def hf():
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=am, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=eos,
                           pad_token_id=tok.pad_token_id)

    ours = TransformersBackend(model, pad_token_id=tok.pad_token_id)
    sampling = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, stop_token_ids=[], seed=0)
    gens: list = []

    def ours_gen():
        ours._prefix = None
        gens[:] = ours.generate(rows, sampling)

    details["hf_generate_s"], details["ours_generate_s"] = _paired(hf, ours_gen, repeats)

    # 2. update: GRPOUpdate vs a plain per-row forward/backward, same rows (prompt + the generations above)
    seqs = [p + g.token_ids for p, g in zip(rows, gens)]
    T = max(map(len, seqs))
    tokens = torch.full((len(seqs), T), tok.pad_token_id, dtype=torch.long)
    amask = torch.zeros((len(seqs), T), dtype=torch.bool)
    rmask = torch.zeros_like(amask)
    behav = torch.zeros((len(seqs), T))
    for i, (p, g) in enumerate(zip(rows, gens)):
        s = T - len(seqs[i])  # left padding, as the collector stores it
        tokens[i, s:] = torch.tensor(seqs[i])
        amask[i, s:] = True
        rmask[i, s + len(p):] = True
        behav[i, s + len(p):] = torch.tensor(g.logprobs)
    adv = torch.randn(len(seqs), generator=torch.Generator().manual_seed(0))
    batch = TensorDict(tokens=tokens, attention_mask=amask, response_mask=rmask, sample_log_probs=behav,
                       advantage=adv, response_tokens=rmask.sum(-1), batch_size=[len(seqs)])
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.0)  # lr 0: every repeat sees the same weights
    upd = GRPOUpdate(model, GRPOLoss(model), opt, reference=None, device=torch.device("cpu"),
                     autocast=lambda: torch.autocast("cpu", enabled=False), ppo_epochs=1, minibatch_size=0,
                     micro_batch_size=0, max_tokens_per_mb="auto", max_grad_norm=1.0, anchor="behaviour",
                     exact_log_probs=True, seed=0)
    step = [0]
    last: dict = {}  # the last call's metrics / gradient norm of each side, checked after the timing

    def ours_update():
        step[0] += 1
        last["ours"] = upd(batch.clone(), step=step[0])

    def plain_update():
        opt.zero_grad(set_to_none=True)
        for i in range(len(seqs)):
            x = torch.tensor([seqs[i]])
            logp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
            lp = logp.gather(-1, x[0, 1:, None]).squeeze(-1)[len(rows[i]) - 1:]
            ratio = torch.exp(lp - lp.detach())
            (-(ratio * adv[i]).sum() / int(rmask.sum())).backward()
        last["plain"] = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
        opt.step()

    details["ours_update_s"], details["plain_update_s"] = _paired(ours_update, plain_update, repeats)
    check_update_work(last["ours"], int(rmask.sum()), last["plain"])  # lr 0: both saw the same weights
    model.eval()

    # 3. collector overhead: GroupCollector with a zero-cost backend vs the bare env resets/steps
    reply = tok.encode("The answer is #### 42", add_special_tokens=False) + [tok.eos_token_id]

    class InstantBackend(RolloutBackend):
        policy_version = 0

        def generate(self, prompts, sampling):
            return [Generation(list(reply), [-0.1] * len(reply), "stop") for _ in prompts]

        def load_weights(self, weights=None):
            pass

    n_tasks, n_samples = 16, 4
    col = GroupCollector(lambda: gym.make("GSM8K-v1", split="test", disable_env_checker=True), InstantBackend(),
                         tok, SamplingConfig(max_new_tokens=16), max_turns=1, max_context_tokens=1 << 20)
    tasks = [{"index": i} for i in range(n_tasks)]
    col.collect(tasks, n_samples)
    pool = col._envs(n_tasks * n_samples)
    text = tok.decode(reply, skip_special_tokens=True)

    def bare():
        for i, e in enumerate(pool):
            e.reset(seed=0, options=dict(tasks[i // n_samples]))
            e.step(text)

    details["collector_s"], details["bare_env_s"] = _paired(lambda: col.collect(tasks, n_samples), bare, repeats)
    (getattr(col, "shutdown", None) or col.close)()

    ratios = {
        "rollout_vs_hf_generate": details["hf_generate_s"] / details["ours_generate_s"],
        "update_vs_plain": details["plain_update_s"] / details["ours_update_s"],
        "collector_vs_bare_env": details["bare_env_s"] / details["collector_s"],
    }
    return ratios, details


def write_results(ratios: dict, details: dict, meta: dict, failures: list[str]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "quick_guard.json").write_text(json.dumps({"meta": meta, "ratios": ratios, "details": details,
                                                          "reference": REFERENCE, "failures": failures}, indent=2))
    lines = ["# Quick regression guard (CI)", "",
             f"Command: `{meta['command']}`  ", f"Date: {meta['date']}; {meta['seconds']:.0f} s wall  ",
             f"Machine: {meta['nproc']} cores, torch threads {meta['threads']}; load average before "
             f"{meta['load_before']}, after {meta['load_after']}  ",
             f"Versions: python {meta['python']}, torch {meta['torch']}, transformers {meta['transformers']}  ",
             f"Settings: {meta['model']} fp32, {meta['prompts']} GSM8K prompts x {meta['samples']} samples, "
             f"{meta['new_tokens']} new tokens, median of {meta['repeats']} per side after a warm-up, the two sides interleaved", "",
             f"CI fails when a ratio < {meta['factor']} x reference.", "",
             "| ratio (baseline s / ours s) | measured | reference | floor |", "|---|---:|---:|---:|"]
    for k, v in ratios.items():
        ref = REFERENCE.get(k, float("nan"))
        lines.append(f"| {k} | {v:.3f} | {ref:.3f} | {meta['factor'] * ref:.3f} |")
    lines += ["", "| side | seconds |", "|---|---:|"] + [f"| {k} | {v:.3f} |" for k, v in details.items()]
    (RESULTS / "quick_guard.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a ratio is below --factor x reference")
    ap.add_argument("--record", action="store_true", help="write benchmarks/results/quick_guard.{json,md}")
    ap.add_argument("--factor", type=float, default=DEFAULT_FACTOR)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    load_before = tuple(round(x, 2) for x in os.getloadavg())
    t0 = time.perf_counter()
    ratios, details = measure(args.model, args.prompts, args.samples, args.new_tokens, args.repeats)
    checked = args.model == DEFAULT_MODEL
    failures = check_ratios(ratios, REFERENCE, args.factor) if checked else []
    for k, v in ratios.items():
        print(f"quick_guard {k}: {v:.3f} (reference {REFERENCE.get(k, float('nan')):.3f}, "
              f"floor {args.factor * REFERENCE.get(k, float('nan')):.3f})")
    if args.record:
        import torch
        import transformers

        meta = {"command": "python benchmarks/quick_guard.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": time.perf_counter() - t0,
                "nproc": os.cpu_count(), "threads": torch.get_num_threads(), "load_before": load_before,
                "load_after": tuple(round(x, 2) for x in os.getloadavg()), "python": platform.python_version(),
                "torch": torch.__version__, "transformers": transformers.__version__, "model": args.model,
                "prompts": args.prompts, "samples": args.samples, "new_tokens": args.new_tokens,
                "repeats": args.repeats, "factor": args.factor}
        write_results(ratios, details, meta, failures)
    if not checked:
        print(f"quick_guard: no reference for model {args.model!r}; ratios reported, not checked")
    if failures:
        print("quick_guard FAILED (performance regression):\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1 if args.check else 0
    print(f"quick_guard: all ratios >= {args.factor:g} x reference ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
