"""Crash safety of checkpoints: a process killed with SIGKILL at any point leaves a checkpoint that loads, and a run
that resumes to its last step.

Two kinds of kills, both real ``SIGKILL`` (no ``finally``, no ``atexit``, nothing flushed by Python):

* every filesystem step of one save: a helper process (``python -m tests.test_checkpoint_crash crash-saves DIR``)
  builds the tiny model once, then for k = 1, 2, ... forks a child that overwrites an existing ``step_000001``
  (with ``keep_last=1``, so it also prunes ``step_000000``) and kills itself right before its k-th filesystem call
  (``os.mkdir/rename/replace/unlink/remove/rmdir/fsync``, ``torch.save``), until a child finishes its save;
* a training run (``python -m tests.test_checkpoint_crash train ...``) that pauses inside a chosen save and is
  killed there by the test; then a resumed run is killed again, and a last resumed run finishes.

SIGKILL keeps the page cache, so these tests cover crash orders, not power loss; the fsync protocol is checked
separately (``test_save_fsyncs_every_file_and_directory_before_publishing``).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch

from torchrl_grpo.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from torchrl_grpo.assembly import build_trainer

REPO = Path(__file__).resolve().parents[1]
HOOKED_OS_CALLS = ("mkdir", "rename", "replace", "unlink", "remove", "rmdir", "fsync")

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork and SIGKILL (POSIX)")


# ---------------------------------------------------------------------------------------------- helpers (child side)
def _install_fs_hook(on_op) -> None:
    """Call ``on_op(name)`` right before every filesystem-mutating call of this process."""
    for name in HOOKED_OS_CALLS:
        real = getattr(os, name)

        def wrapped(*args, _real=real, _name=name, **kwargs):
            on_op(_name)
            return _real(*args, **kwargs)

        setattr(os, name, wrapped)
    real_save = torch.save

    def save(*args, **kwargs):
        on_op("torch.save")
        return real_save(*args, **kwargs)

    torch.save = save


def _one_adam_step(model, optimizer) -> None:
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    optimizer.step()
    optimizer.zero_grad()


def _crash_saves_main(work: Path) -> None:
    """Fork one child per crash point k; each SIGKILLs itself before its k-th filesystem call of an overwriting save."""
    from torchrl_grpo.model_store import load_model_and_tokenizer

    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _one_adam_step(model, optimizer)
    base = work / "base"
    kw = {"model": model, "tokenizer": tokenizer, "optimizer": optimizer, "config_yaml": "a: 1\n"}
    save_checkpoint(base, 0, extra={"version": "old"}, **kw)
    save_checkpoint(base, 1, extra={"version": "old"}, **kw)
    _one_adam_step(model, optimizer)  # the new version of step 1 has other weights and optimizer state
    results = []
    for k in range(1, 400):
        root = work / f"k{k:03d}"
        shutil.copytree(base, root)
        op_file = work / f"k{k:03d}.op"
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # child
            calls = [0]

            def on_op(name, k=k, op_file=op_file, calls=calls):
                calls[0] += 1
                if calls[0] == k:
                    with open(op_file, "w") as f:
                        f.write(name)
                    os.kill(os.getpid(), signal.SIGKILL)

            try:
                _install_fs_hook(on_op)
                save_checkpoint(root, 1, extra={"version": "new"}, keep_last=1, **kw)
            except BaseException:  # noqa: BLE001  (the child reports any error through its exit code)
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            results.append({"k": k, "root": str(root), "killed": os.WTERMSIG(status) == signal.SIGKILL,
                            "op": op_file.read_text() if op_file.exists() else "?"})
            continue
        results.append({"k": k, "root": str(root), "killed": False, "exit": os.WEXITSTATUS(status)})
        break
    (work / "results.json").write_text(json.dumps(results))


def _train_main(run_dir: Path, steps: int, resume_from: str, pause_at: str, paused_file: Path) -> None:
    """Train ToyVowels on tiny-random; pause forever (for the test to SIGKILL us) at ``pause_at``.

    ``pause_at`` = ``"S:OP:N"``: inside the S-th save of this run, right before its N-th ``OP`` filesystem call.
    """
    import torchrl_grpo.training.grpo_trainer as trainer_mod
    from tests.test_trainer import make_cfg

    torch.set_num_threads(1)
    save_no, op, nth = pause_at.split(":")
    target = (int(save_no), op, int(nth))
    state = {"save": 0, "active": False, "counts": {}}

    def on_op(name):
        if not state["active"]:
            return
        state["counts"][name] = state["counts"].get(name, 0) + 1
        if (state["save"], name, state["counts"][name]) == target:
            with open(paused_file, "w") as f:
                f.write(f"{name} in save {state['save']}")
            time.sleep(600)

    real_save = trainer_mod.save_checkpoint

    def save_checkpoint_paused(*args, **kwargs):
        state["save"] += 1
        state["counts"] = {}
        state["active"] = True
        try:
            return real_save(*args, **kwargs)
        finally:
            state["active"] = False

    trainer_mod.save_checkpoint = save_checkpoint_paused
    _install_fs_hook(on_op)
    cfg = _train_cfg(make_cfg, steps, resume_from or None)
    trainer = build_trainer(cfg, run_dir, trainer_cls=trainer_mod.GRPOTrainer)
    trainer.fit()
    trainer.close()


def _train_cfg(make_cfg, steps: int, resume_from: str | None):
    cfg = make_cfg(train={"steps": steps, "batch_size": 1}, gconfig={"n_samples": 2, "max_new_tokens": 4},
                   checkpoint={"every": 1, "keep_last": 2, "save_final": True})
    cfg.train.resume_from = resume_from
    return cfg


# ---------------------------------------------------------------------------------------------- test side
def _child_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.fixture(scope="module")
def fresh():
    """A tiny-random model + tokenizer + optimizer of our own (we load checkpoints into it)."""
    from torchrl_grpo.model_store import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer("tiny-random")
    return model, tokenizer, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _hidden(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


@pytest.mark.slow  # 16.6 s of the unit stage at load ~4 (issue 45): a SIGKILL at every point of a save
def test_sigkill_at_every_point_of_an_overwriting_save_keeps_that_step_loadable(tmp_path, fresh):
    """Killing a save of step 1 over an existing step 1 must leave step 1 loadable, old or new version, never mixed."""
    p = subprocess.run([sys.executable, "-m", "tests.test_checkpoint_crash", "crash-saves", str(tmp_path)], cwd=REPO,
                       env=_child_env(), capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results[-1]["killed"] is False and results[-1]["exit"] == 0, (results[-1], p.stderr[-3000:])
    killed = results[:-1]
    assert len(killed) >= 10 and all(r["killed"] for r in killed)
    assert {"replace", "unlink", "torch.save"} <= {r["op"] for r in killed}  # renames, deletions and writes were hit

    model, _, optimizer = fresh
    refs = {}
    for version, root in (("old", tmp_path / "base"), ("new", Path(results[-1]["root"]))):
        state = load_checkpoint(root, model=model, restore_rng=False)
        assert state["extra"]["version"] == version
        refs[version] = {k: v.clone() for k, v in model.state_dict().items()}
    assert not torch.equal(refs["old"]["model.embed_tokens.weight"], refs["new"]["model.embed_tokens.weight"])

    failures = []
    for r in killed:
        root = Path(r["root"])
        where = f"k={r['k']} killed before {r['op']}: {sorted(q.name for q in root.iterdir())}"
        try:
            state = load_checkpoint(root, model=model, optimizer=optimizer, restore_rng=False)
        except Exception as e:  # noqa: BLE001  (collected and reported below)
            failures.append(f"{where}: load failed: {type(e).__name__}: {e}")
            continue
        ckpt = Path(state["path"])
        version = state["extra"].get("version")
        if state["step"] != 1 or not (ckpt.name == "step_000001" or ckpt.name.startswith(".old_step_000001_")):
            failures.append(f"{where}: step 1 lost, latest is {ckpt.name} (step {state['step']})")
        elif version not in refs or any(not torch.equal(v, refs[version][k]) for k, v in model.state_dict().items()):
            failures.append(f"{where}: weights do not match the {version!r} version of step 1")
        elif not (ckpt / "optimizer.pt").is_file() or not (ckpt / "tokenizer").is_dir():
            failures.append(f"{where}: {ckpt.name} lacks optimizer.pt or tokenizer/")
    assert not failures, f"{len(failures)} of {len(killed)} crash points broke step 1:\n" + "\n".join(failures)

    # the next save (as after a restart) clears the debris of the killed one and keeps step 1
    for r in killed:
        root = Path(r["root"])
        save_checkpoint(root, 2, model=model, optimizer=optimizer)
        names = sorted(q.name for q in root.iterdir())
        assert _hidden(root) == [] and {"step_000001", "step_000002"} <= set(names), (r, names)
        assert latest_checkpoint(root).name == "step_000002"


def _run_until_paused(tmp_path: Path, name: str, run_dir: Path, steps: int, resume_from: str, pause_at: str) -> str:
    """Start a training child, wait until it pauses at ``pause_at``, SIGKILL it; returns where it paused."""
    paused = tmp_path / f"paused_{name}"
    log = tmp_path / f"{name}.log"
    with open(log, "w") as logf:
        p = subprocess.Popen([sys.executable, "-m", "tests.test_checkpoint_crash", "train", str(run_dir), str(steps),
                              resume_from, pause_at, str(paused)], cwd=REPO, env=_child_env(), stdout=logf,
                             stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 240
        while not paused.exists():
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                p.wait()
                pytest.fail(f"run {name} did not pause at {pause_at} (rc {p.returncode}):\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert p.returncode == -signal.SIGKILL
    return paused.read_text()


def _assert_loads(ckpts: Path, fresh, step: int) -> None:
    model, _, optimizer = fresh
    state = load_checkpoint(ckpts, model=model, optimizer=optimizer, restore_rng=False)
    assert state["step"] == step and Path(state["path"]).name == f"step_{step:06d}", state["path"]


def test_training_killed_mid_save_and_mid_prune_resumes_to_the_last_step(tmp_path, fresh):
    from tests.test_trainer import make_cfg

    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    # A: 4 steps, killed in the save of step 2 after the weights and tokenizer were written (before optimizer.pt)
    where = _run_until_paused(tmp_path, "A", run, 4, "", "2:torch.save:1")
    assert where == "torch.save in save 2"
    assert any(n.startswith(".tmp_") for n in _hidden(ckpts))  # the killed save left its temp dir
    _assert_loads(ckpts, fresh, 1)
    # B: resumed from A, killed in the save of step 3 while pruning step 1 (keep_last=2)
    where = _run_until_paused(tmp_path, "B", run, 4, str(ckpts), "2:unlink:3")
    assert where == "unlink in save 2"
    _assert_loads(ckpts, fresh, 3)
    # C: resumed from B, runs to the end
    trainer = build_trainer(_train_cfg(make_cfg, 4, str(ckpts)), run)
    try:
        assert trainer.step == 3
        summary = trainer.fit()
    finally:
        trainer.close()
    assert trainer.step == 4 and summary["checkpoint"].endswith("step_000004")
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000003", "step_000004"]  # no debris, keep_last=2
    _assert_loads(ckpts, fresh, 4)
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 4 and {2, 3, 4} <= set(steps)


# ---------------------------------------------------------------------------------------------- in-process checks
def _save(root: Path, step: int, fresh, **kw) -> Path:
    model, tokenizer, optimizer = fresh
    return save_checkpoint(root, step, model=model, tokenizer=tokenizer, optimizer=optimizer, **kw)


def test_latest_skips_unfinished_and_corrupted_checkpoints_with_a_warning(tmp_path, fresh, caplog):
    for step in (1, 2):
        _save(tmp_path, step, fresh)
    (tmp_path / "step_000003").mkdir()  # e.g. a dir some copy tool was writing: no marker, no weights
    (tmp_path / "step_000003" / "config.yaml").write_text("a: 1\n")
    stray = tmp_path / ".tmp_step_000004_x"  # a killed save's temp dir, with everything in it
    shutil.copytree(tmp_path / "step_000002", stray)
    weights = tmp_path / "step_000002" / "model" / "model.safetensors"
    with open(weights, "r+b") as f:  # truncated weights: step 2 is corrupted
        f.truncate(weights.stat().st_size - 1)
    with caplog.at_level(logging.WARNING, logger="torchrl_grpo.training.checkpoint"):
        assert latest_checkpoint(tmp_path).name == "step_000001"
        assert latest_checkpoint(tmp_path.parent / tmp_path.name).name == "step_000001"
    text = caplog.text
    assert "step_000003" in text and "step_000002" in text and "model.safetensors" in text
    with pytest.raises(ValueError, match="step_000002"):  # naming a corrupted checkpoint explicitly is an error
        load_checkpoint(tmp_path / "step_000002", model=fresh[0], restore_rng=False)


def test_checkpoint_without_marker_is_accepted_as_legacy(tmp_path, fresh, caplog):
    _save(tmp_path, 1, fresh)
    _save(tmp_path, 2, fresh)
    markers = [p for p in (tmp_path / "step_000002").iterdir() if p.name.upper().startswith("COMPLETE")]
    assert len(markers) == 1
    markers[0].unlink()  # as written by the code before completeness markers
    with caplog.at_level(logging.WARNING, logger="torchrl_grpo.training.checkpoint"):
        state = load_checkpoint(tmp_path, model=fresh[0], optimizer=fresh[2], restore_rng=False)
    assert state["step"] == 2 and "without" in caplog.text
    (tmp_path / "step_000002" / "trainer_state.pt").unlink()  # legacy and incomplete: skipped
    assert latest_checkpoint(tmp_path).name == "step_000001"


def test_keep_last_counts_only_complete_checkpoints_and_keeps_the_newest(tmp_path, fresh):
    _save(tmp_path, 1, fresh)
    _save(tmp_path, 2, fresh)
    (tmp_path / "step_000005").mkdir()  # incomplete and newer: neither counted nor the reason to drop step 3
    final = _save(tmp_path, 3, fresh, keep_last=1)
    assert final.name == "step_000003" and final.is_dir()
    assert not (tmp_path / "step_000001").exists() and not (tmp_path / "step_000002").exists()
    assert latest_checkpoint(tmp_path) == final


def test_save_fsyncs_every_file_and_directory_before_publishing(tmp_path, fresh, monkeypatch):
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to name fsynced descriptors")
    events: list[tuple] = []
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def move(real, kind):
        def f(src, dst, *a, **kw):
            events.append((kind, os.fspath(src), os.fspath(dst)))
            return real(src, dst, *a, **kw)
        return f

    root = tmp_path / "ck"
    _save(root, 1, fresh)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", move(real_replace, "replace"))
    monkeypatch.setattr(os, "rename", move(real_rename, "rename"))
    final = _save(root, 1, fresh)  # over the existing step 1
    monkeypatch.undo()
    publish = [i for i, e in enumerate(events) if e[0] != "fsync" and Path(e[2]) == final]
    assert len(publish) == 1, events
    tmp = events[publish[0]][1]
    synced_before = [e[1] for e in events[:publish[0]] if e[0] == "fsync"]
    files = {str(p.relative_to(final)) for p in final.rglob("*")}
    in_tmp = {os.path.relpath(s, tmp) for s in synced_before if s.startswith(tmp + os.sep)}
    assert files <= in_tmp, files - in_tmp  # every file and subdirectory, before the rename into place
    assert tmp in synced_before  # and the temp dir itself
    marker = [f for f in files if f.upper().startswith("COMPLETE")]
    assert len(marker) == 1
    order = [os.path.relpath(s, tmp) for s in synced_before if s.startswith(tmp + os.sep)]
    assert order.index(marker[0]) > max(order.index(f) for f in files - set(marker))  # the marker is synced last
    assert str(root) in [e[1] for e in events[publish[0] + 1:] if e[0] == "fsync"]  # the rename made durable
    assert _hidden(root) == []  # the aside copy of the old step 1 is gone


if __name__ == "__main__":
    if sys.argv[1] == "crash-saves":
        _crash_saves_main(Path(sys.argv[2]))
    elif sys.argv[1] == "train":
        _train_main(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], Path(sys.argv[6]))
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]}")
