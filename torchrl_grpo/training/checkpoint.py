"""Crash-safe training checkpoints: model (full weights or LoRA adapter), optimizer, scheduler, RNG states, step
and the resolved config.

Layout of ``<run_dir>/checkpoints/step_000010/``::

    model/               HF ``save_pretrained`` dir (safetensors) — or the peft adapter dir with LoRA
    tokenizer/           the tokenizer, so the checkpoint loads on its own
    optimizer.pt         optimizer state dict
    scheduler.pt         LR scheduler state dict
    trainer_state.pt     {"step", "rng": {python, numpy, torch, cuda}, "extra", "peft"}
    config.yaml          the resolved run config
    <payload files>      the trainer's own extra state, if any (``payload``; SFT: ``sft_phase_data.pt``)
    COMPLETE.json        completeness marker, written last: {"format": 1, "step", "files": {relative path: bytes}}

Names in ``checkpoints/`` other than ``step_<n>`` (one writer per directory)::

    .tmp_step_<n>_*      a save in progress, or debris of a killed one: never loaded, removed by the next save
    .tmp_del_*           a checkpoint being deleted (renamed first, so a half-deleted dir never looks like one)
    .old_step_<n>_*      the previous ``step_<n>`` while a save of the same step replaces it

Save protocol (:func:`save_checkpoint`; the order is what makes a SIGKILL or power loss at any point harmless):

1. clear debris of earlier killed saves: remove ``.tmp_*``; rename a complete ``.old_step_<n>_*`` back to
   ``step_<n>`` when that is missing or incomplete, else remove it;
2. write everything into ``.tmp_step_<n>_*``; fsync every file and directory; write ``COMPLETE.json`` with each
   file's size, fsync it, fsync the temp dir;
3. if ``step_<n>`` exists, rename it aside to ``.old_step_<n>_*``; rename the temp dir to ``step_<n>``; fsync
   ``checkpoints/`` (both renames are now durable);
4. remove the aside copy and the pruned checkpoints (``keep_last``), each renamed to ``.tmp_del_*`` first.

Crash windows: before 3 the previous checkpoints are untouched; between the two renames of 3, ``step_<n>`` is
missing and its previous version is the ``.old_step_<n>_*`` copy, which :func:`latest_checkpoint` then uses (and
the next save renames back). SIGKILL alone keeps the page cache; the fsyncs are for power loss and kernel crashes.

Completeness (:func:`latest_checkpoint`, pruning): a ``step_<n>`` dir is complete when its ``COMPLETE.json``
parses and every file it lists exists with the listed size (sizes catch truncation and missing files, not bit
flips: hashing multi-GB weights on every save and resume is not worth it here). Checkpoints written before the
marker existed have none; they count as complete when ``trainer_state.pt`` and ``model/*.safetensors`` are
present (a warning says so). Justification: the earlier code also wrote to a temp dir and renamed it, so every
``step_<n>`` it produced was whole, except one half-deleted by a killed overwrite or prune, which loses one of
those files in most deletion orders; the code here never leaves an unmarked ``step_<n>``, so this rule only ever
applies to old runs, and rejecting them would make every pre-marker run unresumable.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import random
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchrl_grpo.backends.weight_sync import export_hf_weights

__all__ = ["MARKER", "latest_checkpoint", "load_checkpoint", "rng_state", "save_checkpoint", "save_final_model",
           "set_rng_state"]

log = logging.getLogger(__name__)

#: completeness marker, the last file written into a checkpoint
MARKER = "COMPLETE.json"
_TMP = ".tmp_"  # disposable: unfinished saves and checkpoints being deleted
_LAYOUT = ("model", "tokenizer", "optimizer.pt", "scheduler.pt", "trainer_state.pt", "config.yaml", MARKER)
_STEP_RE = re.compile(r"step_(\d+)")
_ASIDE_RE = re.compile(r"\.old_step_(\d+)_[0-9a-f]+")


def rng_state() -> dict[str, Any]:
    """Snapshot of python, numpy and torch (CPU and CUDA) RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore a :func:`rng_state` snapshot. CUDA: the states of devices ``0 .. min(saved, visible) - 1`` (a run
    saved on more GPUs than this machine shows, e.g. resumed under another ``CUDA_VISIBLE_DEVICES``, would make
    ``torch.cuda.set_rng_state_all`` raise IndexError); a warning names the devices whose state is not restored."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        saved, visible = list(state["cuda"]), torch.cuda.device_count()
        if len(saved) != visible:
            log.warning("checkpoint has RNG states of %d CUDA devices, %d visible: restoring devices 0..%d only",
                        len(saved), visible, min(len(saved), visible) - 1)
        for i, s in enumerate(saved[:visible]):
            torch.cuda.set_rng_state(s, i)


