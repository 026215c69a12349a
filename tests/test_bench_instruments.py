"""The two-arm instruments run where the user is (issue 35 item 1): device / dtype resolution, what both arms run
at, the metadata every results file records, TRL's micro-batch for our number of passes, a ``.gguf`` converted once
so both arms load the same HF directory, and the one-command table's CPU smoke (slow)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.bench_experiments import load

h = load("harness")
tta = load("time_to_accuracy")
REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------- device and dtype
def test_auto_is_cpu_without_cuda_and_cuda_is_refused_clearly(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert h.resolve_device("auto") == "cpu" and h.resolve_device("cpu") == "cpu"
    with pytest.raises(SystemExit, match="CUDA is not available"):
        h.resolve_device("cuda")
    with pytest.raises(SystemExit, match="--device"):
        h.resolve_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert h.resolve_device("auto") == "cuda" and h.resolve_device("cpu") == "cpu"


def test_both_arms_share_weights_dtype_and_autocast_only_on_cuda():
    assert h.precision("cpu", "float32") == {"weights": "float32", "ours_autocast": None, "trl_bf16": False}
    assert h.precision("cuda", "bfloat16") == {"weights": "bfloat16", "ours_autocast": "bf16", "trl_bf16": True}
    with pytest.raises(ValueError, match="dtype"):
        h.precision("cpu", "float16")
    with pytest.raises(ValueError, match="resolve_device"):
        h.precision("auto", "float32")


def test_argparse_defaults_keep_cpu_float32_where_there_is_no_gpu(monkeypatch):
    import argparse

    p = argparse.ArgumentParser()
    h.add_device_args(p)
    a = p.parse_args([])
    assert (a.device, a.dtype) == ("auto", "float32")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert h.resolve_device(a.device) == "cpu"
    with pytest.raises(SystemExit):
        p.parse_args(["--dtype", "int8"])


def test_every_results_file_gets_device_dtype_versions_load_and_command():
    m = h.instrument_meta("cpu", "float32")
    assert {"device", "device_name", "dtype", "precision", "versions", "loadavg", "command", "date", "commit"} <= set(m)
    assert m["device"] == "cpu" and m["device_name"].endswith(f"x{os.cpu_count()}") and len(m["loadavg"]) == 3
    assert set(m["versions"]) >= {"torch", "transformers", "trl"} and m["versions"]["torch"] == torch.__version__
    line = h.meta_line(m)
    assert "**cpu**" in line and "float32" in line and f"torch {torch.__version__}" in line and m["command"] in line


# ----------------------------------------------------------------------------------------------- the same micro-batch budget
@pytest.mark.parametrize("per_step,passes,micro", [(64, 16, 4), (64, 1, 64), (64, 3, 32), (64, 64, 1), (12, 5, 3)])
def test_trl_micro_batch_runs_at_most_our_passes_in_whole_micro_batches(per_step, passes, micro):
    got = tta.trl_micro_batch(per_step, passes)
    assert got == micro and per_step % got == 0 and per_step // got <= passes
    with pytest.raises(ValueError):
        tta.trl_micro_batch(64, 0)


def _tta_args(tmp_path, micro_batch):
    return SimpleNamespace(prompts=8, samples=8, max_new_tokens=48, micro_batch=micro_batch, seed=1, steps=16, lr=1e-5,
                           eval_every=4, dtype="float32", device="cpu", out_root=str(tmp_path))


def test_our_passes_come_from_our_config_or_from_our_logged_run(tmp_path):
    a = _tta_args(tmp_path, 4)
    got = tta.our_passes(a, max_prompt_tokens=100)
    assert got["passes"] == 16 and got["source"] == "config" and got["worst_case_tokens"] == 148
    got0 = tta.our_passes(_tta_args(tmp_path, 0), max_prompt_tokens=100)  # our config's own micro-batching
    mbs = got0["micro_batch_size"]
    if not (isinstance(got0["token_budget"], int) and got0["token_budget"] > 0):  # count cap only
        assert got0["passes"] == (-(-64 // mbs) if mbs > 0 else 1)
    else:  # the token budget (worst case 148 tokens per sequence) can only add passes
        assert got0["passes"] >= (-(-64 // mbs) if mbs > 0 else 1)
    run = tmp_path / "ours" / "seed1"
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps({"steps": [{"passes": 2}, {"passes": 2}, {"passes": 3}]}))
    got = tta.our_passes(a, max_prompt_tokens=100)
    assert got["passes"] == 2 and got["source"].startswith("measured")


# ----------------------------------------------------------------------------------------------- a .gguf model
def _write_tiny_gguf(path: Path) -> None:
    """tiny-random as an F32 llama GGUF (byte-level BPE tokenizer in the file), written with the gguf package."""
    gguf = pytest.importorskip("gguf")
    from torchrl_grpo.model_store import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny-random")
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-gguf-test")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    spec = json.loads(tok.backend_tokenizer.to_str())
    added = {t["id"]: t["content"] for t in spec["added_tokens"]}
    n = max(cfg.vocab_size, max(added) + 1)
    tokens = [f"<unused{i}>" for i in range(n)]
    types = [5] * n  # unused
    for t, i in spec["model"]["vocab"].items():
        tokens[i], types[i] = t, 1  # normal
    for i, t in added.items():
        tokens[i], types[i] = t, 3  # control
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]])
    w.add_eos_token_id(tok.eos_token_id)
    w.add_bos_token_id(tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for i in range(cfg.num_hidden_layers):
        for ours, theirs in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
                             ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
                             ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"),
                             ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down")):
            names[f"model.layers.{i}.{ours}.weight"] = f"blk.{i}.{theirs}.weight"
    for k, v in model.state_dict().items():
        if k in names:  # lm_head is tied to the embedding
            w.add_tensor(names[k], v.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    _write_tiny_gguf(p)
    return p


def test_a_gguf_is_converted_once_and_both_arms_load_the_same_hf_dir(tiny_gguf, tmp_path, monkeypatch):
    from torchrl_grpo.model_store import gguf_conversion as gguf_mod
    from torchrl_grpo.model_store import load_model_and_tokenizer
    from torchrl_grpo.model_store.loading import hf_model_dir

    monkeypatch.setenv("TORCHRL_GRPO_CACHE", str(tmp_path / "cache"))
    calls = []
    real = gguf_mod._convert_gguf_to_hf
    monkeypatch.setattr(gguf_mod, "_convert_gguf_to_hf", lambda src, out: (calls.append(src), real(src, out)))
    d1 = Path(hf_model_dir(str(tiny_gguf)))
    copy = tmp_path / "elsewhere" / "renamed.gguf"
    copy.parent.mkdir()
    copy.write_bytes(tiny_gguf.read_bytes())
    d2 = Path(h.same_weights(str(copy)))  # the instruments' entry: same content -> the same directory, no conversion
    assert d1 == d2 and len(calls) == 1 and (d1 / "config.json").is_file()
    assert d1.is_relative_to(tmp_path / "cache") and json.loads((d1 / ".torchrl_grpo_model.json").read_text())["sha256"]
    m_dir, t_dir = load_model_and_tokenizer(str(d1))
    m_gguf, t_gguf = load_model_and_tokenizer(str(tiny_gguf))  # what our trainer alone would load
    assert not getattr(m_dir, "is_quantized", False) and getattr(m_dir.config, "quantization_config", None) is None
    sd_dir, sd_gguf = m_dir.state_dict(), m_gguf.state_dict()
    assert sd_dir.keys() == sd_gguf.keys() and all(torch.equal(sd_dir[k], sd_gguf[k]) for k in sd_dir)
    text = "What is 12 + 30?"
    assert t_dir(text).input_ids == t_gguf(text).input_ids


def test_other_specs_pass_through_and_a_non_gguf_file_is_refused(tmp_path):
    from torchrl_grpo.model_store import ModelResolutionError
    from torchrl_grpo.model_store.gguf_conversion import convert_gguf_cached

    assert h.same_weights("tiny-random") == "tiny-random"
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text("{}")
    assert h.same_weights(str(hf_dir)) == str(hf_dir)
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(ModelResolutionError, match="not an existing .gguf"):
        convert_gguf_cached(tmp_path / "w.bin")
    with pytest.raises(ModelResolutionError, match="not an existing .gguf"):
        convert_gguf_cached(tmp_path / "missing.gguf")


# ----------------------------------------------------------------------------------------------- the table, CPU smoke
@pytest.mark.slow
@pytest.mark.nightly  # ~9 min on 2 cores: outside CI's slow stage
def test_gpu_table_cpu_smoke_writes_every_stage_with_its_device(tmp_path):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_table.py"), "--tiny", "--device", "cpu",
                        "--seeds", "1", "--out", str(tmp_path / "t"), "--budget-s", "1200", "--stage-timeout-s", "400"],
                       capture_output=True, text=True, timeout=1500, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    t = json.loads((tmp_path / "t" / "table.json").read_text())
    stages = [r["stage"] for r in t["rows"]]
    assert any(s.startswith("train_bench") for s in stages) and any(s.startswith("default run") for s in stages)
    assert all(r["status"] == "ok" for r in t["rows"]), t["rows"]
    assert {f"time_to_accuracy {arm} seed 1" for arm in ("ours", "trl", "trl_same_mb")} <= set(stages)
    md = (tmp_path / "t" / "table.md").read_text()
    body = [x for x in md.splitlines() if x.startswith("| ") and not x.startswith("| stage")]
    assert body and all(t["meta"]["device_name"] in x or "cpu" in x.lower() for x in body)
