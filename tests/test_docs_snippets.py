"""Every python block of README.md and of the docs/ pages it owns runs as pasted, or says why not (issue 45).

A block is marked by the HTML comment on the line above it (invisible on GitHub):

* ``<!-- snippet: run -->``: fast; the page's ``run`` blocks run in order in one namespace, in the test process, in
  the unit stage;
* ``<!-- snippet: slow -->``: a block that runs alone in its own subprocess, in the slow stage (TRL training, vector
  envs of subprocesses);
* ``<!-- snippet: slow, server ENV_ID -->``: the same, against ``python -m envs.serve ENV_ID`` started for it; the
  block's ``http://127.0.0.1:8000`` (what a reader types after starting the server on port 8000) is replaced by the
  started server's address;
* ``<!-- snippet: no: REASON -->``: not run here, and the reason is shown to the reader (needs a GPU, an endpoint,
  another venv; or a fragment with ``...``).

Each runs in a temporary directory (whatever it writes, e.g. TRL's ``output_dir``, stays out of the checkout). The
pages other engineers own test their own snippets (docs/mcp.md: tests/test_serve_mcp.py; docs/verifiers.md: the
verifiers stages).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.served import serve_process

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/training.md", "docs/environments.md", "docs/tau2.md", "docs/integrations.md",
         "docs/cluster.md", "docs/benchmarks.md", "docs/layout.md"]
_MARK = re.compile(r"<!-- snippet: (?P<kind>run|slow|no)(?:, server (?P<server>\S+))?(?:: (?P<why>.+?))? -->")
TYPED_URL = "http://127.0.0.1:8000"


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    kind: str | None  # run | slow | no | None (unmarked)
    server: str | None
    why: str | None
    code: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """The fenced python blocks of ``page`` with the marker on the line above each (None when unmarked)."""
    lines = (ROOT / page).read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            prev = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
            m = _MARK.fullmatch(prev.strip())
            i += 1
            body = []
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            out.append(Block(page, start + 1, m["kind"] if m else None, m["server"] if m else None,
                             m["why"] if m else None, "\n".join(body) + "\n"))
        i += 1
    return out


ALL = [b for page in PAGES for b in blocks(page)]
SLOW = [b for b in ALL if b.kind == "slow"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled",
            "TRL_EXPERIMENTAL_SILENCE": "1"}


def test_every_python_block_is_marked_and_a_block_not_run_says_why():
    assert {b.page for b in ALL} >= {"README.md", "docs/environments.md", "docs/integrations.md"}
    unmarked = [b.name for b in ALL if b.kind is None]
    assert not unmarked, f"python blocks without a <!-- snippet: run|slow|no: why --> line above: {unmarked}"
    silent = [b.name for b in ALL if b.kind == "no" and not (b.why or "").strip()]
    assert not silent, f"blocks not run must say why: {silent}"
    assert not [b.name for b in ALL if b.server and b.kind != "slow"], "a server block runs in the slow stage"
    assert all(TYPED_URL in b.code for b in ALL if b.server), "a server block names the typed address"


def test_the_marker_parser_reads_each_kind():
    m = _MARK.fullmatch("<!-- snippet: slow, server tau2/mock-v0 -->")
    assert (m["kind"], m["server"], m["why"]) == ("slow", "tau2/mock-v0", None)
    m = _MARK.fullmatch("<!-- snippet: no: needs a GPU -->")
    assert (m["kind"], m["server"], m["why"]) == ("no", None, "needs a GPU")


@pytest.mark.parametrize("page", sorted({b.page for b in ALL if b.kind == "run"}))
def test_runnable_blocks_run_as_pasted(page, tmp_path, monkeypatch, capsys):
    """The page's ``run`` blocks, in order, in one fresh namespace, in this process (torch is imported already: a
    subprocess per page cost ~10 s of imports each), from a temporary directory."""
    monkeypatch.chdir(tmp_path)
    for key, value in _env().items():
        if key != "PYTHONPATH":
            monkeypatch.setenv(key, value)
    code = "\n".join(b.code for b in ALL if b.page == page and b.kind == "run")
    exec(compile(code, page, "exec"), {"__name__": "__main__"})  # noqa: S102 - the page's own code, as a reader runs it
    if page == "README.md":  # what its comments promise
        out = capsys.readouterr().out.splitlines()
        assert out[:2] == ["1.0", "[1.0, 0.0]"], out


@pytest.mark.slow
@pytest.mark.parametrize("block", SLOW, ids=[b.name for b in SLOW])
def test_slow_block_runs_as_pasted(block, tmp_path):
    code = block.code
    if block.server:
        with serve_process(block.server) as url:
            code = code.replace(TYPED_URL, url.rstrip("/"))
            p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True,
                               text=True, timeout=1200)
    else:
        p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                           timeout=1200)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]


_LINK = re.compile(r"\]\(((?!https?://|#)[^)#\s]+)(#[^)\s]*)?\)")


def test_relative_links_of_the_pages_resolve():
    """Every relative link of README.md and its docs/ pages names a file of the checkout (the front page's links
    to the pages that hold what it no longer does)."""
    broken = []
    for page in PAGES:
        base = (ROOT / page).parent
        for m in _LINK.finditer((ROOT / page).read_text()):
            if not (base / m[1]).exists():
                broken.append(f"{page}: {m[1]}")
    assert not broken, broken
