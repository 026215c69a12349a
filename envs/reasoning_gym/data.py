"""Reasoning Gym task specs and the train / test problem lists of :class:`envs.reasoning_gym.env.ReasoningGymEnv`.

A *spec* names the library's procedural generators (``reasoning_gym.create_dataset``) to draw problems from, each
with its config (the library's config dataclass fields, e.g. chain_sum's ``min_terms``) and weight. A split is the
first ``size`` items of the spec's dataset built with the split's generator ``seed`` (the library derives item
``i`` from ``random.Random(seed + i)``, so a split is deterministic for a given seed).

Train and test are disjoint by construction: the question space is partitioned by a hash of the question text
(:func:`is_test_question`: one SHA-256 bucket of :data:`TEST_BUCKETS` is the test side); train keeps the train-side
items of its generator seed, test the test-side items of another seed (each an i.i.d. sample of the generator
restricted to its side; questions may repeat within a split, never across). Different seeds alone would not
do: the library draws item ``i`` from ``Random(seed + i)``, so seeds 11 and 22 give the same stream shifted by 11;
and dropping from test whatever train drew (our first version) skews the test split toward the questions train
missed (with chain_sum 1-2 digits: 177/200 two-digit test problems against 501/1000 in train). The hash partition
keeps both splits on the generator's own difficulty mix. A task whose problem space is so small that one side is
empty raises ``ValueError``; with few distinct questions (1-digit products: 100, ~25 on the test side) a split
repeats them: ``info["distinct_questions"]`` is not reported, count them with ``{p["question"] for p in env._problems}``.

A task whose verifier can evaluate the answer as code (:func:`envs.reasoning_gym.verifier_audit.evaluating_calls`,
read from the installed library's source) and has no answer grammar (:data:`envs.reasoning_gym.answer_formats.GRAMMARS`)
is refused here with ``ValueError``.

Drawing items runs the library's generators, and some run code: codeio ``exec()``s a snippet of its data file per
item (LLM-transformed code, some of it writing files into the working directory: ``sailor_performance.csv``
appeared in our checkout's root, issue 42), basic_arithmetic / bitwise_arithmetic ``eval`` their own expressions
(:func:`envs.reasoning_gym.verifier_audit.executing_generation`, read from the installed library's source). The
items of a spec holding such a task are drawn in a grader worker (:mod:`envs.grader_process`: killable, an
address-space bound, a private working directory) inside a fresh temporary directory removed after the draw,
under :func:`generation_cpu_s` of CPU time and :data:`GENERATION_WALL_S` of wall clock; a draw that fails there
raises ``RuntimeError`` naming the task(s) at construction. The other tasks are drawn in the caller's process
(gymnasium's ``AsyncVectorEnv`` workers included: each has a grader pool of its own). Containment, not a sandbox: a
snippet can still write to an absolute path. Cost (codeio, 200 items, one process, load ~10 on 2 cores): 1.25 s contained vs 0.61 s in process
(median of 3); basic_arithmetic, 1,000 items: 0.17 vs 0.13 s; once per (spec, split, seed, size):
:mod:`envs.task_list_cache` keeps the list.

Where we diverge from the library: for a weighted mix we build the library's own ``"composite"`` dataset
(``DatasetSpec``s), and a difficulty ``level`` is applied with the library's curriculum
(``create_curriculum(name).set_global_level(level).generate_configuration()``, its default INCLUSIVE range mode);
the library itself raises ``TypeError`` on an unknown config key and ``Dataset 'x' not registered`` on a bad name,
without listing the valid ones: we raise ``ValueError`` naming them.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from typing import Any

import reasoning_gym
import sympy
from reasoning_gym.composite import DatasetSpec
from reasoning_gym.factory import CURRICULA, DATASETS, create_curriculum

from envs.grader_process import default_pool
from envs.task_list_cache import cached_task_list

from .answer_formats import GRAMMARS
from .verifier_audit import evaluating_calls, executing_generation

__all__ = ["TaskSpec", "resolve_spec", "split_items", "dataset_for", "valid_tasks", "evaluated_gold", "DEFAULT_TRAIN_SEED",
           "DEFAULT_TEST_SEED", "DEFAULT_TRAIN_SIZE", "DEFAULT_TEST_SIZE", "MAX_TEST_DRAWS_FACTOR", "SPLITS",
           "TEST_BUCKETS", "is_test_question", "contained_tasks", "generation_cpu_s", "GENERATION_BASE_CPU_S",
           "GENERATION_CPU_S_PER_ITEM", "GENERATION_WALL_S"]

SPLITS = ("train", "test")
#: Generator seeds of the two splits (different seeds: the first guard of disjointness).
DEFAULT_TRAIN_SEED = 11
DEFAULT_TEST_SEED = 22
DEFAULT_TRAIN_SIZE = 1000
DEFAULT_TEST_SIZE = 200
#: The question space is cut by a hash into ``TEST_BUCKETS`` parts; one is the test side (:func:`is_test_question`):
#: a 75/25 split of the question space. With 8 buckets the small 1-digit sub-space of chain_sum (200 questions) had
#: only 11 on the test side by chance, so the test split held 30% 1-digit sums against 53% in train; with 4, 48%.
TEST_BUCKETS = 4
#: A split draws at most ``MAX_TEST_DRAWS_FACTOR * TEST_BUCKETS * size`` generator items before giving up.
MAX_TEST_DRAWS_FACTOR = 20
#: Config fields the env sets itself (from the split's seed and size); a ``task_config`` may not set them.
_MANAGED_FIELDS = ("seed", "size")
#: CPU seconds a contained draw (:func:`generation_cpu_s`) may use: this much, plus
#: :data:`GENERATION_CPU_S_PER_ITEM` per item of the split (codeio: ~4 ms per item, 4.0 s for 1,000 here).
GENERATION_BASE_CPU_S = 30.0
GENERATION_CPU_S_PER_ITEM = 0.1
#: Wall-clock seconds of a contained draw before its worker is killed (retried once: envs.grader_process).
GENERATION_WALL_S = 300.0


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Resolved tasks: ``((name, weight, config_json), ...)`` in the caller's order (hashable, for the caches).

    ``config_json`` is the task's whole config (the library's defaults filled in; non-JSON values such as enums as
    ``str``): what ``info["task_config"]`` shows. ``kwargs`` (same order) are the values given to the library's
    ``create_dataset``: only the keys set by ``level`` / ``task_config``, as given, so the library fills its own
    defaults with their own types.
    """

    tasks: tuple[tuple[str, float, str], ...]
    kwargs: tuple[dict, ...] = dataclasses.field(default=(), compare=False, hash=False)

    def configs(self) -> dict[str, dict]:
        """``{task name: resolved config dict}`` (without ``seed`` / ``size``)."""
        return {name: json.loads(cfg) for name, _, cfg in self.tasks}


