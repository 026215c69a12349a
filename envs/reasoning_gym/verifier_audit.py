"""A static audit of reasoning-gym's verifiers: which tasks' ``score_answer`` can evaluate text as code.

Some of the library's verifiers hand the answer string to an evaluator: ``eval(answer)`` (string_insertion,
spiral_matrix, binary_matrix, n_queens), sympy's ``parse_expr`` (countdown, puzzle24, polynomial_multiplication,
simple_integration, intermediate_integration; ``parse_expr`` ends in ``eval``). An answer written by a model must
not get there unless it first matches a grammar that cannot name an attribute, a dunder, an import or a call
(:mod:`envs.reasoning_gym.answer_formats`). So that a library upgrade cannot silently add such a verifier, this
module reads the installed library's source instead of trusting a list kept by hand:

:func:`evaluating_calls` walks the AST of the task's ``score_answer`` and, recursively, of every function, method
and class of ``reasoning_gym`` it names (called or passed on: ``map(eval, xs)`` counts), and reports every name that
resolves to an evaluator (``self.method`` on the dataset class, a plugin's own package too): the builtins in :data:`EVALUATING_BUILTINS`, anything of the modules in
:data:`EVALUATING_MODULES` (all of sympy: most of its functions ``sympify`` a string argument), and any function
whose source cannot be read (the audit cannot clear what it cannot see). It over-approximates on purpose: it does
not follow data flow, so a verifier that evaluates only the generator's own problem text (bitwise_arithmetic's
``eval(entry["metadata"]["problem"])``, number_sorting's ``eval(entry["answer"])``) is reported too and gets a
grammar like the others. :func:`envs.reasoning_gym.data.resolve_spec` refuses, at ``gym.make``, a task reported
here that has no grammar; ``tests/test_reasoning_gym_safety.py`` checks every registered task.

The grammar stops payloads, not cost: an answer inside countdown's grammar, ``exp(100000000*log(3))``, is one C call
in sympy that held the GIL for 122 s (issue 42). So every task's ``score_answer`` (reported here or not: the
audit sees names, not cost; propositional_logic's own parser is quadratic) runs in a killable worker process with
CPU-time, memory and wall-clock bounds (:mod:`envs.grader_process`, called by
:func:`envs.reasoning_gym.grading.score`).

Generation is audited too (:func:`executing_generation`): the library runs code when it *draws* items, in whatever
process builds the task list and with that process's working directory, before any model text exists. A grep of
reasoning-gym 0.1.25 (``exec(``, ``eval(``, ``open(``, ``subprocess``, ``os.system``, ``.write(``) found:

* ``codeio``: ``CodeIODataset._generate_io_pair`` ``exec()``s a code snippet of its data file for every item
  (3,002 snippets, "transformed by an LLM", per its own docstring "there is still a risk that the LLM could have
  introduced code with bad effects"): at least 10 open files for writing in the working directory (snippet 1148
  writes ``sailor_performance.csv``: it appeared in our checkout's root during a test run, issue 42), one imports
  ``subprocess``, one caches under ``tempfile.gettempdir()``;
* ``basic_arithmetic``, ``bitwise_arithmetic``: ``eval`` of the expression the generator wrote; ``gsm_symbolic``:
  ``eval`` of fraction literals of its own (its generators are called through a table: the AST walk does not see
  them; nothing of the data reaches it);
* ``bf``: compiles and interprets its own Brainf*ck programs in memory (``BF-it.py``'s file writes are its command
  line's, not reached by generation); data files read with ``open`` / ``importlib.resources`` (word lists,
  puzzles) by many tasks: reads, not reported.

The walk is the verifier audit's, from the dataset's ``__init__`` and ``__getitem__``, with the evaluators of
:data:`GENERATION_BUILTINS` / :data:`GENERATION_MODULES` (code execution, processes, the file system; ``open`` only
when its mode is not a literal read mode; not sympy: generators compute with it on their own values).
:func:`envs.reasoning_gym.data.split_items` draws the items of a task reported here in a grader worker
(:mod:`envs.grader_process`) inside a fresh temporary working directory, removed after, under generation bounds.

Cost: ~0.3 s for all ~100 tasks on first use (then cached per task); the generation audit ~1.5 s for all.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import inspect
import textwrap
import types
from typing import Any

from reasoning_gym.factory import DATASETS

__all__ = ["EVALUATING_BUILTINS", "EVALUATING_MODULES", "GENERATION_BUILTINS", "GENERATION_MODULES",
           "evaluating_calls", "executing_generation"]

#: Builtins that run, compile or import code, or open files, given a string.
EVALUATING_BUILTINS = frozenset({"eval", "exec", "compile", "__import__", "open", "breakpoint"})
#: Modules any of whose callables counts as an evaluator (module name, or its prefix before a dot).
EVALUATING_MODULES = frozenset({"sympy", "mpmath", "os", "subprocess", "pickle", "marshal", "shelve", "importlib",
                                "runpy", "code", "codeop", "ctypes", "numexpr", "pandas", "dill", "yaml"})
#: Builtins that count on a generation path (``open`` only with a mode that is not a literal read mode).
GENERATION_BUILTINS = frozenset({"eval", "exec", "compile", "__import__", "breakpoint", "open"})
#: Modules any of whose callables counts on a generation path (``importlib.resources`` excepted: it reads the
#: library's own data files).
GENERATION_MODULES = frozenset({"os", "subprocess", "shutil", "tempfile", "socket", "multiprocessing", "ctypes",
                                "runpy", "code", "codeop", "importlib", "pickle", "marshal", "shelve", "dill"})
_GENERATION_EXEMPT = ("importlib.resources",)
_LIBRARY = "reasoning_gym"
#: Methods ``dataclasses`` generates (from the fields, compiled from a string: no source file to read).
_DATACLASS_METHODS = frozenset({"__init__", "__repr__", "__eq__", "__hash__", "__lt__", "__le__", "__gt__", "__ge__",
                                "__setattr__", "__delattr__", "__getstate__", "__setstate__", "__match_args__"})


def _generated(value: Any) -> bool:
    code = getattr(inspect.unwrap(value), "__code__", None) if callable(value) else None
    return code is not None and code.co_filename.startswith("<")


def _module_of(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    return getattr(obj, "__module__", None) or ""


@dataclasses.dataclass(frozen=True)
class _Evaluators:
    """What counts as an evaluator in one audit: builtin names, module names (or prefixes before a dot), module
    prefixes exempted, and whether ``open`` with a literal read mode is exempted."""

    builtins: frozenset
    modules: frozenset
    exempt: tuple[str, ...] = ()
    reads_exempt: bool = False


_SCORING = _Evaluators(EVALUATING_BUILTINS, EVALUATING_MODULES)
_GENERATION = _Evaluators(GENERATION_BUILTINS, GENERATION_MODULES, _GENERATION_EXEMPT, reads_exempt=True)


def _is_evaluator(obj: Any, kinds: _Evaluators = _SCORING) -> str | None:
    """The evaluator's name when ``obj`` is one, else ``None``."""
    for name in kinds.builtins:
        if obj is getattr(builtins, name):
            return name
    mod = _module_of(obj)
    if kinds.exempt and mod.startswith(kinds.exempt):
        return None
    if mod.split(".")[0] in kinds.modules and (callable(obj) or isinstance(obj, types.ModuleType)):
        return f"{mod}.{getattr(obj, '__name__', type(obj).__name__)}"
    return None


