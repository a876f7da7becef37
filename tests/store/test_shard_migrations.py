"""Migrations per shard database (issue 41, point 7): ``build_database`` (``runcontrol db``, and
every process that migrates) migrates every listed database, and a process that does not
migrate refuses to start while any database it serves is behind its code; ``runcontrol up
--shards 2`` makes its second database and spreads a new deployment's virtual shards."""

from __future__ import annotations

import pytest
from support import drop_database

from runcontrol import embedded
from runcontrol.bootstrap import build_database
from runcontrol.config import Settings
from runcontrol.domain.shards import hashed_vshard
from runcontrol.store import Database
from runcontrol.store.functions import revisions
from runcontrol.store.schema import SchemaMismatch
from runcontrol.store.shards import Shards


def test_every_shard_database_is_migrated_and_each_one_behind_is_refused(
    scratch: Database, fresh_url: str
):
    baseline, *_, head = revisions()
    listed = [scratch.owner_url, fresh_url]
    settings = Settings(database_url=scratch.owner_url, shards={"databases": listed})
    behind = Database(fresh_url)
    behind.migrate(baseline)  # the second database: an older release's schema
    behind.dispose()

    with pytest.raises(SchemaMismatch, match="migrate it first"):  # the first is at head
        build_database(settings, migrate=False, require_compatible_schema=True)

    migrated = build_database(settings)  # as `runcontrol db` does: every listed database
    try:
        assert [d.owner_url for d in migrated.databases()] == listed
        assert [d.schema_revision() for d in migrated.databases()] == [head, head]
    finally:
        migrated.dispose()
    build_database(settings, migrate=False, require_compatible_schema=True).dispose()


def test_up_with_two_shards_makes_the_second_database_and_spreads_a_new_deployment(
    owner_url: str, scratch: Database
):
    """``runcontrol up --shards 2``: a second database beside the first on its server, both
    migrated, the virtual shards spread over them while nothing is stored, never after."""
    urls = embedded.shard_databases(scratch.owner_url, 2)
    assert urls[0] == scratch.owner_url and urls[1].split("?")[0].endswith("_shard1")
    assert embedded.shard_databases(scratch.owner_url, 2) == urls  # made once
    shards = Shards([scratch, Database(urls[1])])
    try:
        shards.migrate()
        assert shards.spread()
        assert [shards.directory.database_for(v) for v in range(4)] == [0, 1, 0, 1]
        assert not shards.spread()  # spread already
        assert shards.for_tenant("acme").index == hashed_vshard("acme") % 2
    finally:
        drop_database(owner_url, shards.all()[1].db)
