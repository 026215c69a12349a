"""Data-parallel training (torchrl_grpo.distributed.data_parallel) with torchrun + gloo on CPU, tiny model.

One DDP step, and one FSDP2 step, on two ranks equals one single-process step on the doubled batch (with
``loss.adv_scale=batch`` too: same advantages, and the same logged loss metrics); a torchrun run
of grpo.py writes its files from rank 0 only and its checkpoint resumes on one process (FSDP: and back).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1", "OMP_NUM_THREADS": "1"}


def _torchrun(args, cwd, timeout=600):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def _single_and_two_ranks(tmp_path, mode: str, adv_scale: str = "group") -> tuple[dict, dict]:
    """tests/ddp_equivalence.py once in one process (micro-batches of 4) and once under torchrun with 2 ranks in
    ``mode`` (``ddp`` | ``fsdp``, micro-batches of 2), ``loss.adv_scale=adv_scale``; returns the two result dicts
    (single, parallel)."""
    single, par = tmp_path / "single.pt", tmp_path / f"{mode}.pt"
    script = str(REPO / "tests" / "ddp_equivalence.py")
    p = subprocess.run([sys.executable, script, str(single), "single", "4", adv_scale], cwd=tmp_path, env=ENV,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    p = _torchrun([script, str(par), mode, "2", adv_scale], cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    return torch.load(single), torch.load(par)


def test_ddp_step_equals_single_process_step_on_the_doubled_batch(tmp_path):
    # another micro-batch split on the ranks (2 episodes per forward): the all-reduced gradient must not depend on it
    a, b = _single_and_two_ranks(tmp_path, "ddp")
    assert a["tokens"][0] != a["tokens"][1]  # the ranks' token counts differ (token-mean normaliser is global)
    _assert_same_step(a, b, "DDP", f"; response tokens per rank {a['tokens']}")


@pytest.fixture(scope="module")
def ddp_batch_scaled(tmp_path_factory):
    """One DDP step (2 ranks: groups 0, 2 | 1, 3) and the single-process step on the same batch, through the
    trainer's ``_learn`` with ``loss.adv_scale=batch``; group 1 holds an infrastructure failure (dropped)."""
    return _single_and_two_ranks(tmp_path_factory.mktemp("ddp-batch"), "ddp", "batch")


def _advantages_by_group(res: dict) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for rank in res["advantages"]:
        for gid, adv in rank:
            for g, a in zip(gid.tolist(), adv.tolist()):
                out.setdefault(int(g), []).append(a)
    return out


def test_ddp_batch_advantage_scale_uses_the_std_of_the_whole_batch(ddp_batch_scaled):
    """Issue 25 C2: ``loss.adv_scale=batch`` under DDP divides by the std of the whole step's batch (every rank's
    groups; not the dropped group 1), so each episode's advantage is the single-process one. Before: each rank
    divided by the std of its own shard."""
    a, b = ddp_batch_scaled
    single, par = _advantages_by_group(a), _advantages_by_group(b)
    assert sorted(single) == sorted(par) == [0, 2, 3]  # group 1 dropped (infrastructure failure) everywhere
    for g in single:
        print(f"group {g}: single {[round(x, 4) for x in single[g]]} ddp {[round(x, 4) for x in par[g]]}")
        assert par[g] == pytest.approx(single[g], rel=1e-5, abs=1e-6), g
    _assert_same_step(a, b, "DDP adv_scale=batch")


#: the update's metrics, each reduced over micro-batches (and ranks) as torchrl_grpo.objectives.loss.REDUCTIONS declares
_LOSS_METRICS = ("loss/total", "num_tokens", "loss_objective", "loss_kl", "loss_entropy", "ess", "ratio_max",
                 "ratio_mean", "clip_fraction", "clip_fraction_low", "clip_fraction_high", "kl_behaviour", "kl_ref",
                 "entropy", "behaviour_weight_mean", "behaviour_weight_masked", "grad_norm", "train/optimizer_steps")