def _is_peft(model) -> bool:
    return hasattr(model, "peft_config")


def _fsync(path: Path) -> None:
    """fsync a file or directory (directories: skipped where the OS or filesystem cannot)."""
    if os.name == "nt" and path.is_dir():  # pragma: no cover  (Windows cannot open a directory)
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems (e.g. network ones) refuse fsync on directories
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _seal(tmp: Path, step: int) -> None:
    """fsync every file and subdirectory of ``tmp``, then write and fsync ``MARKER``, then fsync ``tmp``."""
    files: dict[str, int] = {}
    for dirpath, _dirnames, filenames in os.walk(tmp, topdown=False):
        d = Path(dirpath)
        for name in sorted(filenames):
            _fsync(d / name)
            files[(d / name).relative_to(tmp).as_posix()] = (d / name).stat().st_size
        if d != tmp:
            _fsync(d)
    with open(tmp / MARKER, "w") as f:
        json.dump({"format": 1, "step": step, "files": dict(sorted(files.items()))}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync(tmp)


def _problem(ckpt: Path) -> str | None:
    """Why ``ckpt`` is not a complete checkpoint, or None when it is (see "Completeness" in the module doc)."""
    marker = ckpt / MARKER
    if not marker.is_file():
        if not (ckpt / "trainer_state.pt").is_file():
            return f"no {MARKER} and no trainer_state.pt"
        if not any((ckpt / "model").glob("*.safetensors")):
            return f"no {MARKER} and no model/*.safetensors"
        return None
    try:
        files = json.loads(marker.read_text())["files"]
        files = {str(k): int(v) for k, v in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"unreadable {MARKER} ({type(e).__name__}: {e})"
    for rel, size in files.items():
        try:
            actual = (ckpt / rel).stat().st_size
        except OSError:
            return f"{rel} is missing"
        if actual != size:
            return f"{rel} has {actual} bytes, {MARKER} lists {size}"
    return None


def _scan(root: Path) -> tuple[dict[int, Path], dict[int, list[Path]], list[Path]]:
    """``step_<n>`` dirs by step, ``.old_step_<n>_*`` aside copies by step, and ``.tmp_*`` debris in ``root``."""
    steps: dict[int, Path] = {}
    asides: dict[int, list[Path]] = {}
    debris: list[Path] = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(_TMP):
            debris.append(entry)
        elif not entry.is_dir():
            continue
        elif m := _STEP_RE.fullmatch(entry.name):
            steps[int(m.group(1))] = entry
        elif m := _ASIDE_RE.fullmatch(entry.name):
            asides.setdefault(int(m.group(1)), []).append(entry)
    return steps, asides, debris


def _discard(root: Path, paths: list[Path]) -> None:
    """Delete dirs of ``root``: rename each to ``.tmp_del_*`` (fsync ``root``), then remove them."""
    trash = []
    for p in paths:
        t = root / f"{_TMP}del_{p.name.lstrip('.')}_{uuid.uuid4().hex[:8]}"
        os.replace(p, t)
        trash.append(t)
    if trash:
        _fsync(root)
    for t in trash:
        shutil.rmtree(t, ignore_errors=True)


def _recover(root: Path) -> None:
    """Undo what killed saves left in ``root``: remove ``.tmp_*``; rename a whole aside copy back when its
    ``step_<n>`` is missing or incomplete, else remove it."""
    steps, asides, debris = _scan(root)
    for d in debris:
        log.warning("removing %s, left by a killed save", d)
        if d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)
        else:
            d.unlink(missing_ok=True)
    doomed = []
    for step, copies in asides.items():
        final = root / f"step_{step:06d}"
        for aside in copies:
            if _problem(aside) is None and (step not in steps or _problem(steps[step]) is not None):
                if step in steps:
                    _discard(root, [steps.pop(step)])
                os.replace(aside, final)
                _fsync(root)
                steps[step] = final
                log.warning("restored %s from %s (a save over it was killed)", final, aside.name)
            else:
                doomed.append(aside)
    _discard(root, doomed)


def save_checkpoint(
    ckpt_root: str | os.PathLike,
    step: int,
    *,
    model,
    tokenizer=None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler=None,
    config_yaml: str | None = None,
    extra: dict | None = None,
    keep_last: int = 0,
    model_state_dict: dict | None = None,
    optimizer_state_dict: dict | None = None,
    payload: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint for ``step`` crash-safely (protocol in the module docstring) and prune old ones.

    A process killed at any point of this call leaves, for :func:`latest_checkpoint`, every complete checkpoint
    that existed before the call (``step_<n>`` itself possibly as its aside copy), plus the new one once its
    rename is done. One writer per ``ckpt_root``: the start of a save removes other saves' ``.tmp_*`` dirs.

    Args:
        ckpt_root: the ``checkpoints/`` directory (created if missing).
        step: number of completed optimizer steps; an existing ``step_<step>`` is replaced.
        keep_last: keep the newest k complete checkpoints (by step), plus the one just written; delete the other
            complete ones and any incomplete ``step_<n>`` older than all kept ones (0 keeps all). Incomplete dirs
            never count towards k, so the newest complete checkpoint is never deleted.
        model_state_dict / optimizer_state_dict: write these instead of ``model``'s and ``optimizer``'s own (an
            FSDP-sharded model: the full states of :func:`torchrl_grpo.distributed.data_parallel.full_state_dicts`, so the
            checkpoint is the single-process one).
        payload: more files of the trainer's own, file name -> object (saved with ``torch.save`` inside the checkpoint, under
            the same completeness marker; e.g. the SFT phase's data). Names must be plain file names that do not
            clash with the layout's.

    Returns:
        Path of the final checkpoint directory.

    Raises:
        OSError: the filesystem failed (the temp dir is removed; earlier checkpoints are untouched).
        ValueError: a ``payload`` name that is not a plain file name or clashes with the layout's.
    """
    root = Path(ckpt_root)
    root.mkdir(parents=True, exist_ok=True)
    _recover(root)
    final = root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP}step_{step:06d}_", dir=root))
    try:
        model.save_pretrained(tmp / "model", safe_serialization=True,
                              **({"state_dict": model_state_dict} if model_state_dict is not None else {}))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "tokenizer")
        if optimizer is not None:
            torch.save(optimizer_state_dict if optimizer_state_dict is not None else optimizer.state_dict(),
                       tmp / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save({"step": step, "rng": rng_state(), "extra": extra or {}, "peft": _is_peft(model)},
                   tmp / "trainer_state.pt")
        if config_yaml is not None:
            (tmp / "config.yaml").write_text(config_yaml)
        for name, obj in (payload or {}).items():
            if Path(name).name != name or name in _LAYOUT or name.startswith("."):
                raise ValueError(f"checkpoint payload name {name!r} must be a plain file name outside {_LAYOUT}")
            torch.save(obj, tmp / name)
        _seal(tmp, step)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    aside = None
    try:
        if os.path.lexists(final):
            aside = root / f".old_{final.name}_{uuid.uuid4().hex[:8]}"
            os.replace(final, aside)
        os.replace(tmp, final)
    except BaseException:
        if aside is not None and not os.path.lexists(final):
            os.replace(aside, final)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync(root)
    doomed = [aside] if aside is not None else []
    if keep_last > 0:
        steps, _, _ = _scan(root)
        complete = [s for s in sorted(steps) if _problem(steps[s]) is None]
        keep = set(complete[-keep_last:]) | {step}
        oldest_kept = min(keep)
        doomed += [steps[s] for s in sorted(steps)
                   if s not in keep and (s in complete or s < oldest_kept)]
    _discard(root, doomed)
    return final


def _warn_if_legacy(ckpt: Path) -> None:
    if not (ckpt / MARKER).is_file():
        log.warning("checkpoint %s was written without %s (before completeness markers); accepted because "
                    "trainer_state.pt and model/*.safetensors are present", ckpt, MARKER)


def latest_checkpoint(path: str | os.PathLike) -> Path:
    """Resolve ``path`` to a complete checkpoint dir.

    ``path`` is a checkpoint dir (returned as is when complete), or a ``checkpoints/`` dir or a run dir: then the
    complete ``step_<n>`` with the largest n. Skipped with a logged warning: incomplete or corrupted ``step_<n>``
    dirs (see "Completeness" in the module doc), ``.tmp_*`` dirs and aside copies; an aside copy
    ``.old_step_<n>_*`` is used (with a warning) only when ``step_<n>`` itself is missing or incomplete, the one
    window of a killed save in which it holds the only copy of step n.

    Raises:
        FileNotFoundError: no complete checkpoint there.
        ValueError: ``path`` is itself a checkpoint dir (has ``trainer_state.pt`` or the marker) but is incomplete
            or corrupted; the message says what is wrong.
    """
    p = Path(path)
    if (p / MARKER).is_file() or (p / "trainer_state.pt").is_file():
        reason = _problem(p)
        if reason is not None:
            raise ValueError(f"checkpoint {p} is incomplete or corrupted: {reason}; "
                             f"pass its parent directory to resume from the newest complete one")
        _warn_if_legacy(p)
        return p
    for root in (p, p / "checkpoints"):
        if not root.is_dir():
            continue
        steps, asides, debris = _scan(root)
        for d in debris:
            log.warning("ignoring %s: an unfinished save or deletion", d)
        for step in sorted(set(steps) | set(asides), reverse=True):
            for ckpt in ([steps[step]] if step in steps else []) + asides.get(step, []):
                reason = _problem(ckpt)
                if reason is not None:
                    log.warning("skipping checkpoint %s: %s", ckpt, reason)
                    continue
                if ckpt.name.startswith("."):
                    log.warning("using %s: step_%06d is missing or incomplete (a save over it was killed)",
                                ckpt, step)
                else:
                    _warn_if_legacy(ckpt)
                for other in asides.get(step, []):
                    if other != ckpt:
                        log.warning("ignoring %s: the previous version of %s", other, ckpt.name)
                return ckpt
    raise FileNotFoundError(f"no complete checkpoint (a step_*/ with {MARKER}, or trainer_state.pt and model "
                            f"weights) found at {p}")


def _load_weights_into(model, model_dir: Path) -> None:
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {model_dir}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if _is_peft(model):
        from peft import set_peft_model_state_dict

        res = set_peft_model_state_dict(model, state)
        unexpected = getattr(res, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"adapter checkpoint has unexpected keys, e.g. {unexpected[:3]}")
        return
    from torchrl_grpo.distributed.data_parallel import is_fsdp, load_full_model_state

    missing, unexpected = load_full_model_state(model, state) if is_fsdp(model) \
        else model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    if isinstance(getattr(model, "_tied_weights_keys", None), dict):
        tied = set(model._tied_weights_keys)
    bad_missing = [k for k in missing if k not in tied and not k.endswith("lm_head.weight")]
    if bad_missing or unexpected:
        raise ValueError(f"checkpoint does not match the model: missing {bad_missing[:3]}, unexpected {unexpected[:3]}")


def load_checkpoint(path: str | os.PathLike, *, model, optimizer=None, scheduler=None, restore_rng: bool = True) -> dict:
    """Load a checkpoint into live objects (built with the same config). An FSDP-sharded ``model``: every rank
    calls this; the full weights and optimizer state are sharded as they load (:mod:`torchrl_grpo.distributed.data_parallel`).

    Returns:
        The trainer state dict (``step``, ``extra``).

    Args:
        path: a checkpoint, ``checkpoints/`` or run dir, resolved by :func:`latest_checkpoint` (the newest
            complete checkpoint; incomplete or corrupted ones are skipped with a warning).

    Raises:
        FileNotFoundError: no complete checkpoint at ``path``.
        ValueError: ``path`` names an incomplete or corrupted checkpoint dir; the checkpoint was saved with/without
            LoRA but the model is not; or keys do not match.
    """
    ckpt = latest_checkpoint(path)
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    if bool(state.get("peft")) != _is_peft(model):
        raise ValueError(f"checkpoint {ckpt} was saved with peft={state.get('peft')} but actor.peft.enable is {_is_peft(model)}")
    _load_weights_into(model, ckpt / "model")
    if optimizer is not None and (ckpt / "optimizer.pt").is_file():
        from torchrl_grpo.distributed.data_parallel import is_fsdp, load_full_optimizer_state

        osd = torch.load(ckpt / "optimizer.pt", weights_only=False)
        if is_fsdp(model):  # the single-process layout (any world size wrote it), sharded as it loads
            load_full_optimizer_state(model, optimizer, osd)
        else:
            optimizer.load_state_dict(osd)
    if scheduler is not None and (ckpt / "scheduler.pt").is_file():
        scheduler.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=False))
    if restore_rng:
        set_rng_state(state["rng"])
    state["path"] = str(ckpt)
    return state


def save_final_model(out_dir: str | os.PathLike, *, model, tokenizer=None, model_state_dict: dict | None = None) -> Path:
    """Write the trained weights as one Hugging Face model directory (``checkpoint.final_model``: ``<run>/final_model``):
    safetensors in the dtype the model trained in (LoRA merged into the base weights, HF names), its config and the
    tokenizer; what ``actor.path=`` loads. No optimizer, schedule or RNG state: it is not a resumable checkpoint
    (those are ``checkpoints/step_<n>``). SmolLM2-135M in fp32: 538 MB, a third of a resumable checkpoint.

    Written into a temp dir beside ``out_dir`` and renamed, so ``out_dir`` is never half-written; an existing one is
    replaced. ``model_state_dict``: the full state of an FSDP-sharded model (the caller gathers it).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        OSError: the filesystem failed (the temp dir is removed; an existing ``out_dir`` is untouched).
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp_{out.name}_", dir=out.parent))
    try:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if model_state_dict is None:
            model_state_dict = {k: v.detach().cpu().contiguous() for k, v in export_hf_weights(model)}
        base.save_pretrained(tmp, state_dict=model_state_dict, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
