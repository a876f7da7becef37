"""Processes that write but do not migrate (run hosts, the scheduler) refuse an older schema,
run on a newer one that keeps them working, and refuse, in one line, one that does not.

A document written for this release's ``runcontrol_apply`` would lose, on an older function,
whatever that one ignores (the baseline's refuses every document). So they build their database
with ``require_compatible_schema``, which checks the revision, read as a service role (the baseline
grants it), and names the fix. (The API does not: it starts, and reports not-ready, without a
database.)

A newer schema is a newer release's: its migrations are not shipped with this code, so the
tests apply ``tests/upgrade_migrations`` through the real machinery (``Database.migrate`` with
``more_versions``): 9001 adds a column and keeps this release working, 9002 keeps none.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runcontrol.bootstrap import build_database
from runcontrol.config import Settings
from runcontrol.store import Database
from runcontrol.store.database import SchemaMismatch
from runcontrol.store.functions import revisions
from runcontrol.store.schema import SchemaVersion

BASELINE, *_, HEAD = revisions()  # the newest migration: a new one needs no edit here
NEXT_RELEASE = Path(__file__).resolve().parent.parent / "upgrade_migrations"


def test_a_process_that_does_not_migrate_refuses_an_older_schema(fresh_url: str):
    older = Database(fresh_url)
    older.migrate(BASELINE)
    older.dispose()

    with pytest.raises(SchemaMismatch, match="migrate it first") as refused:
        build_database(
            Settings(), owner_url=fresh_url, migrate=False, require_compatible_schema=True
        )
    assert HEAD in str(refused.value)

    current = Database(fresh_url)
    current.migrate()
    assert current.schema_revision() == HEAD
    current.dispose()
    build_database(
        Settings(), owner_url=fresh_url, migrate=False, require_compatible_schema=True
    ).dispose()


def test_an_empty_database_is_refused_too(fresh_url: str):
    with pytest.raises(SchemaMismatch, match="unknown"):
        build_database(
            Settings(), owner_url=fresh_url, migrate=False, require_compatible_schema=True
        )


def test_a_run_host_will_not_start_on_an_older_schema(fresh_url: str):
    from actors.run_host import RunHost, host_config

    older = Database(fresh_url)
    older.migrate(BASELINE)
    older.dispose()

    async def start() -> None:
        RunHost(host_config(Settings(), fresh_url))

    with pytest.raises(SchemaMismatch, match="migrate it first"):
        asyncio.run(start())


def test_a_migrated_schema_records_the_oldest_code_that_may_run_on_it(fresh_url: str):
    current = Database(fresh_url)
    try:
        current.migrate()
        found = current.schema_version()  # the values per revision: test_schema_compatibility
        assert found.revision == HEAD and found.oldest_code in revisions()
        newer = Database(fresh_url)
        newer.migrate("9001", more_versions=[NEXT_RELEASE])
        assert current.schema_version() == SchemaVersion("9001", HEAD)
        newer.migrate(more_versions=[NEXT_RELEASE])  # 9002 declares none: itself
        assert current.schema_version() == SchemaVersion("9002", "9002")
        newer.dispose()
    finally:
        current.dispose()


def test_a_newer_schema_that_keeps_this_release_working_is_served(fresh_url: str):
    newer = Database(fresh_url)
    newer.migrate("9001", more_versions=[NEXT_RELEASE])
    newer.dispose()

    build_database(
        Settings(), owner_url=fresh_url, migrate=False, require_compatible_schema=True
    ).dispose()
    # A process of this release that migrates at start-up leaves the newer schema alone.
    same = build_database(Settings(), owner_url=fresh_url)
    assert same.schema_version() == SchemaVersion("9001", HEAD)
    same.dispose()


def test_a_newer_schema_that_keeps_no_older_code_is_refused_in_one_line(fresh_url: str):
    from actors.run_host import RunHost, host_config

    newer = Database(fresh_url)
    newer.migrate(more_versions=[NEXT_RELEASE])
    newer.dispose()
    refusal = (
        f"the database schema is at revision 9002, which needs code at 9002 or newer; "
        f"this release is {HEAD}: run the new release here"
    )

    with pytest.raises(SchemaMismatch, match=refusal) as refused:
        build_database(
            Settings(), owner_url=fresh_url, migrate=False, require_compatible_schema=True
        )
    assert "\n" not in str(refused.value)
    with pytest.raises(SchemaMismatch, match=refusal):
        build_database(Settings(), owner_url=fresh_url)  # a migrating process refuses too

    async def start() -> None:
        RunHost(host_config(Settings(), fresh_url))

    with pytest.raises(SchemaMismatch, match=refusal):
        asyncio.run(start())

    env = {**os.environ, "RUNCONTROL_DATABASE_URL": fresh_url}
    cli = subprocess.run(
        [sys.executable, "-m", "runcontrol.cli", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 1
    assert cli.stderr.splitlines() == [f"runcontrol: {refused.value}"]
