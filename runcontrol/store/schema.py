"""Which code may run on which schema: the order of a rolling upgrade (issue 23, item 4).

A migration declares ``oldest_code``: the oldest code revision that still runs correctly on the
schema the migration leaves. One that only adds (a nullable column, a table, an index, a writer
that still takes the documents the previous release sends) names the previous release's, or an
older one; one that drops, renames or tightens what an older release reads or writes names its
own revision. Without it, a migration is taken to keep no older code working (its own
revision): fail closed. ``Database.migrate`` records, in the same transaction as the revision,
the newest of those declarations along the chain (``alembic_version.oldest_code``, 0019): the
marker only moves forward.

Code is at the newest revision it ships (its head) and understands no schema older than that:
a document written for a newer ``runcontrol_apply`` would lose, on an older function, whatever
that one ignores, so an older schema is migrated first. On a schema newer than its head (a
revision it does not ship), code runs while the marker names a revision it ships, and refuses,
in one line, once it does not. So an upgrade is: migrate (the new release's ``runcontrol
migrate``, or its first process), while the old hosts and replicas go on serving; then replace
them one by one (docs/operations.md).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text

MARKER = "oldest_code"  # the column of alembic_version that 0019 adds

_COLUMNS = text(
    "SELECT column_name FROM information_schema.columns"
    " WHERE table_schema = current_schema() AND table_name = 'alembic_version'"
)


class SchemaMismatch(RuntimeError):
    """This code may not run on the database's schema: migrate it, or replace the code."""


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    """What the database says about its schema: its revision (None: no schema yet) and the
    oldest code revision that may run on it (None: not recorded, before 0019)."""

    revision: str | None
    oldest_code: str | None


def read_version(conn: Connection) -> SchemaVersion:
    """The database's revision and marker, read on ``conn`` without failing its transaction
    when the version table, or its marker column, is not there yet."""
    columns = set(conn.execute(_COLUMNS).scalars())
    if "version_num" not in columns:
        return SchemaVersion(None, None)
    marker = MARKER if MARKER in columns else "NULL"
    row = conn.execute(text(f"SELECT version_num, {marker} FROM alembic_version")).first()
    return SchemaVersion(None, None) if row is None else SchemaVersion(row[0], row[1])


def record(conn: Connection, scripts: ScriptDirectory) -> None:
    """After migrating on ``conn`` (same transaction): record the marker of the revision it
    is at now (once the marker's column exists: 0019 on)."""
    if MARKER not in set(conn.execute(_COLUMNS).scalars()):
        return
    revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    conn.execute(
        text(f"UPDATE alembic_version SET {MARKER} = :marker"),
        {"marker": oldest_code(scripts, revision)},
    )


def chain(scripts: ScriptDirectory) -> list[str]:
    """The revisions, oldest first."""
    return [s.revision for s in reversed(list(scripts.walk_revisions()))]


def oldest_code(scripts: ScriptDirectory, revision: str) -> str:
    """The marker of a schema at ``revision``: the newest ``oldest_code`` declared by the
    migrations up to it (a migration without one declares its own revision)."""
    revisions = chain(scripts)
    marker = revisions[0]
    for rev in revisions[: revisions.index(revision) + 1]:
        module = scripts.get_revision(rev).module
        declared = getattr(module, MARKER, rev)
        if declared not in revisions:
            raise ValueError(f"migration {rev}: oldest_code {declared!r} is not a revision")
        if revisions.index(declared) > revisions.index(marker):
            marker = declared
    return marker


def check(shipped: Sequence[str], found: SchemaVersion) -> None:
    """Raise ``SchemaMismatch`` (one line, naming the fix) unless code shipping the revisions
    ``shipped`` (oldest first) may run on a schema at ``found``."""
    head = shipped[-1]
    if found.revision == head:
        return
    if found.revision is None:
        raise SchemaMismatch(
            f"the database schema is at revision unknown (none yet), and this release needs "
            f"{head}: migrate it first (`runcontrol migrate`)"
        )
    if found.revision in shipped:
        raise SchemaMismatch(
            f"the database schema is at revision {found.revision}, and this release needs "
            f"{head}: migrate it first (`runcontrol migrate`)"
        )
    if found.oldest_code in shipped:
        return  # a newer schema that keeps this release working
    needs = f"code at {found.oldest_code} or newer" if found.oldest_code else "newer code"
    raise SchemaMismatch(
        f"the database schema is at revision {found.revision}, which needs {needs}; this "
        f"release is {head}: run the new release here (a rolling upgrade replaces this "
        "process, docs/operations.md)"
    )


@functools.cache
def shipped_revisions(scripts_location: str) -> tuple[str, ...]:
    """The revisions this code ships (oldest first), read once per process."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", scripts_location)
    return tuple(chain(ScriptDirectory.from_config(cfg)))
