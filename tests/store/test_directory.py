"""The directory of virtual shards (issue 41, ``store/directory.py``, migration 0031): seeded
with every virtual shard on the first database, cached in each process, reloaded when its
version changes, each change announced on ``runcontrol_directory``."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import create_engine, exc, text
from sqlalchemy.pool import NullPool

from runcontrol.domain.shards import LEGACY, VSHARDS, hashed_vshard
from runcontrol.store import Database
from runcontrol.store.directory import CHANNEL, Directory
from runcontrol.store.notify import libpq_url


def test_every_virtual_shard_starts_on_the_first_database(db: Database, tenant: str):
    directory = Directory(db.system)
    assert {directory.database_for(v) for v in range(VSHARDS)} == {0}
    assert directory.database_for(LEGACY) == 0  # where every row stored before shards is
    assert directory.vshard_for(tenant) == hashed_vshard(tenant)  # not placed: the hash
    with db.system_tx() as conn:
        seeded = conn.execute(text("SELECT count(*), min(epoch), max(epoch) FROM vshards"))
        assert tuple(seeded.one()) == (VSHARDS, 0, 0)


def test_a_tenant_reads_its_own_placement_and_changes_none(db: Database, tenant: str):
    Directory(db.system).place(tenant, 17)
    Directory(db.system).place(f"{tenant}-b", 18)
    with db.tenant(tenant) as conn:  # row-level security: its own row only
        rows = conn.execute(text("SELECT tenant_id, vshard FROM tenant_placement")).all()
        assert [tuple(r) for r in rows] == [(tenant, 17)]
    with pytest.raises(exc.ProgrammingError, match="permission denied"), db.tenant(tenant) as conn:
        conn.execute(text("UPDATE tenant_placement SET vshard = 0"))


def test_a_change_bumps_the_version_notifies_and_a_stale_process_reloads(scratch: Database):
    here, there = Directory(scratch.system), Directory(scratch.system)
    with psycopg.connect(libpq_url(scratch.system_url), autocommit=True) as listening:
        listening.execute(f"LISTEN {CHANNEL}")
        here.place("acme", 513)
        told = [n.payload for n in listening.notifies(timeout=5.0, stop_after=1)]
    assert told == [str(here.version)] and here.version == there.version + 1
    assert here.vshard_for("acme") == 513
    assert there.vshard_for("acme") == hashed_vshard("acme")  # cached until it refreshes
    assert there.refresh() and there.vshard_for("acme") == 513
    assert not there.refresh()  # the same version: nothing to load

    # A virtual shard moved (as a move will write it): its runs are routed there from the id.
    with scratch.system_tx() as conn:
        conn.execute(text("UPDATE vshards SET database = 1, epoch = epoch + 1 WHERE vshard = 7"))
        conn.execute(text("UPDATE directory_version SET version = version + 1"))
    assert there.refresh()
    assert there.database_for(7) == 1 and there.database_for(8) == 0

    owner = create_engine(scratch.owner_url, poolclass=NullPool)  # the system role deletes none
    with owner.begin() as conn:
        conn.execute(text("DELETE FROM vshards WHERE vshard = 3"))
    with pytest.raises(RuntimeError, match="1023 virtual shards"):
        Directory(scratch.system)


def test_a_placement_is_a_virtual_shard(db: Database, tenant: str):
    with pytest.raises(ValueError, match="virtual shard"):
        Directory(db.system).place(tenant, VSHARDS)