def _read_only_opens(tree: ast.AST) -> set[int]:
    """The ids of the ``func`` nodes of ``open(path)`` / ``open(path, "r"...)`` calls in ``tree``: a literal mode
    without ``w``, ``a``, ``x`` or ``+`` (or none)."""
    out = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open"):
            continue
        mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
        if mode is None or (isinstance(mode, ast.Constant) and isinstance(mode.value, str)
                            and not set(mode.value) & set("wax+")):
            out.add(id(node.func))
    return out


def _parse_source(obj: Any) -> ast.AST:
    """The AST of ``obj``'s source; a method whose multi-line string starts at column 0 (``textwrap.dedent`` then
    removes nothing) is parsed inside an ``if`` block."""
    src = inspect.getsource(obj)
    try:
        return ast.parse(textwrap.dedent(src))
    except IndentationError:
        return ast.parse("if 1:\n" + src)


def _resolve(node: ast.AST, scope: dict, cls: type | None) -> Any:
    """The object a ``Name`` / dotted ``Attribute`` denotes in ``scope`` (``self.x`` / ``cls.x`` on ``cls``);
    ``None`` when it is not statically known (a local, an attribute of a computed value)."""
    if isinstance(node, ast.Name):
        if node.id in scope:
            return scope[node.id]
        return getattr(builtins, node.id, None)
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") and cls is not None:
            return getattr(cls, node.attr, None)
        base = _resolve(node.value, scope, cls)
        if isinstance(base, (types.ModuleType, type)):
            return getattr(base, node.attr, None)
    return None


