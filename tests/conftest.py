"""Shared fixtures: real GSM8K data location, a tiny random model, a temporary model cache; and a session-end
check that the tests left no new git-ignored files in the checkout (:func:`pytest_sessionfinish`)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.gsm8k_data import DATA_DIR

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
# hypothesis keeps its example cache in ./.hypothesis by default, even with database=None: keep the checkout clean
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                      os.path.join(os.environ.get("TMPDIR", "/tmp"), f"torchrl-grpo-hypothesis-{os.getuid()}"))


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    """``$GSM8K_DATA_DIR`` if it holds both splits, else the packaged copy (never skips)."""
    return DATA_DIR


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer():
    from torchrl_grpo.model_store import load_model_and_tokenizer

    return load_model_and_tokenizer("tiny-random")


@pytest.fixture(scope="session")
def tok(tiny_model_and_tokenizer):
    """The tiny random model's tokenizer (ChatML template with tools)."""
    return tiny_model_and_tokenizer[1]


@pytest.fixture(scope="session")
def tiny_llama():
    """Factory ``tiny_llama(max_position_embeddings=512)``: a seeded (``torch.manual_seed(0)``) random 2-layer Llama
    with grouped-query attention (vocab 300, hidden 64, 4 query / 2 KV heads), eval mode, SDPA attention. Built in
    memory, no files; for backend/loss tests that need a real HF architecture."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    def make(max_position_embeddings: int = 512):
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=max_position_embeddings)
        m = LlamaForCausalLM(cfg).eval()
        m.config._attn_implementation = "sdpa"
        return m

    return make


# ----------------------------------------------------------------------------- the checkout stays clean (issue 36)
REPO = Path(__file__).resolve().parents[1]
#: caches of Python and pytest themselves (bytecode, --lf data), not test outputs: never reported
_CACHE_NAMES = ("__pycache__", ".pytest_cache")


def checkout_ignored_paths(repo: Path = REPO) -> set[str] | None:
    """The git-ignored files of ``repo``, one path each (``git ls-files --others --ignored --exclude-standard``:
    ``"outputs/2026-11-26/16-22-00/sft.log"``, ...), caches (:data:`_CACHE_NAMES`) left out; None when ``repo`` is
    not a git checkout or git is not installed.

    Ignored files are the ones that pile up unseen (plain ``git status`` does not show them); new untracked source
    files are not counted: in a checkout shared with other people they appear during any session."""
    paths = _git_ls_files(repo, "--ignored")
    return None if paths is None else {x for x in paths if not any(part in _CACHE_NAMES for part in Path(x).parts)}


def _git_ls_files(repo: Path, *options: str) -> list[str] | None:
    """``git ls-files -z --others --exclude-standard <options>`` in ``repo``; None where git cannot say."""
    try:
        p = subprocess.run(["git", "ls-files", "-z", "--others", "--exclude-standard", *options], cwd=repo,
                           capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [x for x in p.stdout.split("\0") if x] if p.returncode == 0 else None


#: a new untracked top-level file with one of these suffixes is someone's work in the shared checkout, not an output
_SOURCE_SUFFIXES = (".py", ".md", ".toml")


def checkout_root_strays(repo: Path = REPO) -> set[str] | None:
    """The untracked, not ignored files directly in ``repo`` (``git ls-files --others --exclude-standard``, no ``/``),
    source files (:data:`_SOURCE_SUFFIXES`) left out: what code run with the checkout as its working directory leaves
    there (issue 42: a reasoning-gym codeio snippet wrote ``sailor_performance.csv`` in the root). None as for
    :func:`checkout_ignored_paths`."""
    paths = _git_ls_files(repo, "--directory")
    return None if paths is None else {x for x in paths if "/" not in x.rstrip("/") and not x.endswith(_SOURCE_SUFFIXES)}


def _checkout_outputs() -> set[str] | None:
    ignored, strays = checkout_ignored_paths(), checkout_root_strays()
    return None if ignored is None or strays is None else ignored | strays


def pytest_sessionstart(session) -> None:
    session.config._checkout_ignored_before = _checkout_outputs()


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail the session when the tests left new git-ignored files in the checkout (a run dir under ``outputs/``,
    ``multirun/``, ``wandb/``, ...): tests write only under their tmp dirs (issue 36)."""
    before = getattr(session.config, "_checkout_ignored_before", None)
    if before is None or hasattr(session.config, "workerinput"):
        return
    after = _checkout_outputs()
    new = sorted((after or set()) - before)
    if not new:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    msg = (f"the tests left {len(new)} new git-ignored or stray top-level path(s) in the checkout {REPO}: {', '.join(new[:20])} -- "
           "tests must write only under their tmp dirs (tmp_path; a subprocess of grpo.py / sft.py with "
           "cwd=tmp_path or hydra.run.dir=...); remove them and fix the test that wrote them")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(msg, red=True)
    else:
        print(msg)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