def valid_tasks() -> list[str]:
    """The library's registered generator names (its registry, minus the ``composite`` wrapper)."""
    return sorted(n for n in DATASETS if n != "composite")


def _config_fields(name: str) -> list[str]:
    return [f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in _MANAGED_FIELDS]


def _resolve_one(name: Any, config: Any, level: Any) -> tuple[dict, str]:
    """One task's ``(create_dataset kwargs, whole config as JSON)``: the curriculum's ``level`` if set, then
    ``config``, over the library's defaults."""
    if not isinstance(name, str) or name not in DATASETS or name == "composite":
        raise ValueError(f"unknown reasoning_gym task {name!r}; valid tasks (the library's registry): "
                         f"{valid_tasks()}")
    evaluators = evaluating_calls(name)
    if evaluators and name not in GRAMMARS:
        raise ValueError(f"reasoning_gym task {name!r} is refused: its verifier (score_answer, reasoning-gym "
                         f"{reasoning_gym.__version__}) can evaluate the answer text as code ({', '.join(evaluators)}) "
                         f"and envs.reasoning_gym.answer_formats has no grammar for its answers; a model's text "
                         f"must not reach an evaluator (issue 34)")
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ValueError(f"task_config for {name!r} must be a dict, got {type(config).__name__}")
    fields = _config_fields(name)
    bad = sorted(str(k) for k in config if k not in fields)
    if bad:
        managed = [k for k in bad if k in _MANAGED_FIELDS]
        hint = f" ({managed} are set by the env from train_seed/test_seed/train_size/test_size)" if managed else ""
        raise ValueError(f"unknown config key(s) {bad} for task {name!r}{hint}; valid keys: {fields}")
    resolved: dict = {}
    if level is not None:
        if isinstance(level, bool) or not isinstance(level, int):
            raise ValueError(f"level must be an int or None, got {level!r}")
        if name not in CURRICULA:
            raise ValueError(f"task {name!r} has no curriculum in reasoning_gym, so it takes no level; tasks with one: "
                             f"{sorted(CURRICULA)}")
        curriculum = create_curriculum(name)
        try:
            curriculum.set_global_level(level)  # a level above an attribute's last is clamped by the library
        except ValueError as e:
            raise ValueError(f"level {level} for task {name!r}: {e}") from None
        cfg = curriculum.generate_configuration()
        levelled = {a.lower_field_name for a in curriculum.attributes.values() if hasattr(a, "lower_field_name")}
        levelled |= {a.upper_field_name for a in curriculum.attributes.values() if hasattr(a, "upper_field_name")}
        levelled |= {a.field_name for a in curriculum.attributes.values() if hasattr(a, "field_name")}
        clash = sorted(set(config) & levelled)
        if clash:
            raise ValueError(f"task_config sets {clash} for task {name!r}, which level={level} also sets (the "
                             f"curriculum's fields: {sorted(levelled)}); use one or the other")
        resolved = {k: getattr(cfg, k) for k in levelled}
    resolved.update(config)
    try:  # the library's own validation (its config dataclass + validate()), on a throwaway instance
        probe = DATASETS[name][1](**resolved, **({"seed": 0, "size": 1}))
        if hasattr(probe, "validate"):
            probe.validate()
    except (AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"invalid config for task {name!r} {resolved}: {e or type(e).__name__}") from None
    return resolved, json.dumps({f: _jsonable(getattr(probe, f)) for f in _config_fields(name)}, sort_keys=True)


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, (list, dict, str, int, float, bool)) or v is None:
        return v
    return str(v)


