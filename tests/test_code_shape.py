"""Function size (issue 37): no function or method in ``envs/`` or ``torchrl_grpo/`` is longer than
:data:`MAX_LINES` lines, read from the AST (``def`` line to last line, docstring and nested functions included).

:data:`TOO_LONG_FOR_NOW` lists the functions still over it, each with who splits it. The list only shrinks: a listed
function that got short (or is gone) fails the test until its entry is removed, so the list never hides a new one.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "torchrl_grpo")
MAX_LINES = 100
#: "path::qualified.name" -> who removes the entry (by splitting the function into named steps). Empty since
#: issue 37 split the last ones (serve.build_app, device_plan.resolve_plan, VLLMBackend.__init__,
#: log_probs.token_log_probs): add an entry only with an owner and a reason, never to pass a review.
TOO_LONG_FOR_NOW: dict[str, str] = {}


def function_lengths(source: str) -> dict[str, int]:
    """``qualified name -> lines`` of every function and method in ``source`` (nested ones as ``outer.inner``,
    methods as ``Class.method``)."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[prefix + child.name] = child.end_lineno - child.lineno + 1
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def tree_lengths() -> dict[str, int]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name, n in function_lengths(path.read_text(encoding="utf-8")).items():
                out[f"{rel}::{name}"] = n
    return out


def test_no_function_is_longer_than_the_limit():
    long = {k: n for k, n in tree_lengths().items() if n > MAX_LINES and k not in TOO_LONG_FOR_NOW}
    assert long == {}, (f"functions over {MAX_LINES} lines (split them into named steps): "
                        + ", ".join(f"{k} ({n})" for k, n in sorted(long.items())))


def test_the_allow_list_only_shrinks():
    lengths = tree_lengths()
    short = {k: lengths.get(k) for k in TOO_LONG_FOR_NOW if lengths.get(k, 0) <= MAX_LINES}
    assert short == {}, f"remove these from TOO_LONG_FOR_NOW (now short or gone; lines): {short}"


def test_lengths_count_methods_nested_and_async_functions():
    src = "class A:\n    def m(self):\n        def inner():\n            return 1\n\n        return inner\n\n\n" \
          "async def f():\n    x = 1\n    return x\n"
    assert function_lengths(src) == {"A.m": 5, "A.m.inner": 2, "f": 3}
