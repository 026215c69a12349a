"""Issue 48 item 4, where a multi-turn step's time goes: generation / env / update seconds, tokens generated and
trained, and the update's model FLOPs, FLOP/s, the in-process matmul peak and MFU, logged every step
(docs/metrics.md), and ``benchmarks/step_time_split.py``, which summarises them.

The FLOP count (``torchrl_grpo/reporting/flops.py``) is checked against a hand computation on the tiny Llama's config
and against ``torch.utils.flop_counter.FlopCounterMode``, torch's own count of the matmuls that ran (on CPU it does
not count the SDPA kernel: the attention term is added by hand). Tests check behaviour, never timings."""
from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import tests.toy_envs  # noqa: F401  (registers ToyVowels-v0)
from tests.test_tau2_training import tau2_cfg
from tests.test_trainer import make_cfg
from torchrl_grpo.assembly import build_trainer
from torchrl_grpo.reporting import flops as flops_mod
from torchrl_grpo.reporting.flops import FlopCounter, ModelFlops, matmul_peak_flops, model_dims, update_peak_flops
from torchrl_grpo.training.async_trainer import AsyncGRPOTrainer

REPO = Path(__file__).resolve().parents[1]

#: every metric issue 48 item 4 adds or relies on, present and finite in each training row
TIME_KEYS = ("rollout/generate_time_s", "rollout/env_time_s", "rollout/reset_time_s", "time/train_s", "time/sync_s",
             "time/step_s")
WORK_KEYS = ("rollout/generated_tokens", "train/tokens", "train/tokens_padded", "num_tokens",
             "perf/update_decoder_tokens", "perf/update_flops", "perf/update_flops_per_s",
             "perf/matmul_peak_flops_per_s", "perf/update_mfu")

# the tiny_llama fixture's config (tests/conftest.py), by hand
L, H, FF, V, HEADS, KV_HEADS = 2, 64, 128, 300, 4, 2
D = H // HEADS  # head dim 16
N_LAYER = H * HEADS * D + 2 * H * KV_HEADS * D + HEADS * D * H + 3 * H * FF  # q, k, v, o, gate/up/down
N = L * N_LAYER  # 73,728 decoder matmul weights
D_ATTN = HEADS * D


# ----------------------------------------------------------------------------------------------- the count by hand
def test_model_flops_of_the_tiny_llama_by_hand(tiny_llama):
    m = tiny_llama()
    mf = ModelFlops.of(m)
    assert N == 73_728
    assert (mf.matmul_params, mf.trainable_matmul_params, mf.layers, mf.attn_dim) == (N, N, L, D_ATTN)
    assert (mf.head_params, mf.head_trains, mf.trains) == (V * H, True, True)
    assert model_dims(m) == {"layers": L, "hidden": H, "attn_dim": D_ATTN, "intermediate": FF}
    b, S, P = 3, 10, 6
    fwd = 2 * N * b * S + 2 * 2 * L * b * S * S * D_ATTN  # Kaplan's 2N per token + QK^T and AV (PaLM, Chinchilla)
    assert mf.decoder_pass(b, S, S, backward=False) == fwd
    assert mf.decoder_pass(b, S, S, backward=True) == 6 * N * b * S + 3 * 2 * 2 * L * b * S * S * D_ATTN  # 6N, x3
    # S query tokens after a P-token KV cache attend to P + S keys
    assert mf.decoder_pass(b, S, P + S, backward=False) == 2 * N * b * S + 4 * L * b * S * (P + S) * D_ATTN
    assert mf.head_pass(7, backward=False) == 2 * H * V * 7
    assert mf.head_pass(7, backward=True) == 6 * H * V * 7  # tied, trainable: input and weight gradients
    frozen = dataclasses.replace(mf, trainable_matmul_params=1000, head_trains=False)  # LoRA-like: ~4N + 2 N_w
    assert frozen.decoder_pass(b, S, S, backward=True) == (4 * N + 2 * 1000) * b * S + 12 * L * b * S * S * D_ATTN
    assert frozen.head_pass(7, backward=True) == 4 * H * V * 7
    assert dataclasses.replace(mf, trains=False).decoder_pass(b, S, S, backward=True) == fwd  # nothing trains


