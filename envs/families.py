"""The env-family registry: what a family of text envs declares so the trainer can run it, from its own folder.

A family is a folder ``envs/<name>/`` whose ``family.py`` calls :func:`register_family` once with an
:class:`EnvFamily`:

* ``ids``         -- its Gymnasium ids and lazy entry points (registered with Gymnasium by :func:`discover`);
* ``config``      -- its config section: the ``econfig`` keys it reads, with their defaults. Keys the typed schema
                     (``torchrl_grpo.config.schema.EnvConfig``) already has are read from it; any other key is given
                     under ``econfig.params`` (a free mapping the family checks: an unknown key is a ``ValueError``
                     naming it and the family's keys, raised by :meth:`EnvFamily.section`);
* ``make_kwargs`` -- ``(section, split, dataset_path, runtime) -> (env_id, gym.make kwargs)`` for one split;
* ``check_data``  -- ``(section, datasets) -> {dataset name: source}``: load and validate the data of both splits
                     before any model loads (a wrong path fails in a second);
* ``continual``   -- optional per-domain defaults for continual runs (``cl.task_order`` names).

Discovery needs no central list: :func:`discover` (run by ``import envs``) loads every ``envs/*/family.py``. A
``family.py`` is loaded on its own, without its package's ``__init__`` (so listing the families loads no tau2, no
data, no generator library): it imports only :mod:`envs.families`, and its entry points and data checks name the
family's heavier modules lazily (strings, or imports inside the functions it registers).

A one-turn family's env subclasses :class:`envs.single_turn.SingleTurnTextEnv` and keeps only its data and grading
(``envs/digit_sum/``: the smallest example, added as ``env.py`` + ``family.py`` + ``configs/grpo_digit_sum.yaml``).

``tests/test_env_families.py`` fails when a registered family lacks a piece; ``tests/test_env_contract.py`` runs
the contract over every id of :data:`envs.ENV_IDS`, which is derived from this registry.
This module never imports ``torchrl_grpo``.
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["EnvFamily", "register_family", "check_pieces", "families", "family_of", "discover", "contract_ids", "compat_ids",
           "DATASETS"]

#: the two dataset sections of a run config, in the order :attr:`EnvFamily.check_data` reports them
DATASETS = ("train_dataset", "valid_dataset")

#: ``(section, split, dataset_path, runtime) -> (env_id, gym.make kwargs)``
MakeKwargs = Callable[[dict, str, "str | None", Mapping[str, Any]], "tuple[str, dict]"]
#: ``(section, {dataset name: (split, path)}) -> {dataset name: source}``
CheckData = Callable[[dict, Mapping[str, "tuple[str, str | None]"]], "dict[str, str]"]


@dataclass(frozen=True)
class EnvFamily:
    """One env family's declaration (module docstring).

    Attributes:
        name: the family's name (its folder under ``envs/``).
        ids: Gymnasium id -> entry point ``"module:Class"``, or ``("module:Class", registration kwargs)``.
        config: its config section: ``econfig`` key -> default (``system_prompt`` included when it reads one).
        make_kwargs: one split's ``(env_id, gym.make kwargs)``. ``runtime`` holds values the trainer derives:
            ``user`` (who plays a tau2 customer, ``None`` elsewhere), ``user_fn`` (a local model user or None) and
            ``max_intents`` (tau2: ``train_dataset.max_intents`` for the train split, else None; others ignore it).
        check_data: loads both splits' data; returns ``{"train_dataset": source, "valid_dataset": source}`` (a
            file path, a hub id, or the generator's seeds and sizes), or ``{}`` when the data ships with a package.
        config_ids: further ``econfig.env_id`` spellings the family answers (tau2: ``"tau2"`` + ``econfig.domain``).
        compat_ids: ids of ``ids`` that follow another project's API instead of :mod:`envs.contract` (left out of
            :data:`envs.ENV_IDS`, tested in their own files).
        continual: continual-run domain -> ``{"train_split", "eval_split", "solo", "econfig"}`` defaults.
    """

    name: str
    ids: Mapping[str, Any]
    config: Mapping[str, Any]
    make_kwargs: MakeKwargs
    check_data: CheckData
    config_ids: tuple[str, ...] = ()
    compat_ids: tuple[str, ...] = ()
    continual: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def answers(self, env_id: str) -> bool:
        """Whether ``econfig.env_id`` names this family."""
        return env_id in self.ids or env_id in self.config_ids

    def section(self, econfig: Mapping[str, Any]) -> dict:
        """This family's settings from a plain ``econfig`` mapping: each key of :attr:`config` from
        ``econfig.params``, else from ``econfig`` itself, else its default; plus ``env_id``.

        Raises:
            ValueError: ``econfig.params`` is not a mapping, or holds a key this family does not read (naming it and
                the family's keys).
        """
        params = econfig.get("params") or {}
        if not isinstance(params, Mapping):
            raise ValueError(f"econfig.params must be a mapping of {self.name}'s settings, got {params!r:.80}")
        unknown = sorted(set(params) - set(self.config))
        if unknown:
            raise ValueError(f"econfig.params has key(s) {unknown} that env family {self.name!r} "
                             f"({econfig.get('env_id')}) does not read; its keys: {sorted(self.config)}")
        out = {k: params[k] if k in params else econfig.get(k, default) for k, default in self.config.items()}
        return {"env_id": econfig.get("env_id"), **out}


_FAMILIES: dict[str, EnvFamily] = {}


def register_family(family: EnvFamily) -> EnvFamily:
    """Add ``family`` to the registry and register its Gymnasium ids (an id already registered is kept).

    Returns:
        ``family``.

    Raises:
        ValueError: another family of that name, or an id another family registered.
    """
    from gymnasium.envs.registration import register, registry

    check_pieces(family)
    old = _FAMILIES.get(family.name)
    if old is not None and old != family and set(old.ids) != set(family.ids):
        raise ValueError(f"env family {family.name!r} is registered twice with different ids")
    for other in _FAMILIES.values():
        clash = sorted(set(other.ids) & set(family.ids)) if other.name != family.name else []
        if clash:
            raise ValueError(f"env family {family.name!r} registers {clash}, already registered by {other.name!r}")
    _FAMILIES[family.name] = family
    for env_id, entry in family.ids.items():
        entry_point, kwargs = (entry, {}) if isinstance(entry, str) else entry
        if env_id not in registry:
            register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs))
    return family


def check_pieces(family: EnvFamily) -> None:
    """Check that ``family`` declares every piece (:class:`EnvFamily`'s attributes).

    Raises:
        TypeError: a piece of the wrong type (no name, an empty ``ids`` or one whose entry point is not
            ``"module:attr"``, a ``config`` that is not a mapping, a ``make_kwargs`` / ``check_data`` that is not
            callable).
        ValueError: a ``compat_ids`` entry outside ``ids``, or ``continual`` defaults without exactly the keys
            ``train_split``, ``eval_split``, ``solo``, ``econfig`` (naming this family's id as ``econfig.env_id``).
    """
    n = family.name
    if not isinstance(n, str) or not n:
        raise TypeError(f"an env family needs a name, got {n!r}")
    if not isinstance(family.ids, Mapping) or not family.ids:
        raise TypeError(f"env family {n!r} registers no ids")
    for env_id, entry in family.ids.items():
        ep = entry if isinstance(entry, str) else entry[0] if isinstance(entry, tuple) and len(entry) == 2 else None
        if not isinstance(ep, str) or ep.count(":") != 1:
            raise TypeError(f"env family {n!r}: id {env_id!r} needs an entry point 'module:attr', got {entry!r}")
    if not isinstance(family.config, Mapping):
        raise TypeError(f"env family {n!r}: config must map econfig keys to defaults, got {family.config!r:.80}")
    for piece in ("make_kwargs", "check_data"):
        if not callable(getattr(family, piece)):
            raise TypeError(f"env family {n!r}: {piece} must be callable")
    if not set(family.compat_ids) <= set(family.ids):
        raise ValueError(f"env family {n!r}: compat_ids {sorted(family.compat_ids)} not all in its ids")
    for domain, d in family.continual.items():
        if set(d) != {"train_split", "eval_split", "solo", "econfig"} or not family.answers(d["econfig"].get("env_id")):
            raise ValueError(f"env family {n!r}: continual domain {domain!r} needs train_split, eval_split, solo and "
                             f"an econfig naming one of its ids, got {d!r:.200}")


def discover() -> dict[str, EnvFamily]:
    """Load every ``envs/*/family.py`` not loaded yet (each on its own: its package ``__init__`` does not run).

    Returns:
        The registry, family name -> :class:`EnvFamily` (sorted by name).
    """
    for path in sorted(Path(__file__).parent.glob("*/family.py")):
        name = f"envs._family_{path.parent.name}"
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return families()


def families() -> dict[str, EnvFamily]:
    """The registered families, name -> :class:`EnvFamily` (sorted by name)."""
    return dict(sorted(_FAMILIES.items()))


def family_of(env_id: str) -> EnvFamily | None:
    """The family that answers ``econfig.env_id`` (:meth:`EnvFamily.answers`), or ``None``."""
    return next((f for f in _FAMILIES.values() if f.answers(env_id)), None)


def contract_ids() -> list[str]:
    """Every registered id that follows :mod:`envs.contract`, family by family (sorted by family name)."""
    return [i for f in families().values() for i in f.ids if i not in f.compat_ids]


def compat_ids() -> list[str]:
    """Every registered id that follows another project's API (:attr:`EnvFamily.compat_ids`)."""
    return [i for f in families().values() for i in f.compat_ids]
