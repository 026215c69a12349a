"""Answer grammars of the reasoning-gym tasks whose verifier evaluates text (:mod:`.verifier_audit`): an answer
reaches such a verifier only when it matches its task's grammar, and no grammar can name an attribute, a dunder,
an import or a call other than an allow-listed math function.

Why: ``score_answer`` runs ``eval(answer)`` in string_insertion, spiral_matrix, binary_matrix and n_queens and
sympy's ``parse_expr`` (which ends in ``eval``) in countdown, puzzle24, polynomial_multiplication,
simple_integration and intermediate_integration; an answer ``__import__("os").system(...)`` ran as the trainer's
(or the env server's) user (issue 34).

The grammars (:data:`GRAMMARS`, by task), each checked in time linear in the answer (at most
:func:`envs.reasoning_gym.grading.window_chars` characters; Python's own parser for the AST ones, after the
bounds of :func:`envs.reasoning_gym.grading.answer_guard` on digits and nesting):

* ``plain`` text in the gold answer's own format, which ``eval`` cannot run (a ``SyntaxError``, a number or a bare
  word): integers separated by white space (spiral_matrix, binary_matrix), ``_`` / ``Q`` separated by white space
  (n_queens), one word of ASCII letters (string_insertion);
* a Python ``literal``: strings, numbers, signed numbers, lists and tuples of them (what string_insertion, spiral_matrix,
  binary_matrix, n_queens and number_sorting's scorers accept besides the plain form); checked on the AST, which
  holds nothing but ``Constant`` / ``List`` / ``Tuple`` / unary ``-`` ``+`` nodes;
* an ``integer`` literal as ``int(s, 0)`` reads it (bitwise_arithmetic: ``-0x1f``, ``42``, ``0b101``);
* a ``math expression`` (the sympy tasks), checked on the AST (:func:`math_expression`): ASCII only; numbers
  (``int`` / ``float`` constants); names that are one ASCII letter or a variable the item names
  (``metadata["variable"]`` / ``["variables"]``); ``+ - * /`` and unary ``-`` ``+``; ``**`` whose exponent is a
  constant expression (numbers, ``+ - * /``) of absolute value at most :data:`MAX_SYMPY_EXPONENT` or the gold
  answer's largest; calls of :data:`MATH_FUNCTIONS` with one positional argument; at most
  ``max(MAX_SYMPY_NODES, 4 * the gold answer's)`` AST nodes. Nothing else: no attribute, subscript, keyword,
  string, comparison, lambda, comprehension, ``^``, ``%``, ``//``, ``@``, bit operation.

number_sorting and bitwise_arithmetic evaluate only the generator's own text (the audit cannot see data flow); their
grammars are the formats their scorers can give credit to, so no reward changes. An answer outside its task's
grammar scores 0 with ``info["action_error"]`` (:func:`check_format`); text in the grammar that is wrong still gets
the library's own score (0, or countdown / puzzle24's 0.01 / 0.05).
"""
from __future__ import annotations

import ast
from typing import Any, Callable

__all__ = ["GRAMMARS", "MATH_FUNCTIONS", "MAX_SYMPY_EXPONENT", "MAX_SYMPY_NODES", "check_format", "is_literal",
           "is_integer_literal", "math_expression"]

#: Functions a math-expression answer may call (one positional argument each): those sympy writes in the gold
#: answers of the integration tasks, and their relatives.
MATH_FUNCTIONS = frozenset({"sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "acot", "sinh", "cosh",
                            "tanh", "asinh", "acosh", "atanh", "exp", "log", "sqrt", "Abs"})
#: Largest ``|exponent|`` of a ``**`` in a math-expression answer, or the gold answer's largest if larger. Small:
#: sympy expands powers of sums (``(x + y + z + 1)**k`` has ``C(k + 3, 3)`` terms), and no gold answer seen writes
#: an exponent above 10.
MAX_SYMPY_EXPONENT = 16
#: Most AST nodes of a math-expression answer, or 4 times the gold answer's if more.
MAX_SYMPY_NODES = 400

_SIGNS = frozenset("+-")


