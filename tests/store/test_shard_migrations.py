"""Migrations per shard database (issue 41, point 7): ``build_database`` (``runcontrol db``, and
every process that migrates) migrates every listed database, and a process that does not
migrate refuses to start while any database it serves is behind its code."""

from __future__ import annotations

import pytest

from runcontrol.bootstrap import build_database
from runcontrol.config import Settings
from runcontrol.store import Database
from runcontrol.store.functions import revisions
from runcontrol.store.schema import SchemaMismatch


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