def resolve_spec(task: str | None, tasks: dict | None, task_config: dict | None, level: int | None) -> TaskSpec:
    """Validate the env's task arguments into a :class:`TaskSpec`.

    Args:
        task: one generator name (``"chain_sum"``); ``None`` with ``tasks``.
        tasks: ``{name: weight}`` for a weighted mix (weights > 0); ``None`` with ``task``.
        task_config: for ``task``, the config dict; for ``tasks``, ``{name: config dict}`` (names among ``tasks``).
        level: the library curriculum's global level (0 = easiest) for every task, or ``None``.

    Raises:
        ValueError: both or neither of ``task`` / ``tasks``, an unknown task name or config key (naming the valid
            ones), a bad weight or level, a config the library rejects, a task whose verifier evaluates text and
            that has no answer grammar.
    """
    if (task is None) == (tasks is None):
        raise ValueError("give exactly one of task='chain_sum' or tasks={'chain_sum': 1.0, ...}")
    if task is not None:
        kwargs, view = _resolve_one(task, task_config, level)
        return TaskSpec(((task, 1.0, view),), (kwargs,))
    if not isinstance(tasks, dict) or not tasks:
        raise ValueError(f"tasks must be a non-empty dict {{name: weight}}, got {tasks!r:.80}")
    configs = {} if task_config is None else task_config
    if not isinstance(configs, dict):
        raise ValueError(f"with tasks=..., task_config must be {{task name: config dict}}, got {configs!r:.80}")
    stray = sorted(str(k) for k in configs if k not in tasks)
    if stray:
        raise ValueError(f"task_config names {stray}, which are not in tasks {sorted(tasks)}")
    out, kwargs = [], []
    for name, weight in tasks.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ValueError(f"tasks[{name!r}] weight must be a number > 0, got {weight!r}")
        kw, view = _resolve_one(name, configs.get(name), level)
        out.append((name, float(weight), view))
        kwargs.append(kw)
    return TaskSpec(tuple(out), tuple(kwargs))