def _walk(obj: Any, cls: type | None, seen: set, found: set, roots: tuple[str, ...],
          kinds: _Evaluators = _SCORING) -> None:
    """Add to ``found`` every evaluator that ``obj`` (a function, method or class of the packages ``roots``) names,
    recursively."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, functools.partial):
        obj = obj.func
    if isinstance(obj, type):
        if not _module_of(obj).startswith(roots) or obj in seen:
            return
        seen.add(obj)
        for attr, value in vars(obj).items():  # every method it defines: its instances' calls are not resolvable
            if dataclasses.is_dataclass(obj) and attr in _DATACLASS_METHODS and _generated(value):
                continue  # written by dataclasses from the fields: no source, and nothing that evaluates text
            if isinstance(value, (types.FunctionType, staticmethod, classmethod, property)):
                for f in ((value.fget, value.fset) if isinstance(value, property) else (value,)):
                    if f is not None:
                        _walk(f, obj, seen, found, roots, kinds)
        return
    if isinstance(obj, types.MethodType):
        obj = obj.__func__
    obj = inspect.unwrap(obj)
    if not isinstance(obj, types.FunctionType) or obj.__code__ in seen:
        return
    seen.add(obj.__code__)
    try:
        tree = _parse_source(obj)
    except (OSError, TypeError, SyntaxError):
        found.add(f"<unreadable source of {obj.__module__}.{obj.__qualname__}>")
        return
    scope = dict(obj.__globals__)
    if obj.__closure__:
        scope.update({n: c.cell_contents for n, c in zip(obj.__code__.co_freevars, obj.__closure__)
                      if c.cell_contents is not None})
    reads = _read_only_opens(tree) if kinds.reads_exempt else set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(node.ctx, ast.Load) or id(node) in reads:
            continue
        target = _resolve(node, scope, cls)
        if target is None:
            continue
        evaluator = _is_evaluator(target, kinds)
        on_self = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self",
                                                                                                           "cls")
        if evaluator:
            found.add(evaluator)
        elif not isinstance(target, types.ModuleType) and (on_self or _module_of(target).startswith(roots)):
            _walk(target, cls if on_self else None, seen, found, roots, kinds)


@functools.lru_cache(maxsize=None)
def evaluating_calls(task: str) -> tuple[str, ...]:
    """The evaluators (sorted names, e.g. ``("eval",)`` or ``("sympy.parse_expr", ...)``) that the installed
    library's verifier of ``task`` names, directly or through the library's own functions; ``()`` when none.

    Raises:
        KeyError: ``task`` is not in the library's registry.
    """
    dataset_cls = DATASETS[task][0]
    found: set[str] = set()
    roots = (_LIBRARY, _module_of(dataset_cls).split(".")[0])  # the library, and a plugin's own package
    _walk(inspect.getattr_static(dataset_cls, "score_answer"), dataset_cls, set(), found, roots)
    return tuple(sorted(found))


@functools.lru_cache(maxsize=None)
def executing_generation(task: str) -> tuple[str, ...]:
    """What the installed library's generator of ``task`` can run when it draws items (the dataset's ``__init__`` and
    ``__getitem__``, through the library's own functions): sorted names of :data:`GENERATION_BUILTINS` /
    :data:`GENERATION_MODULES` callables (``("exec", ...)`` for codeio), ``"<unreadable source of ...>"`` for a
    function the audit cannot read; ``()`` when none. A task with a non-empty answer has its items drawn in a
    contained worker (:func:`envs.reasoning_gym.data.split_items`).

    Raises:
        KeyError: ``task`` is not in the library's registry.
    """
    dataset_cls = DATASETS[task][0]
    found: set[str] = set()
    seen: set = set()
    roots = (_LIBRARY, _module_of(dataset_cls).split(".")[0])
    for method in ("__init__", "__getitem__"):
        _walk(inspect.getattr_static(dataset_cls, method), dataset_cls, seen, found, roots, _GENERATION)
    return tuple(sorted(found))
