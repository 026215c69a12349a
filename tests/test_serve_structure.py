"""envs/serve.py stays split into named steps (issue 37): no function longer than :data:`MAX_FUNCTION_LINES`, and
``build_app`` only wires the named steps together (its body, docstring excluded, at most :data:`MAX_BUILD_APP_BODY`
lines). Reads the source with :mod:`ast`; imports nothing of the server (runs without the [serve] extra)."""
from __future__ import annotations

import ast
from pathlib import Path

SERVE = Path(__file__).resolve().parent.parent / "envs" / "serve.py"
#: Longest function (``def`` line to last line, docstring included) allowed in envs/serve.py.
MAX_FUNCTION_LINES = 100
#: Longest body of ``build_app`` (first statement after its docstring to its last line).
MAX_BUILD_APP_BODY = 40


def _functions(path: Path) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function and method in ``path`` by qualified name (``Class.method``, ``outer.<locals>.inner``)."""
    out: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[prefix + child.name] = child
                visit(child, f"{prefix}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return out


def _lines(fn: ast.AST) -> int:
    return fn.end_lineno - fn.lineno + 1


def test_no_function_in_serve_over_the_limit():
    fns = _functions(SERVE)
    assert "build_app" in fns and "GymTextEnvironment.step" in fns
    long = {name: _lines(fn) for name, fn in fns.items() if _lines(fn) > MAX_FUNCTION_LINES}
    assert not long, f"functions in {SERVE.name} over {MAX_FUNCTION_LINES} lines (split them into named steps): {long}"


def test_build_app_only_wires_named_steps():
    fn = _functions(SERVE)["build_app"]
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else fn.body
    n = body[-1].end_lineno - body[0].lineno + 1
    assert n <= MAX_BUILD_APP_BODY, f"build_app's body is {n} lines, over {MAX_BUILD_APP_BODY}: move the new part into a named step"
    nested = [s.name for s in ast.walk(fn) if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s is not fn]
    assert not nested, f"build_app defines {nested}: register routes / hooks in a named _add_* function instead"