@functools.lru_cache(maxsize=64)
def dataset_for(spec: TaskSpec, seed: int, size: int):
    """The library dataset of ``spec`` with generator ``seed`` and ``size`` items (cached: also the scorer)."""
    if len(spec.tasks) == 1:
        return reasoning_gym.create_dataset(spec.tasks[0][0], seed=seed, size=size, **spec.kwargs[0])
    specs = [DatasetSpec(name=n, weight=w, config=dict(kw)) for (n, w, _), kw in zip(spec.tasks, spec.kwargs)]
    return reasoning_gym.create_dataset("composite", seed=seed, size=size, datasets=specs)


def is_test_question(question: str) -> bool:
    """Whether ``question`` belongs to the test side of the question space: the first 8 bytes of its SHA-256, as a
    big-endian integer, modulo :data:`TEST_BUCKETS` is 0 (about one question in ``TEST_BUCKETS``)."""
    digest = hashlib.sha256(question.encode("utf-8", "replace")).digest()
    return int.from_bytes(digest[:8], "big") % TEST_BUCKETS == 0


def evaluated_gold(item: dict) -> dict:
    """``item`` with its gold ``answer`` evaluated when the library left an unevaluated ``Integral(...)`` in it.

    intermediate_integration's generator writes ``str(sympy.integrate(integrand, x)) + " + C"``, and that
    ``integrate`` sometimes gives up on the expression it built (15 of the 200 default test items here, e.g.
    ``Integral(x**3*cos(x), x) + C``) while the same integrand parsed afresh integrates. Such a gold is no
    demonstration, and the answer grammar (:mod:`.answer_formats`) refuses ``Integral`` -- as it must: an answer
    ``Integral(<integrand>, x) + C`` would pass the verifier's derivative check for every problem. So the gold
    becomes an antiderivative of ``metadata["integrand"]`` (the generator's own text, never the model's:
    ``sympy.integrate``, then its ``manual=True`` rules) written as the library writes it; an item that still has
    no closed form (none seen), or whose gold holds no ``Integral``, is returned as it is (the same object).
    """
    answer, meta = item.get("answer"), item.get("metadata") or {}
    var, integrand = meta.get("variable"), meta.get("integrand")
    if not (isinstance(answer, str) and "Integral(" in answer and isinstance(var, str) and isinstance(integrand, str)):
        return item
    x = sympy.Symbol(var)
    f = sympy.parse_expr(integrand, local_dict={var: x})
    for manual in (False, True):
        antiderivative = sympy.integrate(f, x, manual=manual)
        if not antiderivative.has(sympy.Integral):
            return dict(item, answer=f"{antiderivative} + C")
    return item