def _parse(answer: str) -> ast.Expression | None:
    """Python's parse of ``answer`` as one expression; ``None`` when it is not one (the caller bounds its size)."""
    try:
        return ast.parse(answer.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _literal_node(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return type(node.value) in (str, int, float)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float)
    if isinstance(node, (ast.List, ast.Tuple)):
        return all(_literal_node(e) for e in node.elts)
    return False


def is_literal(answer: str) -> bool:
    """Whether ``answer`` is a Python literal of strings / numbers / lists / tuples (nothing ``eval`` could run)."""
    tree = _parse(answer)
    return tree is not None and _literal_node(tree.body)


def is_integer_literal(answer: str) -> bool:
    """Whether ``answer`` is an integer literal ``int(answer, 0)`` may read: optional white space and sign, then
    ``0x`` / ``0o`` / ``0b`` digits or decimal digits, single ``_`` between digits."""
    s = answer.strip()
    if s[:1] in _SIGNS:
        s = s[1:]
    digits = "0123456789"
    if len(s) > 2 and s[0] == "0" and s[1] in "xXoObB":
        digits = {"x": "0123456789abcdefABCDEF", "o": "01234567", "b": "01"}[s[1].lower()]
        s = s[2:].removeprefix("_")
    if not s or s[0] == "_" or s[-1] == "_" or "__" in s:
        return False
    return all(ch in digits or ch == "_" for ch in s)


def _plain_integers(answer: str) -> bool:
    toks = answer.split()
    return bool(toks) and all(t.removeprefix("-").isascii() and t.removeprefix("-").isdigit() for t in toks)


def _plain_board(answer: str) -> bool:
    toks = answer.split()
    return bool(toks) and all(t in ("_", "Q") for t in toks)


def _plain_word(answer: str) -> bool:
    s = answer.strip()
    return s.isascii() and s.isalpha()


def _const_value(node: ast.AST) -> float | None:
    """The value of a constant exponent (numbers, unary ``-`` ``+``, ``+ - * /``); ``None`` if it is not one."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if type(node.value) is int and node.value.bit_length() > 64:
            return float("inf")  # float() of a longer int overflows
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _const_value(node.operand)
        return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        a, b = _const_value(node.left), _const_value(node.right)
        if a is None or b is None:
            return None
        if isinstance(node.op, ast.Div):
            return None if b == 0 else a / b
        return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
    return None


def _max_exponent(tree: ast.AST) -> float:
    return max((abs(v) for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow)
                for v in [_const_value(n.right)] if v is not None), default=0.0)


def math_expression(answer: str, entry: dict) -> str | None:
    """Why ``answer`` is not a math expression of the grammar in the module docstring, or ``None`` when it is.
    ``entry`` is the item (its gold ``answer`` and ``metadata`` variables widen the bounds and the names)."""
    if not answer.isascii():
        return "the answer holds non-ASCII characters; a math expression is ASCII"
    tree = _parse(answer)
    if tree is None:
        return "the answer is not a math expression (Python syntax: numbers, variables, + - * / **, f(x))"
    gold = _parse(str(entry.get("answer", "")))
    meta = entry.get("metadata") or {}
    names = {str(meta["variable"])} if isinstance(meta.get("variable"), str) else set()
    if isinstance(meta.get("variables"), (list, tuple)):
        names |= {str(v) for v in meta["variables"]}
    max_nodes = max(MAX_SYMPY_NODES, 4 * sum(1 for _ in ast.walk(gold))) if gold else MAX_SYMPY_NODES
    max_exp = max(MAX_SYMPY_EXPONENT, _max_exponent(gold) if gold else 0.0)
    count = 0
    called: set[int] = set()  # ids of the Name nodes that are called (ast.walk meets a call before its function)
    for node in ast.walk(tree):
        count += 1
        if count > max_nodes:
            return f"the expression has more than {max_nodes} parts; scored 0 without evaluating it"
        if isinstance(node, (ast.Expression, ast.Load, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.USub,
                             ast.UAdd)):
            continue
        if isinstance(node, ast.Constant):
            if type(node.value) not in (int, float):
                return f"the expression holds a {type(node.value).__name__} constant; only numbers are allowed"
        elif isinstance(node, ast.BinOp):
            if not isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)):
                return f"the expression uses the operator {type(node.op).__name__}; only + - * / ** are allowed"
            if isinstance(node.op, ast.Pow):
                v = _const_value(node.right)
                if v is None:
                    return "an exponent is not a constant number; scored 0 without evaluating it"
                if abs(v) > max_exp:
                    return f"an exponent is above {max_exp:g}; scored 0 without evaluating it"
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd)):
                return f"the expression uses the operator {type(node.op).__name__}; only + - * / ** are allowed"
        elif isinstance(node, ast.Name):
            if id(node) in called:
                continue
            if not (len(node.id) == 1 or node.id in names):
                return (f"the expression names {node.id[:40]!r}: only one-letter variables, the item's variables "
                        f"{sorted(names)} and calls of {sorted(MATH_FUNCTIONS)} are allowed")
        elif isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in MATH_FUNCTIONS and len(node.args) == 1
                    and not node.keywords and not isinstance(node.args[0], ast.Starred)):
                return f"the expression calls something other than one of {sorted(MATH_FUNCTIONS)} with one argument"
            called.add(id(node.func))
        else:
            return f"the expression holds a {type(node).__name__}; only numbers, variables, + - * / ** and f(x) are allowed"
    return None


def _format(name: str, *tests: Callable[[str], bool]) -> Callable[[str, dict], str | None]:
    def check(answer: str, entry: dict) -> str | None:
        if any(t(answer) for t in tests):
            return None
        return f"the answer is not in the format of {name}; scored 0 without evaluating it"
    check.__doc__ = f"The grammar of {name}."
    return check


#: ``{task: check(answer, entry) -> why it is refused | None}`` for every task whose verifier the audit reports.
GRAMMARS: dict[str, Callable[[str, dict], str | None]] = {
    "string_insertion": _format("a word of letters or a Python list of strings", _plain_word, is_literal),
    "spiral_matrix": _format("integers separated by spaces or a Python list", _plain_integers, is_literal),
    "binary_matrix": _format("rows of integers separated by spaces or a Python list of lists", _plain_integers,
                             is_literal),
    "n_queens": _format("a board of '_' and 'Q' separated by spaces or a Python list", _plain_board, is_literal),
    "number_sorting": _format("a list of numbers", is_literal),
    "bitwise_arithmetic": _format("an integer (hexadecimal 0x..., binary 0b..., octal 0o... or decimal)",
                                  is_integer_literal),
    "countdown": math_expression,
    "puzzle24": math_expression,
    "polynomial_multiplication": math_expression,
    "simple_integration": math_expression,
    "intermediate_integration": math_expression,
}


def check_format(task: str, answer: str, entry: dict[str, Any]) -> str | None:
    """Why ``answer`` may not reach ``task``'s verifier (its grammar, :data:`GRAMMARS`), or ``None`` when it may (or
    the task has no grammar: its verifier evaluates nothing)."""
    grammar = GRAMMARS.get(task)
    return None if grammar is None else grammar(answer, entry)