def _counted(model, run) -> tuple[float, float]:
    """(our count, FlopCounterMode's matmul count) of ``run()`` on ``model``."""
    c = FlopCounter()
    with FlopCounterMode(display=False) as fc, c.watching(model):
        run(c)
    return c.flops, float(fc.get_total_flops())


def test_the_counter_equals_torchs_matmul_count_plus_the_attention_term(tiny_llama):
    """Full fine-tuning forward + backward, a no-grad forward, and a pass after a KV cache: our count minus the
    attention term (which FlopCounterMode does not see in CPU SDPA) is exactly torch's count of the matmuls that ran."""
    m = tiny_llama()
    ids = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(0))

    def train(c):
        logits = m(input_ids=ids).logits
        c.head(m, ids.numel(), backward=True)
        logits.float().sum().backward()

    ours, torch_mm = _counted(m, train)
    assert ours - 12 * L * 3 * 10 * 10 * D_ATTN == torch_mm

    def score(c):
        with torch.no_grad():
            m(input_ids=ids)
            c.head(m, ids.numel())

    ours, torch_mm = _counted(m, score)
    assert ours - 4 * L * 3 * 10 * 10 * D_ATTN == torch_mm
    with torch.no_grad():
        cache = m(input_ids=ids[:, :6], use_cache=True).past_key_values

    def after_cache(c):
        with torch.no_grad():
            m(input_ids=ids[:, 6:], past_key_values=cache, use_cache=True)
            c.head(m, 3 * 4)

    ours, torch_mm = _counted(m, after_cache)
    assert ours - 4 * L * 3 * 4 * 10 * D_ATTN == torch_mm


def test_lora_counts_the_frozen_weights_activation_gradient(tiny_llama):
    """LoRA: N_w is the adapters' r (d_in + d_out) each; the backward is 4N + 2 N_w per token. Torch's count is lower
    by exactly the documented over-count: with the embedding frozen, the first layer's q/k/v (and their lora_A)
    need no input gradient."""
    peft = pytest.importorskip("peft")
    m = peft.get_peft_model(tiny_llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                          lora_dropout=0.0))
    mf = ModelFlops.of(m)
    adapters = L * 4 * ((H + H) + (H + KV_HEADS * D) * 2 + (H + H) + (H + FF) * 2 + (FF + H))  # r (d_in + d_out)
    assert (mf.trainable_matmul_params, mf.matmul_params, mf.head_trains) == (adapters, N + adapters, False)
    ids = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(1))

    def train(c):
        logits = m(input_ids=ids).logits
        c.head(m, ids.numel(), backward=True)
        logits.float().sum().backward()

    ours, torch_mm = _counted(m, train)
    first_qkv = (H * H + 2 * H * KV_HEADS * D) + 3 * 4 * H  # layer 0's q/k/v weights and their lora_A
    assert ours - 12 * L * 3 * 10 * 10 * D_ATTN - torch_mm == 2 * first_qkv * ids.numel()


def test_a_model_without_dimensions_is_not_counted_and_does_not_fail():
    net = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="no layer count"):
        model_dims(net)
    c = FlopCounter()
    with c.watching(net):
        net(torch.zeros(2, 4))
    assert math.isnan(c.flops)


# ----------------------------------------------------------------------------------------------- the peak probe
def test_the_matmul_peak_is_positive_and_bad_shapes_are_refused(tiny_llama):
    assert 0 < matmul_peak_flops([(64, 64, 128), (64, 128, 64)], repeats=2) < math.inf
    assert 0 < update_peak_flops(tiny_llama(), 100, device="cpu") < math.inf
    for bad in ([], [(0, 4, 4)]):
        with pytest.raises(ValueError, match="positive sizes"):
            matmul_peak_flops(bad)
    with pytest.raises(ValueError, match="repeats"):
        matmul_peak_flops([(4, 4, 4)], repeats=0)


# ----------------------------------------------------------------------------------------------- logged every step
def _rows(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "time/step_s" in r]