def split_items(spec: TaskSpec, split: str, *, train_seed: int, test_seed: int, train_size: int,
                test_size: int) -> list[dict]:
    """The problems of ``split``: ``[{"question", "answer", "metadata", "source_index", "seed"}]``, index order (a
    new list; the dicts are built once per (spec, split, seed, size) and shared through
    :mod:`envs.task_list_cache`: read-only).

    The question space is partitioned by a hash of the question text (:func:`is_test_question`): train takes the
    generator items of ``train_seed`` whose question is on the train side, test the items of ``test_seed`` on the
    test side, each as the generator draws them (a question may repeat within a split, as in the generator's own
    stream). So no question is in both splits whatever the seeds, and each split is an i.i.d. sample of the
    generator's distribution restricted to its side of the partition: the same difficulty mix (deduplicating would
    not be: a small sub-space such as 1-digit sums, ~200 questions, would shrink to its ~50 test-side questions while
    it is half of the generator's draws). ``source_index`` is the item's index in its generator (not contiguous).

    Raises:
        ValueError: a bad split / seed / size, equal seeds, or a split that cannot be filled within
            :data:`MAX_TEST_DRAWS_FACTOR` ``* TEST_BUCKETS * size`` generator draws (one side of the partition
            (almost) empty: a task with very few distinct questions).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    for key, v in (("train_seed", train_seed), ("test_seed", test_seed), ("train_size", train_size),
                   ("test_size", test_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key.endswith("seed") else 1):
            raise ValueError(f"{key} must be an int >= {0 if key.endswith('seed') else 1}, got {v!r}")
    if train_seed == test_seed:
        raise ValueError(f"train_seed and test_seed must differ (both {train_seed}): the splits would coincide")
    seed, size = (train_seed, train_size) if split == "train" else (test_seed, test_size)
    # built once per (spec, split, seed, size) and shared read-only (envs.task_list_cache, bounded LRU; issue 42)
    return list(cached_task_list(("reasoning_gym", spec, split, seed, size),
                                 lambda: _draw_split(spec, split, seed, size)))


def contained_tasks(spec: TaskSpec) -> tuple[str, ...]:
    """The tasks of ``spec`` whose generator runs code (:func:`envs.reasoning_gym.verifier_audit.executing_generation`
    non-empty): their items are drawn in a contained worker."""
    return tuple(name for name, _, _ in spec.tasks if executing_generation(name))


def generation_cpu_s(size: int) -> float:
    """CPU seconds a contained draw of ``size`` items may use: :data:`GENERATION_BASE_CPU_S` +
    :data:`GENERATION_CPU_S_PER_ITEM` ``* size`` (130 s for 1,000 items: ~30x codeio's cost here)."""
    return GENERATION_BASE_CPU_S + GENERATION_CPU_S_PER_ITEM * size


def _draw_split(spec: TaskSpec, split: str, seed: int, size: int) -> list[dict]:
    """:func:`split_items`' problems of ``split`` (uncached): drawn here, or in a contained worker for a spec with a
    task whose generator runs code (:func:`contained_tasks`; module docstring).

    Raises:
        ValueError: the split cannot be filled (:func:`split_items`).
        RuntimeError: the contained draw failed (past a bound, or raised): the message names the task(s).
    """
    contained = contained_tasks(spec)
    if not contained:
        return _draw_here(spec, split, seed, size)
    cpu_s = generation_cpu_s(size)
    result, failure = default_pool().call(_draw_in_temp_dir, spec, split, seed, size, cpu_s=cpu_s,
                                          wall_s=GENERATION_WALL_S)
    if failure is None and result[0] == "refused":
        raise ValueError(result[1])
    if failure is not None:
        raise RuntimeError(f"reasoning_gym task(s) {list(contained)}: drawing the {split} split ({size} items, seed "
                           f"{seed}) runs the library's generator code ({', '.join(executing_generation(contained[0]))}"
                           f"), so it ran in a contained worker ({cpu_s:g} s CPU, {GENERATION_WALL_S:g} s wall), and "
                           f"it failed: {failure.kind}: {failure.message}")
    return result[1]


def _draw_in_temp_dir(spec: TaskSpec, split: str, seed: int, size: int) -> tuple[str, Any]:
    """In a worker: :func:`_draw_here` with a fresh temporary working directory, removed after (and the working
    directory restored): ``("ok", items)`` or ``("refused", the ValueError's message)``."""
    before = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="rg-draw-") as scratch:
        os.chdir(scratch)
        try:
            return "ok", _draw_here(spec, split, seed, size)
        except ValueError as e:
            return "refused", str(e)
        finally:
            os.chdir(before)


def _draw_here(spec: TaskSpec, split: str, seed: int, size: int) -> list[dict]:
    """:func:`split_items`' problems of ``split``, drawn in this process from the generator seeded ``seed``."""
    limit = MAX_TEST_DRAWS_FACTOR * TEST_BUCKETS * size
    ds = dataset_for(spec, seed, limit)  # the library generates item i on access (Random(seed + i))
    want_test = split == "test"
    out: list[dict] = []
    for i in range(limit):
        item = ds[i]
        if is_test_question(item["question"]) == want_test:
            out.append(evaluated_gold(dict(item, source_index=i, seed=seed)))
            if len(out) == size:
                return out
    raise ValueError(f"only {len(out)} of {split}_size={size} {split}-side questions in {limit} draws with seed {seed}: "
                     f"the hash partition left that side of the task's problem space (almost) empty; choose a task "
                     f"config with more distinct questions")
