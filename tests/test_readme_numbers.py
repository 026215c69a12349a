"""README.md and benchmarks/README.md quote measurements only from files that exist and hold them (issue 25 D).

* every ``benchmarks/results/...`` path they mention (``results/...`` in benchmarks/README.md) exists: brace lists
  (``x.{json,md}``) are expanded, ``<placeholders>`` match anything, and a path without a suffix (an output stem of
  a ``--write`` command) must match at least one file that starts with it;
* in a paragraph (or list item) that links ``.md`` results files, every decimal number (``0.193``) that is not a
  setting (``key=value``) or arithmetic shown with its formula (``1/0.6 ≈ 1.67``) is in one of the files that
  paragraph links: verbatim (trailing zeros aside: ``0.30`` for ``0.300``), or, marked ``~``, rounded to the places
  quoted (``~0.19`` for ``0.193``). A guard, not a proof: a number can match an unrelated one in a long file, and
  whole numbers (``974 s``) are not checked.
"""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = {"README.md": ROOT, "benchmarks/README.md": ROOT / "benchmarks",
           # the pages README.md's measured paragraphs moved to (issue 45); paths written from the repository root
           **{f"docs/{name}.md": ROOT for name in ("benchmarks", "training", "environments", "tau2", "integrations",
                                                   "cluster")}}
# a results path: benchmarks/results/... anywhere, or results/... in benchmarks/README.md (relative to benchmarks/)
_PATH = re.compile(r"(?<![\w/])((?:benchmarks/)?results/[\w./{},<>*-]*[\w}>*/])")


def _expand(path: str) -> list[str]:
    """``a.{json,md}`` -> ``[a.json, a.md]`` (every brace list, cartesian product)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    fixed, choices = parts[0::2], [c.split(",") for c in parts[1::2]]
    return ["".join(x for pair in itertools.zip_longest(fixed, combo, fillvalue="") for x in pair)
            for combo in itertools.product(*choices)]


def _mentions(readme: str) -> list[str]:
    base = READMES[readme]
    out = []
    for m in _PATH.finditer((ROOT / readme).read_text()):
        raw = m[1]
        if raw.startswith("results/") and readme != "benchmarks/README.md":
            continue
        for p in _expand(raw):
            out.append(str((base / p).relative_to(ROOT)) if not p.startswith("benchmarks/") else p)
    return sorted(set(out))


def _exists(path: str) -> bool:
    pattern = re.sub(r"<[^>]*>", "*", path)
    if "*" in pattern:
        return any(ROOT.glob(pattern))
    p = ROOT / pattern
    if p.exists():
        return True
    return not p.suffix and any(p.parent.glob(p.name + "*"))  # an output stem (`--write benchmarks/results/x`)


@pytest.mark.parametrize("readme", sorted(READMES))
def test_every_results_path_mentioned_exists(readme):
    mentioned = _mentions(readme)
    if readme.startswith("docs/") and not mentioned:
        return  # a docs page need not quote results; README.md and benchmarks/README.md do
    assert mentioned, f"{readme} mentions no results file"
    missing = [p for p in mentioned if not _exists(p)]
    assert not missing, f"{readme} mentions results that do not exist: {missing}"


def test_path_expansion_and_stems():
    assert _expand("results/x.{json,md}") == ["results/x.json", "results/x.md"]
    assert _exists("benchmarks/results/quick_guard.md") and not _exists("benchmarks/results/no_such_file.md")
    assert _exists("benchmarks/results/tau2_sft_table")  # a --write stem: tau2_sft_table_airline.md matches
    assert not _exists("benchmarks/results/no_such_stem")


_NUMBER = re.compile(r"(?<![\w.=/-])(\d+\.\d+)(?![\w.]*[/=])(?!\.\d)")  # not an address (0.0.0.0)


def _paragraphs(readme: str, text: str):
    """(paragraph text, results files it links) for each paragraph/list item of ``text`` outside code blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for para in re.split(r"\n\s*\n|\n(?=- )", text):
        files = [p for m in _PATH.finditer(para) for p in _expand(m[1])]
        if readme == "benchmarks/README.md":
            files = [f if f.startswith("benchmarks/") else f"benchmarks/{f}" for f in files]
        files = [ROOT / f for f in files if f.startswith("benchmarks/results/") and f.endswith(".md")]
        yield para, [f for f in files if f.exists()]


def _unsupported_numbers(readme: str, text: str) -> list[tuple[str, list[str], str]]:
    bad = []
    for para, files in _paragraphs(readme, text):
        if not files:
            continue
        held = set(re.findall(r"\d+\.\d+", "\n".join(f.read_text() for f in files)))
        for m in _NUMBER.finditer(para):
            num = m[1]
            if para[:m.start()].rstrip().endswith("≈"):  # arithmetic shown with its formula (1/0.6 ≈ 1.67)
                continue
            places = len(num.split(".")[1])
            approx = para[:m.start()].endswith("~")
            if not any(v == num or (v.startswith(num) and not v[len(num):].strip("0"))  # 0.30 for 0.300
                       or (approx and f"{float(v):.{places}f}" == num) for v in held):  # ~0.19 for 0.193
                bad.append((num, [f.name for f in files], para[:80]))
    return bad


@pytest.mark.parametrize("readme", sorted(READMES))
def test_decimal_numbers_next_to_a_results_link_are_in_that_file(readme):
    bad = _unsupported_numbers(readme, (ROOT / readme).read_text())
    assert not bad, f"{readme}: numbers not found in the results files their paragraph links: {bad}"


def test_a_number_its_linked_file_does_not_hold_is_reported():
    """The one-seed 0.12 -> 0.24 (gsm8k_qwen_run.md) quoted beside gsm8k_vs_trl.md, which does not hold it."""
    text = ("Accuracy went 0.12 -> 0.24 (`benchmarks/results/gsm8k_vs_trl.md`).\n\n"
            "Accuracy went ~0.19 -> 0.213, ratio 1/0.6 ≈ 1.67 (`benchmarks/results/gsm8k_seeds.md`).\n")
    assert [n for n, *_ in _unsupported_numbers("README.md", text)] == ["0.12", "0.24"]
