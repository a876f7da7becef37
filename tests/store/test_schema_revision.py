"""Processes that write but do not migrate (run hosts, the scheduler) refuse an older schema.

A document written for this release's ``runcontrol_apply`` would lose, on an older function,
whatever that one ignores (the baseline's refuses every document). So they build their database
with ``require_current_schema``, which checks the revision, read as a service role (the baseline
grants it), and names the fix. (The API does not: it starts, and reports not-ready, without a
database.)
"""

from __future__ import annotations

import asyncio

import pytest

from runcontrol.bootstrap import build_database
from runcontrol.config import Settings
from runcontrol.store import Database
from runcontrol.store.database import SchemaMismatch
from runcontrol.store.writers import revisions

BASELINE, *_, HEAD = revisions()  # the newest migration: a new one needs no edit here


def test_a_process_that_does_not_migrate_refuses_an_older_schema(fresh_url: str):
    older = Database(fresh_url)
    older.migrate(BASELINE)
    older.dispose()

    with pytest.raises(SchemaMismatch, match="migrate it first") as refused:
        build_database(Settings(), owner_url=fresh_url, migrate=False, require_current_schema=True)
    assert HEAD in str(refused.value)

    current = Database(fresh_url)
    current.migrate()
    assert current.schema_revision() == HEAD
    current.dispose()
    build_database(
        Settings(), owner_url=fresh_url, migrate=False, require_current_schema=True
    ).dispose()


def test_an_empty_database_is_refused_too(fresh_url: str):
    with pytest.raises(SchemaMismatch, match="unknown"):
        build_database(Settings(), owner_url=fresh_url, migrate=False, require_current_schema=True)


def test_a_run_host_will_not_start_on_an_older_schema(fresh_url: str):
    from actors.run_host import RunHost, host_config

    older = Database(fresh_url)
    older.migrate(BASELINE)
    older.dispose()

    async def start() -> None:
        RunHost(host_config(Settings(), fresh_url))

    with pytest.raises(SchemaMismatch, match="migrate it first"):
        asyncio.run(start())
