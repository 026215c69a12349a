#!/usr/bin/env python
"""tau2: base -> SFT (gold demonstrations of the train split) -> SFT + GRPO, each scored on the **test** split
(issue 14 section 2): pass^1 (greedy), pass^k and pass@k (k samples per task), and the do-nothing baseline.

    R=outputs/tau2_sft_table; C="--domain airline --out-root $R"
    python benchmarks/experiments/tau2_sft_table.py base $C              # the untrained model (+ do-nothing) on the test split
    python benchmarks/experiments/tau2_sft_table.py sft  $C --seed 1     # sft.py: gold demos of the train split -> sft_model
    python benchmarks/experiments/tau2_sft_table.py grpo $C --seed 1     # grpo.py actor.path=<sft seed 1>/sft_model
    python benchmarks/experiments/tau2_sft_table.py summary $R --write benchmarks/results/tau2_sft_table

Each stage is its own process writing ``$R/<stage>/seed<N>/result.json`` (``base``: ``$R/base/result.json``), so a
table can be built across sessions and machines; ``summary`` refuses results whose evaluation budget differs (model,
domain, user, turns, context, new tokens, eval tasks, k) and, within a stage, whose training budget differs. A
``grpo`` stage run with ``--checkpoint-every N`` that was cut (a session limit, a kill) continues with the same
command plus ``--resume`` (``train.resume_from=`` its run dir; result.json then says ``"resumed": true`` and its
``wall_s`` is the last process's only). A grpo stage in another session than its seed's evaluated sft stage (its
``sft_model`` gone with the machine) first re-creates the warm start with ``sft ... --warm-start-only`` (the same
training, no 48-min evaluation; ``warm_start.json`` instead of result.json): the sft result records the sha256 of the
model's weights (:func:`weights_sha256`), the grpo result the sha256 of the model it started from, and the table says
whether the two are the same model.

Stages (each evaluates once, at its end, with the same code: :meth:`torchrl_grpo.training.grpo_trainer.GRPOTrainer.evaluate` on
the first ``--n-eval`` usable tasks of the test split, 0 = all of them):

* ``base``: ``grpo.py eval_only=true`` on ``--model``;
* ``sft``: ``sft.py --config-name sft_tau2`` from ``--model``: ``--sft-epochs`` epochs over the gold demonstrations
  of the **train** split replayed through the RL collector (:mod:`torchrl_grpo.rollout.demonstrations`), optionally
  ``--rft-rounds`` of rejection-sampling fine-tuning, then the merged model ``sft_model/``;
* ``grpo``: ``grpo.py --config-name grpo_tau2`` from that ``sft_model`` (``--from base``: from ``--model``, the
  "GRPO without warm start" arm) on the train split.

Both trainings fine-tune all weights when ``--lora-r 0`` (the default for the 135M model) and LoRA otherwise.

Statistics (``summary``): per run the Wilson 95% interval of pass^1 on n test tasks
(:func:`torchrl_grpo.reporting.learning_curve.wilson_interval`); per stage with >= 2 seeds the mean and Student-t 95%
interval across seeds (:func:`stats.mean_ci`); for two stages of one seed whose runs recorded per-task outcomes
(``per_task`` in result.json, from the run's ``eval_episodes.jsonl``) the paired greedy comparison on the same
tasks with the exact McNemar test (:func:`paired_greedy`, :func:`stats.mcnemar_exact`): it uses that both runs saw the same tasks, which two
separate Wilson intervals ignore. pass^k is tau-bench's estimator (Yao et al., 2024,
arXiv:2406.12045, Eq. 1), pass@k Chen et al. (2021, arXiv:2107.03374, Eq. 1), both from ``--pass-k`` samples per task
at temperature 1 (:mod:`torchrl_grpo.rollout.evaluation`). The do-nothing baseline ends each test task at once
(:func:`torchrl_grpo.rollout.evaluation.do_nothing_baseline`): tasks whose correct outcome is no change score 1 there, so a
policy's pass^1 means something only above it; each result also records the do-nothing agent's per-task rewards
(:func:`do_nothing_per_task`), and the table pairs every run with it on the same tasks (do-nothing -> stage): the
"second only" column counts the tasks the policy solves that ending at once does not. ``annotate`` adds that field
(and an sft result's ``model_sha256``) to results written before them, and marks it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness import REPO, budget_diff, last_eval_row, load_json, process_meta, pyplot, read_metrics, run_logged, write_outputs
from stats import acc_wilson, mcnemar_exact, mean_ci

STAGES = ("base", "sft", "grpo")
#: evaluation budget: equal across every result of one table
EVAL_KEYS = ("model", "domain", "user", "max_turns", "max_steps", "max_context", "max_new_tokens", "n_eval", "pass_k")
#: training budget of each stage: equal across the seeds of that stage
TRAIN_KEYS = {"base": (), "sft": ("sft_epochs", "sft_minibatch", "sft_lr", "rft_rounds", "lora_r"),
              "grpo": ("grpo_from", "grpo_steps", "grpo_prompts", "grpo_samples", "grpo_lr", "lora_r",
                       "sft_epochs", "sft_minibatch", "sft_lr", "rft_rounds")}
#: splits per domain: (train, test); mock has one split, so its "test" tasks are its train tasks (flagged in the table)
SPLITS = {"airline": ("train", "test"), "retail": ("train", "test"), "telecom": ("train", "test"),
          "mock": ("base", "base")}


# ------------------------------------------------------------------------------------------------ commands
def _user_overrides(a) -> list[str]:
    """The customer: solo for telecom / mock (the agent works the ticket alone), the scripted user otherwise."""
    if a.user == "solo":
        return ["econfig.solo_mode=true"]
    return ["econfig.solo_mode=false", f"econfig.user={a.user}"]


def common_overrides(a) -> list[str]:
    """Overrides every stage shares: model context, env, evaluation (test split, greedy pass^1 + pass^k), logging."""
    train_split, test_split = SPLITS[a.domain]
    out = [f"econfig.domain={a.domain}", *_user_overrides(a), f"econfig.max_turns={a.max_turns}",
           f"econfig.max_steps={a.max_steps}", "econfig.reward=binary",
           f"train_dataset.split={train_split}", f"valid_dataset.split={test_split}",
           f"rollout.backend={a.backend}", f"rollout.max_context_tokens={a.max_context}",
           f"gconfig.max_new_tokens={a.max_new_tokens}",
           f"eval.n_problems={a.n_eval if a.n_eval > 0 else 100_000}", "eval.greedy=true", f"eval.pass_k={a.pass_k}",
           "eval.at_start=false", f"eval.at_end={'false' if getattr(a, 'warm_start_only', False) else 'true'}",
           "eval.every=0",
           f"checkpoint.every={getattr(a, 'checkpoint_every', 0)}", "checkpoint.keep_last=1", "checkpoint.save_final=false",
           "stats_logger.progress_bar=false", "stats_logger.wandb.mode=disabled"]
    if a.backend == "vllm":
        out.append(f"rollout.vllm.max_model_len={a.max_context}")
    return out


def _weights_overrides(a) -> list[str]:
    if a.lora_r > 0:
        return ["actor.peft.enable=true", f"actor.peft.r={a.lora_r}", f"actor.peft.lora_alpha={2 * a.lora_r}",
                "actor.peft.lora_dropout=0.0", "actor.peft.target_modules=all-linear"]
    return ["actor.peft.enable=false"]


def stage_command(a, stage: str, run_dir: Path) -> list[str]:
    """The ``sft.py`` / ``grpo.py`` command line of ``stage`` (module docstring) writing into ``run_dir``.

    Raises:
        FileNotFoundError: ``grpo`` from an SFT model that is not there yet (run the ``sft`` stage first).
    """
    common = [*common_overrides(a), f"seed={a.seed}", f"hydra.run.dir={run_dir}", f"output_dir={run_dir}"]
    if stage == "base":
        return [a.py, str(REPO / "grpo.py"), "--config-name", "grpo_tau2", f"actor.path={a.model}",
                "actor.peft.enable=false", "eval_only=true", *common]
    if stage == "sft":
        return [a.py, str(REPO / "sft.py"), "--config-name", "sft_tau2", f"actor.path={a.model}", *_weights_overrides(a),
                "sft.source=gold", f"sft.epochs={a.sft_epochs}", f"sft.minibatch_size={a.sft_minibatch}",
                f"sft.rft_rounds={a.rft_rounds}", f"sft.rft_samples={a.pass_k or 4}", "sft.save_model=true",
                f"optimizer.lr={a.sft_lr}", "optimizer.scheduler=cosine", "optimizer.warmup_steps=1",
                f"train.micro_batch_size={a.micro_batch}", *common]
    if stage == "grpo":
        start = a.model
        if a.grpo_from == "sft":
            start = Path(a.out_root) / "sft" / f"seed{a.seed}" / "sft_model"
            if not (start / "config.json").is_file():
                raise FileNotFoundError(f"{start} not found: run the 'sft' stage with --seed {a.seed} first")
        return [a.py, str(REPO / "grpo.py"), "--config-name", "grpo_tau2", f"actor.path={start}", *_weights_overrides(a),
                f"train.steps={a.grpo_steps}", f"train.batch_size={a.grpo_prompts}", f"gconfig.n_samples={a.grpo_samples}",
                "gconfig.temperature=1.0", "gconfig.top_p=1.0", f"optimizer.lr={a.grpo_lr}",
                "optimizer.scheduler=constant", "optimizer.warmup_steps=0",
                f"train.micro_batch_size={a.micro_batch}", "loss.kl_coef=0.0", *common, *_resume_overrides(a, run_dir)]
    raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")


def _resume_overrides(a, run_dir: Path) -> list[str]:
    """``--resume``: ``train.resume_from=<run_dir>`` when the run dir holds a complete checkpoint (written by an earlier
    ``--checkpoint-every`` run of this stage that was cut), else nothing (the stage starts from step 0)."""
    if not getattr(a, "resume", False) or not (run_dir / "checkpoints").is_dir():
        return []
    from torchrl_grpo.training.checkpoint import latest_checkpoint

    try:
        latest_checkpoint(run_dir)
    except (FileNotFoundError, ValueError):
        return []
    return [f"train.resume_from={run_dir}"]


def weights_sha256(model_dir: Path) -> str | None:
    """sha256 over a saved model's weight files (``*.safetensors``, ``*.bin``; each file's name, then its bytes, in
    name order): the identity of an SFT model. A ``grpo`` run that started from a warm start re-trained in another
    session (``sft --warm-start-only``) shows with it that it started from the very model the ``sft`` row evaluated.
    None when ``model_dir`` holds no weight file."""
    import hashlib

    files = sorted(f for f in Path(model_dir).glob("*") if f.is_file() and f.suffix in (".safetensors", ".bin"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def do_nothing_per_task(domain: str, user: str, n_eval: int) -> dict[str, float] | None:
    """``{task_id: reward}`` of the do-nothing agent (end the task at once: the env's ``do_nothing_action``) on the
    tasks a stage evaluates (the first ``n_eval`` usable tasks of the test split, 0 = all), with no model: the
    per-task form of the ``do_nothing_pass^1`` every evaluation logs, so the table can pair a policy with it task by
    task (which tasks does the policy solve that ending at once does not?). None for ``user="local"`` (an LLM
    customer server: not started for this)."""
    if user == "local":
        return None
    import gymnasium as gym

    import envs  # noqa: F401  (registers tau2/*)

    env = gym.make(f"tau2/{domain}-v0", split=SPLITS[domain][1], user=user)
    u = env.unwrapped
    out = {}
    for i in u.usable_task_indices(n_eval if n_eval > 0 else None):
        env.reset(seed=i, options={"index": i})
        _, r, *_ = env.step(u.do_nothing_action)
        out[str(u.task_ids[i])] = float(r)
    env.close()
    return out


def annotate(path: Path) -> dict:
    """Add what a result.json written before these fields existed lacks, from the run's own artefacts, and mark it
    (``"annotated"``: which fields, when): ``do_nothing_per_task`` (:func:`do_nothing_per_task` with the result's
    evaluation budget) and, for an sft result whose ``sft_model/`` is still beside it, ``model_sha256``.

    Raises:
        ValueError: the recomputed do-nothing pass^1 differs from the one the run's evaluation logged (other tasks).
    """
    import datetime

    r = json.loads(path.read_text())
    b = r["budget"]["eval"]
    added = []
    if r.get("do_nothing_per_task") is None:
        dn = do_nothing_per_task(b["domain"], b["user"], b["n_eval"])
        logged = r["eval"].get("do_nothing_pass^1")
        if dn is not None and logged is not None and abs(sum(v >= 1 for v in dn.values()) / len(dn) - logged) > 1e-6:
            raise ValueError(f"{path}: do-nothing pass^1 recomputed {sum(v >= 1 for v in dn.values())}/{len(dn)}, "
                             f"logged {logged}: not the evaluated tasks")
        if dn is not None:
            r["do_nothing_per_task"] = dn
            added.append("do_nothing_per_task")
    model = path.parent / "sft_model"
    if r["stage"] == "sft" and r.get("model_sha256") is None and model.is_dir():
        r["model_sha256"] = weights_sha256(model)
        added.append("model_sha256")
    if added:
        r.setdefault("annotated", []).append({"fields": added, "date": datetime.datetime.now(datetime.timezone.utc)
                                              .strftime("%Y-%m-%d %H:%M UTC")})
        path.write_text(json.dumps(r, indent=1))
    return r


def budget(a, stage: str) -> dict:
    return {"eval": {k: getattr(a, k) for k in EVAL_KEYS}, "train": {k: getattr(a, k) for k in TRAIN_KEYS[stage]}}


def stage_eval(rows: list[dict], k: int) -> dict:
    """The last evaluation of a run's ``metrics.jsonl`` rows: pass^1 (greedy), pass^k, pass@k, the sampled pass@1,
    do-nothing pass^1 / reward, n tasks, seconds.

    Raises:
        RuntimeError: the run logged no evaluation.
    """
    e = last_eval_row(rows)
    return {"pass^1": float(e["eval/accuracy"]), "n": int(e.get("eval/n_tasks", 0)), "k": k,
            "pass^k": e.get(f"eval/pass^{k}"), "pass@k": e.get(f"eval/pass@{k}"), "pass@1_sampled": e.get("eval/pass@1"),
            "reward": e.get("eval/reward"), "do_nothing_pass^1": e.get("eval/do_nothing_pass^1"),
            "do_nothing_reward": e.get("eval/do_nothing_reward"), "time_s": e.get("eval/time_s")}


def _train_rows(rows: list[dict]) -> list[dict]:
    keep = ("step", "sft/nll", "sft/lr", "reward/mean", "episode/response_tokens", "demo/kept", "demo/tasks",
            "rft/kept", "rft/episodes", "time/step_s", "train/skip_reason")
    out = [{k: r[k] for k in keep if k in r} for r in rows
           if any(k in r for k in ("sft/nll", "reward/mean", "demo/kept", "rft/kept"))]
    # a resumed run (--resume) redoes the step its checkpoint did not cover: keep each GRPO step's last row
    last = {r.get("step"): i for i, r in enumerate(out) if "reward/mean" in r}
    return [r for i, r in enumerate(out) if "reward/mean" not in r or last[r.get("step")] == i]


def per_task_outcomes(run_dir: Path) -> dict | None:
    """``{task_id: {"greedy": reward, "sampled": [rewards]}}`` of the run's last evaluation, from its
    ``eval_episodes.jsonl`` (:func:`torchrl_grpo.rollout.evaluation.eval_episode_rows`); None when the run wrote none.
    An episode written twice for the same step (a resumed run that evaluated that step again) counts once: the
    later row of each (task, mode, sample) wins."""
    p = run_dir / "eval_episodes.jsonl"
    if not p.is_file():
        return None
    rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    if not rows:
        return None
    last = max(r["step"] for r in rows)
    out: dict = {}
    for r in rows:
        if r["step"] != last:
            continue
        key = str(r.get("task_id") if r.get("task_id") is not None else r["task"])
        t = out.setdefault(key, {"greedy": None, "sampled": {}})
        if r["mode"] == "greedy":
            t["greedy"] = r["reward"]
        else:
            t["sampled"][int(r.get("sample", len(t["sampled"])))] = r["reward"]
    for t in out.values():
        t["sampled"] = [t["sampled"][i] for i in sorted(t["sampled"])]
    return out


def paired_greedy(a: dict, b: dict, success: float = 1.0) -> dict:
    """Greedy success of two runs on the same test tasks (:func:`per_task_outcomes`): tasks both solve, only the
    first, only the second, neither, and the exact McNemar p-value (:func:`mcnemar_exact`).

    Raises:
        ValueError: the runs were scored on different tasks.
    """
    if set(a) != set(b):
        raise ValueError(f"paired comparison needs the same tasks: {sorted(set(a) ^ set(b))[:5]} differ")
    sa = {t for t, v in a.items() if (v["greedy"] or 0.0) >= success}
    sb = {t for t, v in b.items() if (v["greedy"] or 0.0) >= success}
    only_a, only_b = sorted(sa - sb), sorted(sb - sa)
    return {"n": len(a), "both": len(sa & sb), "only_first": len(only_a), "only_second": len(only_b),
            "neither": len(a) - len(sa | sb), "p_mcnemar": mcnemar_exact(len(only_a), len(only_b)),
            "only_first_tasks": only_a, "only_second_tasks": only_b}


def cmd_stage(a) -> dict:
    root = Path(a.out_root)
    d = root / "base" if a.stage == "base" else root / a.stage / f"seed{a.seed}"
    d.mkdir(parents=True, exist_ok=True)
    cmd = stage_command(a, a.stage, d)
    resumed = any(c.startswith("train.resume_from=") for c in cmd)
    start = next(c.split("=", 1)[1] for c in cmd if c.startswith("actor.path="))
    start_sha = weights_sha256(Path(start)) if a.stage == "grpo" and a.grpo_from == "sft" else None
    wall = run_logged(cmd, d / "run.log", cores=a.cores, threads=a.threads)
    rows = read_metrics(d)
    ident = {"stage": a.stage, "seed": None if a.stage == "base" else a.seed, "budget": budget(a, a.stage)}
    if a.stage == "sft" and a.warm_start_only:  # the model for a later grpo stage, no evaluation: not a table row
        res = {**ident, "model_sha256": weights_sha256(d / "sft_model"), "train": _train_rows(rows), "wall_s": wall,
               "stage_command": cmd, **process_meta(a.cores, a.threads, a.backend)}
        (d / "warm_start.json").write_text(json.dumps(res, indent=1))
        print(json.dumps({"stage": "sft (warm start only)", "seed": a.seed, "model_sha256": res["model_sha256"],
                          "wall_s": round(wall)}))
        return res
    res = {**ident, "eval": stage_eval(rows, a.pass_k), "per_task": per_task_outcomes(d), "train": _train_rows(rows),
           "wall_s": wall, "resumed": resumed, "stage_command": cmd, **process_meta(a.cores, a.threads, a.backend)}
    if a.stage == "sft":
        res["model_sha256"] = weights_sha256(d / "sft_model")
    res["do_nothing_per_task"] = do_nothing_per_task(a.domain, a.user, a.n_eval)
    if start_sha is not None:
        res["start_model_sha256"] = start_sha
    (d / "result.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({"stage": a.stage, "seed": res["seed"], "eval": res["eval"], "wall_s": round(wall)}))
    return res


# ------------------------------------------------------------------------------------------------ summary
def load_results(root: Path) -> dict[str, list[dict]]:
    """``{stage: [result, ...] by seed}`` under ``root``.

    Raises:
        ValueError: evaluation budgets differ between any two results, or training budgets within a stage.
    """
    out: dict[str, list[dict]] = {}
    for st in STAGES:
        paths = [root / "base" / "result.json"] if st == "base" else sorted((root / st).glob("seed*/result.json"))
        rs = load_json(paths)
        if rs:
            out[st] = sorted(rs, key=lambda r: r.get("seed") or 0)
    every = [r for v in out.values() for r in v]
    if every:
        ref = every[0]["budget"]["eval"]
        for r in every[1:]:
            diff = budget_diff(ref, r["budget"]["eval"], EVAL_KEYS)
            if diff:
                raise ValueError(f"{r['stage']} seed {r.get('seed')}: another evaluation budget ({diff}) than "
                                 f"{every[0]['stage']}; one table holds one budget")
    for st, rs in out.items():
        for r in rs[1:]:
            diff = budget_diff(rs[0]["budget"]["train"], r["budget"]["train"], TRAIN_KEYS[st])
            if diff:
                raise ValueError(f"{st} seeds {rs[0].get('seed')} and {r.get('seed')} trained with different {diff}")
    return out


def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def summarise(root: Path) -> dict:
    """Per-run rows and per-stage means (see module docstring)."""
    res = load_results(root)
    if not res:
        raise SystemExit(f"no result.json under {root}: run a stage first")
    out: dict = {"stages": {}, "runs": []}
    for st, rs in res.items():
        for r in rs:
            out["runs"].append({"stage": st, "seed": r.get("seed"), **r["eval"], "wall_s": r["wall_s"],
                                "device": r.get("device"), "train": r.get("train", [])})
        p1 = [r["eval"]["pass^1"] for r in rs]
        m, h = mean_ci(p1)
        pk = [r["eval"]["pass^k"] for r in rs if r["eval"].get("pass^k") is not None]
        out["stages"][st] = {"seeds": [r.get("seed") for r in rs], "pass^1_mean": m, "pass^1_ci": h,
                             "pass^k_mean": sum(pk) / len(pk) if pk else None,
                             "wall_s_mean": sum(r["wall_s"] for r in rs) / len(rs)}
    out["paired"] = []  # stage pairs of the same seed (base: any seed) whose per-task outcomes were both recorded
    for st, rs in res.items():  # first, every run against the do-nothing agent on the same tasks
        for r in rs:
            if r.get("per_task") and r.get("do_nothing_per_task"):
                dn = {t: {"greedy": v, "sampled": []} for t, v in r["do_nothing_per_task"].items()}
                out["paired"].append({"first": "do-nothing", "second": st, "seed": r.get("seed"),
                                      **paired_greedy(dn, r["per_task"])})
    order = list(res)
    for i, st1 in enumerate(order):
        for st2 in order[i + 1:]:
            for r2 in res[st2]:
                r1 = next((r for r in res[st1] if st1 == "base" or r.get("seed") == r2.get("seed")), None)
                if r1 is not None and r1.get("per_task") and r2.get("per_task"):
                    out["paired"].append({"first": st1, "second": st2, "seed": r2.get("seed"),
                                          **paired_greedy(r1["per_task"], r2["per_task"])})
    out["warm_starts"] = [{"seed": r.get("seed"), "status": warm_start_status(
        r, next((q for q in res.get("sft", []) if q.get("seed") == r.get("seed")), None))}
        for r in res.get("grpo", []) if r["budget"]["train"].get("grpo_from", "sft") == "sft"]
    first = next(iter(res.values()))[0]
    out["budget"] = first["budget"]["eval"]
    out["train_budgets"] = {st: rs[0]["budget"]["train"] for st, rs in res.items()}
    out["do_nothing_pass^1"] = first["eval"].get("do_nothing_pass^1")
    return out


def warm_start_status(grpo: dict, sft: dict | None) -> str:
    """Did this grpo run start from the model its seed's sft row evaluated? Compares ``start_model_sha256`` with the
    sft result's ``model_sha256`` (:func:`weights_sha256`): "same model", "different model", or why it cannot say."""
    if sft is None:
        return "no sft row of this seed"
    a, b = grpo.get("start_model_sha256"), sft.get("model_sha256")
    if a is None or b is None:
        return "not recorded"
    return f"same model (sha256 {a[:12]})" if a == b else f"different model ({a[:12]} vs the sft row's {b[:12]})"


def to_markdown(s: dict, root: Path) -> str:
    b = s["budget"]
    k = b["pass_k"]
    same = " (mock has one split: these are its train tasks)" if b["domain"] == "mock" else ""
    lines = [f"# tau2 {b['domain']}: base -> SFT -> SFT + GRPO on the test split (issue 14 section 2)", "",
             f"Results root: `{root}`. Model {b['model']}, user: {b['user']}, {b['max_turns']} assistant turns / "
             f"{b['max_steps']} env steps, {b['max_context']}-token context, {b['max_new_tokens']} new tokens per turn; "
             f"evaluation on the test split{same}: pass^1 = greedy success rate, pass^{k} / pass@{k} from {k} samples "
             f"per task at temperature 1.", "",
             f"Do-nothing baseline (end each task at once), pass^1: {_f(s['do_nothing_pass^1'])}", "",
             f"| stage | seed | pass^1 [Wilson 95%] | pass^{k} | pass@{k} | do-nothing pass^1 | wall | device |",
             "|---|---|---|---|---|---|---|---|"]
    for r in s["runs"]:
        lines.append(f"| {r['stage']} | {r['seed'] if r['seed'] is not None else '-'} | {acc_wilson(r['pass^1'], r['n'])} "
                     f"| {_f(r.get('pass^k'))} | {_f(r.get('pass@k'))} | {_f(r.get('do_nothing_pass^1'))} "
                     f"| {r['wall_s'] / 60:.1f} min | {r.get('device', '-')} |")
    for w in s.get("warm_starts", []):
        lines.append(f"\ngrpo seed {w['seed']} started from the sft row's model: {w['status']}.")
    lines += ["", "| stage | seeds | mean pass^1 ± 95% t-interval | mean pass^k | mean wall | training budget |",
              "|---|---|---|---|---|---|"]
    for st, v in s["stages"].items():
        ci = "(one run: no interval)" if v["pass^1_ci"] != v["pass^1_ci"] else f"± {v['pass^1_ci']:.3f}"
        tb = ", ".join(f"{kk}={vv}" for kk, vv in s["train_budgets"][st].items()) or "-"
        lines.append(f"| {st} | {len(v['seeds'])} | {v['pass^1_mean']:.3f} {ci} | {_f(v['pass^k_mean'])} "
                     f"| {v['wall_s_mean'] / 60:.1f} min | {tb} |")
    if s.get("paired"):
        lines += ["", "Paired greedy outcomes on the same test tasks (exact McNemar test over the tasks only one run "
                  "solves; p < 0.05: a difference outside noise):", "",
                  "| first -> second | seed | both | first only | second only | neither | McNemar p | tasks second only |",
                  "|---|---|---|---|---|---|---|---|"]
        for q in s["paired"]:
            lines.append(f"| {q['first']} -> {q['second']} | {q['seed'] if q['seed'] is not None else '-'} "
                         f"| {q['both']} | {q['only_first']} | {q['only_second']} | {q['neither']} "
                         f"| {q['p_mcnemar']:.3f} | {', '.join(q['only_second_tasks']) or '-'} |")
    lines += ["", f"Produced by `python benchmarks/experiments/tau2_sft_table.py summary {root} --write <stem>`; each run's "
              "command is in its result.json (`command`, `stage_command`)."]
    return "\n".join(lines) + "\n"


def plot(s: dict, out_png: Path) -> Path:
    """pass^1 per stage (one point per run, Wilson 95% bars), pass^k as open markers, do-nothing as a dashed line."""
    from torchrl_grpo.reporting.learning_curve import wilson_interval

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = {st: i for i, st in enumerate(s["stages"])}
    for j, r in enumerate(s["runs"]):
        x = xs[r["stage"]] + 0.08 * ((j % 5) - 2)
        lo, hi = wilson_interval(r["pass^1"], r["n"])
        ax.errorbar([x], [r["pass^1"]], yerr=[[r["pass^1"] - lo], [hi - r["pass^1"]]], fmt="o", color="C0", capsize=3,
                    label="pass^1 (greedy), Wilson 95%" if j == 0 else None)
        if r.get("pass^k") is not None:
            ax.plot([x], [r["pass^k"]], "s", mfc="none", color="C1",
                    label=f"pass^{s['budget']['pass_k']}" if j == 0 else None)
    if s.get("do_nothing_pass^1") is not None:
        ax.axhline(s["do_nothing_pass^1"], ls="--", color="gray", label="do-nothing pass^1")
    ax.set_xticks(list(xs.values()), list(xs))
    ax.set_ylim(-0.02, 1.0)
    ax.set_ylabel("success rate on the test split")
    ax.set_title(f"tau2 {s['budget']['domain']}, {s['budget']['model']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png


def kept_notes(md_path: Path) -> str:
    """The hand-written part of an existing table file, kept when ``summary --write`` redraws the table: everything
    from its first ``## `` heading on (the generated part has none); "" when there is no such file or heading."""
    if not md_path.is_file():
        return ""
    text = md_path.read_text()
    at = text.find("\n## ")
    return "" if at < 0 else text[at:]


def cmd_summary(a) -> None:
    root = Path(a.root)
    s = summarise(root)
    md = to_markdown(s, root)
    print(md)
    if a.write:
        md += kept_notes(Path(a.write).with_suffix(".md"))
        write_outputs(a.write, md, s, lambda png: plot(s, png))


def _add_budget(p: argparse.ArgumentParser) -> None:
    p.add_argument("--domain", default="airline", choices=sorted(SPLITS))
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--user", default=None, help="scripted | local | solo (default: solo for telecom/mock, else scripted)")
    p.add_argument("--max-turns", type=int, default=20)
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--max-context", type=int, default=8192)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--n-eval", type=int, default=0, help="test tasks evaluated (0: the whole test split)")
    p.add_argument("--pass-k", type=int, default=4)
    p.add_argument("--lora-r", type=int, default=0, help="0: full fine-tuning; else LoRA r (alpha = 2r)")
    p.add_argument("--sft-epochs", type=int, default=2)
    p.add_argument("--sft-minibatch", type=int, default=8)
    p.add_argument("--sft-lr", type=float, default=2e-5)
    p.add_argument("--rft-rounds", type=int, default=0)
    p.add_argument("--grpo-from", default="sft", choices=("sft", "base"))
    p.add_argument("--grpo-steps", type=int, default=4)
    p.add_argument("--grpo-prompts", type=int, default=2)
    p.add_argument("--grpo-samples", type=int, default=4)
    p.add_argument("--grpo-lr", type=float, default=1e-5)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out-root", default="outputs/tau2_sft_table")
    p.add_argument("--backend", default="transformers", choices=("transformers", "vllm"))
    p.add_argument("--py", default=sys.executable, help="interpreter for sft.py / grpo.py (vllm needs its venv)")
    p.add_argument("--cores", default=None, help="taskset -c CORES for every process")
    p.add_argument("--threads", type=int, default=0, help="OMP/MKL threads (0: leave)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="grpo: checkpoint every N steps (keep the last one), so --resume can continue a cut run")
    p.add_argument("--warm-start-only", action="store_true",
                   help="sft: train and write sft_model (+ warm_start.json with its sha256) without the final "
                        "evaluation, to re-create an evaluated seed's warm start for a grpo run in another session")
    p.add_argument("--resume", action="store_true",
                   help="grpo: continue from the run dir's latest complete checkpoint, if any (same flags otherwise)")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for st in STAGES:
        _add_budget(sub.add_parser(st, help=f"run the {st!r} stage"))
    pa = sub.add_parser("annotate", help="add do_nothing_per_task / model_sha256 to result.json files that predate them")
    pa.add_argument("results", nargs="+")
    ps = sub.add_parser("summary", help="table + PNG over root/{base,sft,grpo}")
    ps.add_argument("root")
    ps.add_argument("--write", default=None, help="path stem for .md / .json / .png")
    a = ap.parse_args(argv)
    if a.cmd in STAGES:
        a.stage = a.cmd
        if a.user is None:
            a.user = "solo" if a.domain in ("telecom", "mock") else "scripted"
        if a.user not in ("scripted", "local", "solo"):
            ap.error(f"--user {a.user!r}: scripted | local | solo")
        if a.warm_start_only and a.stage != "sft":
            ap.error("--warm-start-only belongs to the sft stage")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.cmd == "summary":
        cmd_summary(a)
    elif a.cmd == "annotate":
        for p in a.results:
            r = annotate(Path(p))
            print(p, [x["fields"] for x in r.get("annotated", [])])
    else:
        cmd_stage(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
