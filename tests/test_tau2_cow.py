"""Copy-on-write database copies (envs.tau2.cow) against tau2's own hashes."""
import copy

import pytest
from pydantic import BaseModel

from envs.tau2.cow import CowTable, DBSnapshot, db_hash


class Rec(BaseModel):
    name: str
    tags: list[str] = []


class DB(BaseModel):
    table: dict[str, Rec]
    meta: list[int] = []


@pytest.fixture
def snap():
    db = DB(table={f"k{i}": Rec(name=f"n{i}") for i in range(20)}, meta=[1, 2])
    return DBSnapshot(db)


def test_fresh_copies_share_nothing_mutable(snap):
    h0 = db_hash(snap.pristine)
    a, mode = snap.fresh()
    assert snap.cow_fields == ("table",) and isinstance(a.table, CowTable)
    a.table["k1"].tags.append("x")  # write mode: the record is copied first
    a.table.get("k2").name = "changed"
    for rec in a.table.values():
        rec.tags.append("all")
    a.meta.append(3)
    a.table["new"] = Rec(name="new")
    del a.table["k3"]
    assert db_hash(snap.pristine) == h0
    b, _ = snap.fresh()
    assert db_hash(b) == h0 and "k3" in b.table and "new" not in b.table


def test_share_reads_hands_out_pristine_records(snap):
    a, mode = snap.fresh()
    with mode.reading():
        r = a.table["k0"]
        assert r is snap.pristine.table["k0"]
        assert all(x is snap.pristine.table[k] for k, x in a.table.items())
    assert not a.table.touched
    assert a.table["k0"] is not snap.pristine.table["k0"] and a.table.touched == {"k0"}


def test_equal_matches_tau2_hash_comparison(snap):
    a, _ = snap.fresh()
    b, _ = snap.fresh()
    assert snap.equal(a, b) and db_hash(a) == db_hash(b)
    a.table["k1"].name = "z"
    assert not snap.equal(a, b) and db_hash(a) != db_hash(b)
    b.table["k1"].name = "z"
    b.table["k2"]  # touched but unchanged
    assert snap.equal(a, b) and db_hash(a) == db_hash(b)
    a.table.pop("k5")
    assert not snap.equal(a, b)
    b.table.pop("k5")
    assert snap.equal(a, b)
    a.meta.append(9)
    assert not snap.equal(a, b) and db_hash(a) != db_hash(b)
    # a delta kept without the database compares the same way
    da, db_ = snap.delta(a), snap.delta(b)
    assert not snap.same(da, db_)
    b.meta.append(9)
    assert snap.same(snap.delta(a), snap.delta(b)) and db_hash(a) == db_hash(b)


def test_non_copies_fall_back_to_hashes(snap):
    a, _ = snap.fresh()
    plain = DB.model_validate(snap.pristine.model_dump())
    assert snap.delta(plain) is None and snap.equal(a, plain)
    plain.table["k0"].name = "other"
    assert not snap.equal(a, plain)


def test_copy_and_pickle_materialize_plain_dicts(snap):
    import pickle

    a, _ = snap.fresh()
    c = copy.deepcopy(a)
    assert type(c.table) is dict and db_hash(c) == db_hash(a)
    t = pickle.loads(pickle.dumps(a.table))
    assert type(t) is dict and set(t) == set(a.table)


def test_airline_copy_and_tau2_hash():
    """A copy of the real airline database hashes like tau2's freshly loaded one."""
    from envs.tau2.domain import get_domain

    d = get_domain("airline")
    ep = d.new_environment()
    from tau2.registry import registry

    fresh = registry.get_env_constructor("airline")()
    assert ep.env.get_db_hash() == fresh.get_db_hash()
    ep.env.make_tool_call("send_certificate", user_id="mia_li_3668", amount=100)
    fresh.make_tool_call("send_certificate", user_id="mia_li_3668", amount=100)
    assert ep.env.get_db_hash() == fresh.get_db_hash()
    assert d.agent_snapshot.equal(ep.env.tools.db, fresh.tools.db)
    assert db_hash(d.agent_snapshot.pristine) == registry.get_env_constructor("airline")().get_db_hash()
