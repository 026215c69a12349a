"""envs/serve.py and envs/serving/ keep their shape (issues 37 and 44): ``envs/serve.py`` only wires (``build_app``,
the CLI); each protocol's routes live in a module of their own under ``envs/serving/``, over one session registry and
one set of bounds that only ``build_app`` builds; no function longer than :data:`MAX_FUNCTION_LINES`, no module
longer than :data:`MAX_MODULE_LINES`, and ``build_app`` only wires named steps (its body, docstring excluded, at most
:data:`MAX_BUILD_APP_BODY` lines). Reads the source with :mod:`ast`; imports nothing of the server (runs without the
[serve] extra)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVE = ROOT / "envs" / "serve.py"
SERVING = ROOT / "envs" / "serving"
#: Longest function (``def`` line to last line, docstring included) allowed in envs/serve.py and envs/serving/.
MAX_FUNCTION_LINES = 100
#: Longest body of ``build_app`` (first statement after its docstring to its last line).
MAX_BUILD_APP_BODY = 40
#: Longest module (lines) in envs/serve.py and envs/serving/ (a longer one holds two concepts: DESIGN.md).
MAX_MODULE_LINES = 800
#: Which module registers which routes (decorators ``@app.get/post/delete/websocket(path)`` and ``Route(path, ...)``).
ROUTES = {
    "session_routes": {"/sessions", "/sessions/{session_id}/reset", "/sessions/{session_id}/step",
                       "/sessions/{session_id}/state", "/sessions/{session_id}"},
    "stateless_routes": {"/reset", "/step", "/state"},
    "ws_routes": {"/ws"},
    "info_routes": {"/health", "/schema", "/metadata"},
    "mcp_routes": {"MCP_PATH"},
    "openenv_mcp_routes": {"/mcp", "/openapi.json"},
}


def _modules() -> dict[str, Path]:
    return {"serve": SERVE, **{p.stem: p for p in sorted(SERVING.glob("*.py"))}}


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


def _routes(path: Path) -> set[str]:
    """The paths ``path`` registers: ``@app.<verb>(path)`` decorators and ``Route(path, ...)`` calls (a name as
    written, e.g. ``MCP_PATH``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        f = node.func
        is_route = (isinstance(f, ast.Attribute) and f.attr in ("get", "post", "delete", "put", "websocket")
                    and isinstance(f.value, ast.Name) and f.value.id == "app") or (isinstance(f, ast.Name) and f.id == "Route")
        if is_route:
            arg = node.args[0]
            out.add(arg.value if isinstance(arg, ast.Constant) else ast.unparse(arg))
    return out


def test_no_function_over_the_limit():
    long = {}
    for name, path in _modules().items():
        long.update({f"{name}.{fn}": _lines(node) for fn, node in _functions(path).items()
                     if _lines(node) > MAX_FUNCTION_LINES})
    assert "build_app" in _functions(SERVE) and "GymTextEnvironment.step" in _functions(SERVING / "environment.py")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps): {long}"


def test_no_module_over_the_limit():
    sizes = {name: len(p.read_text(encoding="utf-8").splitlines()) for name, p in _modules().items()}
    assert not {n: s for n, s in sizes.items() if s > MAX_MODULE_LINES}, sizes


def test_build_app_only_wires_named_steps():
    fn = _functions(SERVE)["build_app"]
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else fn.body
    n = body[-1].end_lineno - body[0].lineno + 1
    assert n <= MAX_BUILD_APP_BODY, f"build_app's body is {n} lines, over {MAX_BUILD_APP_BODY}: move the new part into a named step"
    nested = [s.name for s in ast.walk(fn) if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s is not fn]
    assert not nested, f"build_app defines {nested}: register routes / hooks in a named _add_* function instead"


def test_each_protocol_in_its_own_module():
    found = {name: _routes(path) for name, path in _modules().items()}
    assert not found["serve"], f"envs/serve.py registers routes itself: {found['serve']}"
    for name, routes in ROUTES.items():
        assert found.get(name) == routes, (name, found.get(name))
    others = {n: r for n, r in found.items() if r and n not in ROUTES}
    assert not others, f"routes registered outside the protocol modules: {others}"


def test_one_session_registry_and_one_set_of_bounds_built_by_build_app_only():
    """``_SessionServer`` (OpenEnv's ``HTTPEnvServer``: the cap and threads), ``_Sessions`` (the registry) and
    ``_Guard`` (the transport bounds) are built in ``build_app`` and nowhere else, so a route gets the server's
    registry and sits behind its guard; every ``DEFAULT_*`` bound is defined once, in ``envs/serving/limits.py``."""
    built = {}
    for name, path in _modules().items():
        for fn_name, fn in _functions(path).items():
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                        node.func.id in ("HTTPEnvServer", "_SessionServer", "_Sessions", "_Guard"):
                    built.setdefault(node.func.id, []).append(f"{name}.{fn_name}")
    assert built == {k: ["serve.build_app"] for k in ("_SessionServer", "_Sessions", "_Guard")}, built
    defined = {}
    for name, path in _modules().items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                    node.targets[0].id.startswith("DEFAULT_"):
                defined.setdefault(node.targets[0].id, []).append(name)
    assert defined and all(v == ["limits"] for v in defined.values()), defined
