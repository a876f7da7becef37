"""Ids that carry their virtual shard (``domain/shards.py``, issue 41): a UUIDv7 whose
``rand_a`` holds the shard; legacy ids route to the first database; a tenant's shard without a
directory is a stable hash."""

from __future__ import annotations

import random
import re
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from runcontrol import ids
from runcontrol.config import Settings
from runcontrol.domain import shards
from runcontrol.domain.shards import LEGACY, VSHARDS, beside, derive, mint, vshard_of

vshard = st.integers(0, VSHARDS - 1)
ms = st.integers(0, (1 << 48) - 1)
rand = st.integers(0, (1 << 128) - 1)
PINNED = [941, 141, 66]  # hashed_vshard of "acme", "globex" and ""


@given(vshard, ms, rand)
def test_an_id_carries_its_shard_and_time_as_a_uuidv7(v, now_ms, r):
    id_ = mint(v, now_ms, r)
    assert (id_.version, id_.variant) == (7, uuid.RFC_4122)
    assert vshard_of(id_) == v
    assert shards.unix_ms(id_) == now_ms
    assert uuid.UUID(str(id_)) == id_  # its text round-trips too


def test_every_shard_round_trips():
    assert [vshard_of(mint(v, 1, 0)) for v in range(VSHARDS)] == list(range(VSHARDS))
    assert [vshard_of(mint(v, 1, -1 & ((1 << 64) - 1))) for v in range(VSHARDS)] == list(
        range(VSHARDS)
    )


@given(vshard, vshard, ms, ms, rand, rand)
def test_a_later_millisecond_sorts_after_whatever_the_shard(v1, v2, t1, t2, r1, r2):
    """PostgreSQL orders uuids by their bytes, as Python does by ``int``: the B-tree appends."""
    a, b = mint(v1, t1, r1), mint(v2, t2, r2)
    if t1 < t2:
        assert a < b and a.bytes < b.bytes


def test_no_collision_in_a_large_sample_within_one_millisecond_and_shard():
    rng = random.Random(41)
    minted = {mint(7, 1_760_000_000_000, rng.getrandbits(128)) for _ in range(200_000)}
    assert len(minted) == 200_000


@pytest.mark.parametrize("bad", [-1, VSHARDS, LEGACY])
def test_a_shard_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match="virtual shard"):
        mint(bad, 0, 0)


@given(rand)
def test_a_legacy_id_routes_as_legacy_and_its_entities_too(r):
    """Ids stored before shards (v4; a child run's v5) carry no shard: ``LEGACY``, the first
    database. A new entity of such a run gets a v4 id, so the run's rows route as one."""
    old = uuid.UUID(int=r, version=4)
    assert vshard_of(old) == LEGACY
    assert vshard_of(uuid.uuid5(old, "child")) == LEGACY
    entity = beside(old, 1_760_000_000_000, r)
    assert entity.version == 4 and entity.variant == uuid.RFC_4122
    assert derive(old, uuid.uuid5(old, "child")) == uuid.uuid5(old, "child")


@given(vshard, ms, rand, rand)
def test_an_entity_and_a_derived_id_take_their_runs_shard(v, now_ms, r1, r2):
    run_id = mint(v, now_ms, r1)
    assert vshard_of(beside(run_id, now_ms // 2, r2)) == v
    name = uuid.UUID(int=r2)
    derived = derive(run_id, name)
    assert vshard_of(derived) == v and derive(run_id, name) == derived  # the same every time
    assert shards.unix_ms(derived) == now_ms


def test_a_tenants_shard_without_a_directory_is_a_stable_hash():
    # Pinned: the same in every process and release (a changed hash would move new runs).
    assert [shards.hashed_vshard(t) for t in ("acme", "globex", "")] == PINNED
    spread = {shards.hashed_vshard(f"tenant-{k}") for k in range(5000)}
    assert len(spread) > VSHARDS * 0.9


def test_new_ids_take_the_tenants_placement_and_the_commands_time():
    placed = ids.new_run_id("acme", placement=lambda tenant: 513)
    assert vshard_of(placed) == 513
    assert vshard_of(ids.new_run_id("acme")) == shards.hashed_vshard("acme")
    now = datetime(2026, 12, 6, tzinfo=UTC)
    step = ids.beside(placed, now)
    assert vshard_of(step) == 513 and shards.unix_ms(step) == int(now.timestamp() * 1000)


# ---------------------------------------------------------- RUNCONTROL_SHARDS__DATABASES

ONE, TWO = "postgresql://rc:pw@db-1/rc", "postgresql+psycopg://rc:pw@db-2/rc"


@pytest.mark.parametrize("listed", [f"{ONE}, {TWO}", f'["{ONE}", "{TWO}"]'])
def test_the_shard_databases_are_a_list_of_urls(monkeypatch, listed):
    monkeypatch.setenv("RUNCONTROL_SHARDS__DATABASES", listed)
    monkeypatch.setenv("RUNCONTROL_DATABASE_URL", ONE)
    assert Settings().shard_databases() == (ONE, TWO)


def test_without_a_list_the_one_database_is_the_only_shard():
    assert Settings(database_url=ONE).shard_databases() == (ONE,)
    assert Settings(database_url=None).shard_databases() == ()  # the embedded one


@pytest.mark.parametrize(
    ("listed", "database_url", "says"),
    [
        (["mysql://rc:pw@db-1/rc"], None, "mysql://...@db-1/rc is not a postgresql:// URL"),
        ([ONE, ONE], None, "names a database twice"),
        ([TWO, ONE], ONE, "must list RUNCONTROL_DATABASE_URL first"),
    ],
)
def test_a_bad_list_is_refused_with_what_is_wrong(listed, database_url, says):
    with pytest.raises(ValidationError, match=re.escape(says)) as refused:
        Settings(database_url=database_url, shards={"databases": listed})
    assert ":pw@" not in str(refused.value).split("[type=")[0]  # the message names no password
