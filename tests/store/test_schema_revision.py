"""Processes that write but do not migrate (run hosts, the scheduler) refuse an older schema.

A document written for this release's ``runcontrol_apply`` would lose, on an older function,
whatever that one ignores (0004's budget release, for one). So they build their database with
``require_current_schema``, which checks the revision, read as a service role (migration 0005
lets it), and names the fix. (The API does not: it starts, and reports not-ready, without a
database.)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from runcontrol.bootstrap import build_database
from runcontrol.config import Settings
from runcontrol.store import Database
from runcontrol.store.database import SchemaMismatch
from runcontrol.store.writers import revisions


@pytest.fixture
def fresh_url(owner_url: str, db: Database) -> Iterator[str]:
    """An empty database on the session's server (its roles exist already)."""
    name = f"runcontrol_schema_{uuid.uuid4().hex[:8]}"
    admin = create_engine(owner_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield make_url(owner_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


HEAD = revisions()[-1]  # the newest migration: a new one needs no edit here


@pytest.mark.parametrize("revision", ("0003", "0005"))
def test_a_process_that_does_not_migrate_refuses_an_older_schema(fresh_url: str, revision: str):
    older = Database(fresh_url)
    older.migrate(revision)
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
    older.migrate("0004")
    older.dispose()

    async def start() -> None:
        RunHost(host_config(Settings(), fresh_url))

    with pytest.raises(SchemaMismatch, match="migrate it first"):
        asyncio.run(start())