def _capture_batches(trainer) -> list:
    """The collector's batches of the trainer's steps (before the group filters), appended as they are collected."""
    seen, collect = [], trainer.collector.collect

    def wrapped(*a, **kw):
        seen.append(collect(*a, **kw))
        return seen[-1]

    trainer.collector.collect = wrapped
    return seen


def _check_row(row: dict, *, sync: bool = True) -> None:
    for k in TIME_KEYS + WORK_KEYS:
        assert isinstance(row.get(k), (int, float)) and math.isfinite(row[k]), (k, row.get(k))
        assert row[k] >= 0, (k, row[k])
    assert row["rollout/reset_time_s"] <= row["rollout/env_time_s"]
    assert row["perf/update_flops"] > 0 and row["perf/matmul_peak_flops_per_s"] > 0
    assert row["perf/update_mfu"] == pytest.approx(row["perf/update_flops_per_s"] / row["perf/matmul_peak_flops_per_s"])
    assert row["perf/update_flops_per_s"] == pytest.approx(row["perf/update_flops"] / row["time/train_s"], rel=1e-6)
    assert row["num_tokens"] <= row["train/tokens"] <= row["train/tokens_padded"]
    if sync:  # the parts are disjoint wall-clock spans of the step
        parts = sum(row[k] for k in ("rollout/generate_time_s", "rollout/env_time_s", "time/train_s", "time/sync_s"))
        assert parts <= row["time/step_s"] + 1e-3


@pytest.mark.parametrize("micro", [16, 3])
def test_a_digit_step_logs_the_split_and_the_tokens_the_batch_holds(tmp_path, micro):
    """One step on ToyVowels (16 episodes; zero-variance groups are kept by default): every metric is in metrics.jsonl and
    finite; the token counts are the batch's masks (one micro-batch: its padded tensor; 3 episodes per micro-batch,
    each cut to its longest row: between the real tokens and the whole padded batch)."""
    cfg = make_cfg(train={"steps": 1, "micro_batch_size": micro})
    trainer = build_trainer(cfg, tmp_path)
    batches = _capture_batches(trainer)
    trainer.fit()
    trainer.close()
    (row,) = _rows(tmp_path)
    _check_row(row)
    (b,) = batches
    assert row["rollout/generated_tokens"] == b["response_mask"].sum() == row["num_tokens"]
    assert row["train/tokens"] == b["attention_mask"].sum()
    if micro >= b.shape[0]:
        assert row["train/tokens_padded"] == b["tokens"].numel()
    else:
        assert row["train/tokens"] <= row["train/tokens_padded"] <= b["tokens"].numel()
    # the decoder ran each group's prompt once (the shared prefix), so fewer positions than the real tokens
    assert row["perf/update_decoder_tokens"] < row["train/tokens"]


def test_the_updates_count_covers_every_pass_it_runs(tmp_path, monkeypatch):
    """With a KL reference and two epochs (a reference pass, an anchor recompute, two loss passes), our matmul
    count (the attention term set to 0) is never below torch's count of the update's matmuls, and above it by no
    more than the shared prefix's last-layer backward (under 1/L = 50% of its prefix backward on the 2-layer model:
    bounded here by 10% of the total)."""
    of = ModelFlops.of.__func__
    monkeypatch.setattr(flops_mod.ModelFlops, "of", classmethod(lambda cls, m: dataclasses.replace(of(cls, m),
                                                                                                   attn_dim=0)))
    cfg = make_cfg(train={"steps": 1, "ppo_epochs": 2}, loss={"kl_coef": 0.1})
    trainer = build_trainer(cfg, tmp_path)
    update, counted = trainer.components.update, {}
    inner = update._update

    def watched(*a, **kw):
        with FlopCounterMode(display=False) as fc:
            out = inner(*a, **kw)
        counted["torch"] = float(fc.get_total_flops())
        return out

    update._update = watched
    m = trainer.train_step()
    trainer.close()
    assert counted["torch"] <= m["perf/update_flops"] <= 1.1 * counted["torch"]