def test_ddp_logged_loss_metrics_equal_the_single_process_ones(ddp_batch_scaled):
    """Issue 25 C3: the loss metrics a 2-rank DDP step logs (``DataParallel.mean_metrics`` of the update's) are
    the single-process step's on the same batch: ``num_tokens`` and ``loss/total`` summed over ranks, token means
    weighted by tokens, ``ratio_max`` the maximum, ``ess`` over all tokens. Before: a plain mean over ranks
    (``num_tokens`` and ``loss/total`` at 1/W of the truth, per-token means unweighted)."""
    a, b = ddp_batch_scaled
    ma, mb = a["metrics"], b["metrics"]
    assert ma["num_tokens"] > 0 and ma["ratio_max"] == ma["ratio_max"]
    for k in _LOSS_METRICS:
        print(f"{k}: single {ma.get(k)!r} ddp {mb.get(k)!r}")
    assert mb["dist/world_size"] == 2.0
    for k in _LOSS_METRICS:
        assert (k in ma) == (k in mb), k  # kl_ref / entropy: not measured (no KL term, no entropy bonus)
        if k in ma:
            assert mb[k] == pytest.approx(ma[k], rel=1e-4, abs=1e-7), k


def _assert_same_step(a: dict, b: dict, name: str, note: str = "") -> None:
    """The data-parallel run ``b`` took the single-process step ``a``: one optimizer step each, the weights moved,
    gradients equal to float summation order and parameters to 1e-5 (the differences are printed)."""
    assert a["optimizer_steps"] == b["optimizer_steps"] == 1.0
    moved = max((a["params"][k] - a["before"][k]).abs().max().item() for k in a["params"])
    assert moved > 1e-4  # the step did change the weights
    grad_diff = max((a["grads"][k] - b["grads"][k]).abs().max().item() for k in a["grads"])
    grad_scale = max(a["grads"][k].abs().max().item() for k in a["grads"])
    param_diff = max((a["params"][k] - b["params"][k]).abs().max().item() for k in a["params"])
    print(f"{name}: max |grad diff| {grad_diff:.3g} (max |grad| {grad_scale:.3g}); max |param diff| {param_diff:.3g} "
          f"(max |update| {moved:.3g}){note}")
    for k in a["grads"]:
        torch.testing.assert_close(b["grads"][k], a["grads"][k], rtol=1e-4, atol=1e-6 * grad_scale)
    for k in a["params"]:
        torch.testing.assert_close(b["params"][k], a["params"][k], rtol=0, atol=1e-5)


def test_fsdp_step_equals_single_process_step_on_the_doubled_batch(tmp_path):
    """FSDP2 (fully_shard, gloo): uneven shards (rank 0: 3 groups in 5 micro-batches, rank 1: 1 group in 2, padded
    with dummy passes) give the single-process gradient and step of the whole batch."""
    a, b = _single_and_two_ranks(tmp_path, "fsdp")
    assert b["sharded"].startswith("FSDP")  # the policy was sharded with fully_shard
    _assert_same_step(a, b, "FSDP")


def _grpo_args(gsm8k_dir, run, steps, *extra):
    return [str(REPO / "grpo.py"), "--config-name=grpo_gsm8k", "actor.path=tiny-random", f"train.steps={steps}", "train.batch_size=2",
            "gconfig.n_samples=2", "gconfig.max_new_tokens=8", "eval.n_problems=0", "stats_logger.wandb.mode=disabled",
            "stats_logger.progress_bar=false", f"train_dataset.path={gsm8k_dir}", f"hydra.run.dir={run}", *extra]