def test_a_multi_turn_tau2_mock_step_logs_the_split(tmp_path):
    """Two turns of tau2 mock (solo) with the tiny model: env time covers resets and steps, tokens match the batch."""
    cfg = tau2_cfg("mock", "base", train={"steps": 1, "batch_size": 1, "micro_batch_size": 2},
                   econfig={"max_turns": 2, "max_steps": 4})
    trainer = build_trainer(cfg, tmp_path)
    batches = _capture_batches(trainer)
    trainer.fit()
    trainer.close()
    (row,) = _rows(tmp_path)
    _check_row(row)
    (b,) = batches
    assert row["rollout/env_time_s"] > 0 and row["rollout/generate_time_s"] > 0
    assert row["rollout/generated_tokens"] == b["response_mask"].sum() == row["num_tokens"]
    assert row["train/tokens"] == b["attention_mask"].sum()


def test_the_async_trainer_logs_the_same(tmp_path):
    cfg = make_cfg(mode="async", train={"steps": 1, "max_staleness": 0})
    trainer = build_trainer(cfg, tmp_path, trainer_cls=AsyncGRPOTrainer)
    trainer.fit()
    trainer.close()
    (row,) = _rows(tmp_path)
    _check_row(row, sync=False)


# ----------------------------------------------------------------------------------------------- the summariser
def _summarise(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "step_time_split.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_the_summariser_prints_means_medians_and_shares(tmp_path):
    rows = [{"step": 0, "eval/accuracy": 0.5},  # an evaluation row: not a training step
            {"step": 1, "time/step_s": 10.0, "rollout/generate_time_s": 5.0, "rollout/env_time_s": 1.0,
             "time/train_s": 3.0, "time/sync_s": 0.5, "perf/update_mfu": 0.25, "perf/update_flops_per_s": 2e9},
            {"step": 2, "time/step_s": 30.0, "rollout/generate_time_s": 15.0, "rollout/env_time_s": 3.0,
             "time/train_s": 9.0, "time/sync_s": 1.5, "perf/update_mfu": 0.5, "perf/update_flops_per_s": 4e9},
            {"step": 3, "time/step_s": 20.0, "rollout/generate_time_s": 10.0, "rollout/env_time_s": 2.0,
             "time/train_s": 6.0, "time/sync_s": 1.0, "perf/update_mfu": 0.75, "perf/update_flops_per_s": 3e9}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = _summarise(tmp_path)
    assert p.returncode == 0, p.stderr

    def line(label: str) -> str:
        (out,) = [x for x in p.stdout.splitlines() if x.startswith(f"| {label}")]
        return out

    assert "3 step(s)" in p.stdout
    assert line("generation").endswith("| 10 | 10 | 50.0% |")
    assert line("env").endswith("| 2 | 2 | 10.0% |")
    assert line("update (").endswith("| 6 | 6 | 30.0% |")
    assert line("weight sync").endswith("| 1 | 1 | 5.0% |")
    assert line("other").endswith("| 1 | 1 | 5.0% |")  # 10 - 9.5, 30 - 28.5, 20 - 19
    assert line("step").endswith("| 20 | 20 | 100.0% |")
    assert line("update MFU").endswith("| 0.5000 | 0.5000 |")
    assert line("update achieved FLOP/s").endswith("| 3 G | 3 G |")
    assert line("tokens generated").endswith("| - | - |")  # not logged by this run
    p = _summarise(tmp_path, "--skip-first", "1")
    assert "2 step(s)" in p.stdout and "| 12.5 | 12.5 | 50.0% |" in p.stdout


def test_the_summariser_reads_a_real_run_and_refuses_what_is_not_one(tmp_path):
    run = tmp_path / "run"
    trainer = build_trainer(make_cfg(train={"steps": 1}), run)
    trainer.fit()
    trainer.close()
    p = _summarise(run)
    assert p.returncode == 0, p.stderr
    assert "1 step(s)" in p.stdout and "| - |" not in p.stdout.split("| work per step")[1]  # every work row logged
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.jsonl").write_text('{"step": 1, "time/step_s": 1}\nnot json\n')
    for path, message in ((tmp_path / "none", "no metrics.jsonl"), (tmp_path / "bad", "metrics.jsonl:2: not a JSON")):
        p = _summarise(path)
        assert p.returncode == 1 and message in p.stderr, p.stderr