@pytest.mark.slow  # end-to-end, 35-80 s on 2 cores: the slow stage (README: the unit command stays ~10 min)
def test_fsdp_run_writes_from_rank0_and_its_checkpoints_load_at_any_world_size(tmp_path, gsm8k_dir):
    """torchrun grpo.py train.strategy=fsdp: rank 0 alone writes; its checkpoint is the single-process one (full
    weights, optimizer state by parameter index), resumes on one process, and that one resumes under FSDP."""
    from safetensors.torch import load_file

    run = tmp_path / "fsdp"
    p = _torchrun(_grpo_args(gsm8k_dir, run, 2, "train.strategy=fsdp", "checkpoint.every=1",
                             "checkpoint.keep_last=2"), cwd=tmp_path)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    assert all(r["dist/world_size"] == 2.0 for r in rows if "reward/mean" in r)
    assert json.loads((run / "plan.json").read_text())["placements"]["train"]["engine"] == "fsdp"
    assert sorted(x.name for x in (run / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    assert [p for p in tmp_path.rglob("*") if p.is_file() and run not in p.parents] == []  # rank 1 wrote nothing
    ckpt = run / "checkpoints" / "step_000002"
    weights = load_file(str(ckpt / "model" / "model.safetensors"))
    osd = torch.load(ckpt / "optimizer.pt", weights_only=False)
    assert weights["model.embed_tokens.weight"].shape[1] == weights["model.norm.weight"].shape[0] == 64  # full
    assert sorted(osd["state"]) == list(range(len(osd["state"])))  # single-process layout: parameter indices
    assert osd["state"][0]["exp_avg"].shape == weights["model.embed_tokens.weight"].shape  # full, not a shard
    # world size 2 -> 1
    one = tmp_path / "one"
    p = subprocess.run([sys.executable, *_grpo_args(gsm8k_dir, one, 3, f"train.resume_from={ckpt}")], cwd=tmp_path,
                       env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert [json.loads(x)["step"] for x in (one / "metrics.jsonl").read_text().splitlines()
            if "reward/mean" in x] == [3]
    # world size 1 -> 2 (FSDP loads the full single-process checkpoint, shards it)
    two = tmp_path / "two"
    p = _torchrun(_grpo_args(gsm8k_dir, two, 4, "train.strategy=fsdp",
                             f"train.resume_from={one / 'checkpoints' / 'step_000003'}"), cwd=tmp_path)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert [json.loads(x)["step"] for x in (two / "metrics.jsonl").read_text().splitlines()
            if "reward/mean" in x] == [4]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, gsm8k_dir):
    tmp = tmp_path_factory.mktemp("ddp-run")
    run = tmp / "run"
    args = [str(REPO / "grpo.py"), "--config-name=grpo_gsm8k", "actor.path=tiny-random", "train.strategy=ddp", "train.steps=2",
            "train.batch_size=2", "gconfig.n_samples=2", "gconfig.max_new_tokens=8", "eval.n_problems=2",
            "checkpoint.every=1", "checkpoint.keep_last=2", "stats_logger.wandb.mode=disabled",
            "stats_logger.progress_bar=false", f"train_dataset.path={gsm8k_dir}", f"hydra.run.dir={run}"]
    p = _torchrun(args, cwd=tmp)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return run, tmp, p


def test_torchrun_grpo_only_rank0_writes(ddp_run):
    run, tmp, _p = ddp_run
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in train_rows] == [1, 2]  # one row per step: rank 1 logged nothing
    assert all(r["dist/world_size"] == 2.0 for r in train_rows)
    assert all(r["rollout/episodes"] == 2.0 for r in train_rows)  # each rank: 1 task x 2 samples (mean over ranks)
    plan = json.loads((run / "plan.json").read_text())
    assert plan["world_size"] == 2 and plan["placements"]["train"]["engine"] == "ddp"
    assert sorted(x.name for x in (run / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    samples = (run / "samples.jsonl").read_text().splitlines()
    assert [json.loads(s)["step"] for s in samples] == [1, 2]  # rank 0's one group per step, first episode
    # nothing else of the run anywhere below the working dir: rank 1's own files went to a throwaway dir
    others = [p for p in tmp.rglob("*") if p.is_file() and run not in p.parents]
    assert others == []
    ranks = {r.get("dist/world_size") for r in rows if "eval/accuracy" in r}
    assert ranks  # rank 0's evaluation rows


def test_ddp_checkpoint_resumes_on_one_process(ddp_run, gsm8k_dir):
    run, tmp, _ = ddp_run
    out = tmp / "resumed"
    args = [str(REPO / "grpo.py"), "--config-name=grpo_gsm8k", "actor.path=tiny-random", "train.steps=3", "train.batch_size=2",
            "gconfig.n_samples=2", "gconfig.max_new_tokens=8", "eval.n_problems=0", "stats_logger.wandb.mode=disabled",
            "stats_logger.progress_bar=false", f"train_dataset.path={gsm8k_dir}", f"hydra.run.dir={out}",
            f"train.resume_from={run / 'checkpoints' / 'step_000002'}"]
    p = subprocess.run([sys.executable, *args], cwd=tmp, env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [3]


def test_ddp_outside_torchrun_is_a_clear_error(tmp_path, gsm8k_dir):
    env = {k: v for k, v in ENV.items() if k not in ("RANK", "WORLD_SIZE")}
    p = subprocess.run([sys.executable, str(REPO / "grpo.py"), "--config-name=grpo_gsm8k", "actor.path=tiny-random", "train.strategy=ddp",
                        f"train_dataset.path={gsm8k_dir}", f"hydra.run.dir={tmp_path / 'r'}"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "needs torchrun" in p.stderr
