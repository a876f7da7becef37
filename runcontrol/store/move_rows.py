"""A moving shard's rows (``store/move.py``): which tenants it holds, whether they still change,
their copy into another database, its verification, and their removal.

Every tenant table but the directory's own (``tenant_placement``) holds rows of a tenant, and
all of them move: the rows of its virtual shard and its legacy (version 4) runs alike. They are
read on the system path (``BYPASSRLS``) and written as the owner, in the tenant's scope
(``runcontrol.tenant_id``; the tables force row-level security on their owner too).

The keys a database numbers (``serial``: ``outbox.id``, ``recovery_journal_legacy.id``,
``audit_log.id``: ``RENUMBERED``, found in ``tables.py``) are numbered again by the target, in
the source's order: the target's own rows hold those numbers already; a feed page's event ids
(``feed_pages.ids``) are mapped to the new ones. Feed positions are the tenant's own (0039), so
they move as they are, and with them every cursor, delivery and subscription start. An event
the source's relay had published (up to its floor) arrives published (``published_at``: the
target's relay skips it); the others are published by the target's. The verification compares
every other column, and the tenant's feed (position, run and seq) on both sides.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Connection,
    Engine,
    Insert,
    Table,
    bindparam,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as upsert
from sqlalchemy.schema import sort_tables

from ..domain import shards
from .tables import TENANT_TABLES, feed_pages, metadata, outbox, shard_fences, tenant_placement

BATCH = 500
_SET_TENANT = text("SELECT set_config('runcontrol.tenant_id', :tenant, true)")
# The append-only tables' triggers let their owner delete under this setting (the journal's
# retention purge): the only way their rows leave a database.
_PURGE = text("SELECT set_config('runcontrol.retention_purge', 'on', true)")
_UTC = text("SET LOCAL TimeZone = 'UTC'")  # one text for a timestamp in both databases
_FENCE_LOCK = text("SELECT pg_advisory_xact_lock(72616041, hashtext(:tenant))")

# The feed's pages name events by id: copied after the events, their ids mapped.
_PUBLISHED = text("SELECT floor, now() AS now FROM relay_state WHERE id = 1")
# Every table of a tenant's rows, each after the tables it refers to.
TABLES: tuple[Table, ...] = tuple(
    sort_tables(
        [
            metadata.tables[name]
            for name in TENANT_TABLES
            if name not in (tenant_placement.name, shard_fences.name)  # a database's own
        ],
        extra_dependencies=[(outbox, feed_pages)],
    )
)
# The keys the database numbers (``serial``): numbered again by the target.
RENUMBERED = {
    t.name: str(c.name) for t in TABLES for c in t.primary_key.columns if c.autoincrement is True
}
# Columns mapped to the target's (an event's id) or set by the copy (an event published at
# the source), so not compared.
MAPPED: dict[str, tuple[str, ...]] = {"outbox": ("published_at",), "feed_pages": ("ids",)}


class RowsDiffer(Exception):
    """The target's copy is not the source's rows (``verify``)."""


def tenants_on(directory: Engine, source: Engine, vshard: int) -> list[str]:
    """The tenants of virtual shard ``vshard`` that have rows in ``source``, or are placed on it:
    those placed there, and those placed nowhere whose id hashes to it."""
    with directory.connect() as conn:
        placed = dict(
            conn.execute(select(tenant_placement.c.tenant_id, tenant_placement.c.vshard)).all()
        )
    found = {t for t, v in placed.items() if v == vshard}
    union = " UNION ".join(f"SELECT DISTINCT tenant_id FROM {t.name}" for t in TABLES)
    with source.connect() as conn:
        for (tenant,) in conn.execute(text(union)):
            if tenant not in placed and shards.hashed_vshard(tenant) == vshard:
                found.add(tenant)
    return sorted(found)


def fingerprint(source: Engine, tenants: Sequence[str]) -> tuple[Any, ...]:
    """What changes when a grain of these tenants commits (a run's version, an event, a lease,
    an answer, a chunk of output) or the relay publishes one of their events."""
    picked = "FROM {} WHERE tenant_id = ANY(:tenants)"
    parts = [
        f"(SELECT coalesce(sum(version), 0) {picked.format('runs')})",
        f"(SELECT count(*) {picked.format('outbox')})",
        f"(SELECT count(*) {picked.format('feed_pages')})",
        f"(SELECT count(*) {picked.format('leases')})",
        f"(SELECT count(*) {picked.format('command_answers')})",
        f"(SELECT count(*) {picked.format('output_chunks')})",
    ]
    with source.connect() as conn:
        return tuple(conn.execute(text(f"SELECT {', '.join(parts)}"), {"tenants": tenants}).one())


def copy(source: Engine, target: Connection, tenants: Sequence[str]) -> int:
    """Every row of ``tenants`` from ``source`` into ``target`` (the owner's transaction, which
    removed any earlier copy first: ``discard``); how many."""
    copied = 0
    with source.connect() as conn:
        floor, now = conn.execute(_PUBLISHED).one()
    for tenant in tenants:
        target.execute(_SET_TENANT, {"tenant": tenant})
        ids: dict[int, int] = {}  # the tenant's event ids: source -> target
        for table in TABLES:
            for batch in _read(source, table, tenant):
                copied += len(batch)
                _write(target, table, batch, _Events(ids, int(floor), now))
    waited = target.execute(text("SELECT max(seq) FROM flow_waiters")).scalar()
    if waited is not None:  # later waiters queue behind the copied ones
        target.execute(
            text(
                "SELECT setval('flow_waiters_seq', greatest(last_value, :seq)) "
                "FROM flow_waiters_seq"
            ),
            {"seq": waited},
        )
    return copied


def _read(source: Engine, table: Table, tenant: str) -> Iterator[list[dict[str, Any]]]:
    key = RENUMBERED.get(table.name)
    order = [table.c[key]] if key else list(table.primary_key.columns)
    query = select(table).where(table.c.tenant_id == tenant).order_by(*order)
    with source.connect() as conn:
        result = conn.execution_options(yield_per=BATCH).execute(query)
        for part in result.mappings().partitions():
            yield [dict(row) for row in part]


@dataclass(frozen=True, slots=True)
class _Events:
    """What the copy of a tenant's events and feed pages needs: their ids so far (source ->
    target), and the source's relay floor and time (an event up to it arrives published)."""

    ids: dict[int, int]
    floor: int
    now: datetime


def _write(target: Connection, table: Table, rows: list[dict[str, Any]], events: _Events) -> None:
    key = RENUMBERED.get(table.name)
    if table is feed_pages:
        rows = [{**r, "ids": [events.ids.get(i, 0) for i in r["ids"]]} for r in rows]
    elif table is outbox:
        rows = [
            r if r["published_at"] or r["id"] > events.floor else {**r, "published_at": events.now}
            for r in rows
        ]
    old = [r[key] for r in rows] if key is not None else []
    if key is not None:
        rows = [{k: v for k, v in r.items() if k != key} for r in rows]
    if table is outbox:  # the events' new ids, in the order written
        new = target.execute(
            _insert(table).returning(table.c.id, sort_by_parameter_order=True), rows
        ).scalars()
        events.ids.update(zip(old, new, strict=True))
        return
    target.execute(_insert(table), rows)


def _insert(table: Table) -> Insert:
    """``table``'s insert, a nullable JSON column's ``None`` written as SQL NULL, as the source
    held it (SQLAlchemy's default writes JSON ``null``, which a NULL-testing reader, such as
    the journal's view of ``outbox.journal``, takes for a value)."""
    nullable_json = {
        str(c.name): bindparam(str(c.name), type_=JSONB(none_as_null=True))
        for c in table.columns
        if isinstance(c.type, JSON) and c.nullable
    }
    return insert(table).values(nullable_json) if nullable_json else insert(table)


def fence(owner: Connection, tenants: Iterable[str], *, vshard: int, to: int, epoch: int) -> None:
    """In the owner's transaction: a fence row per tenant, each under the tenant's lock taken
    exclusive (``runcontrol_check_fence`` takes it shared with each document): it waits for
    the tenant's documents in flight, and none commits here once the fence has."""
    for tenant in tenants:  # in one order (sorted): two fences never wait for each other
        owner.execute(_SET_TENANT, {"tenant": tenant})
        owner.execute(_FENCE_LOCK, {"tenant": tenant})
        row = {"tenant_id": tenant, "vshard": vshard, "moved_to": to, "epoch": epoch}
        stmt = upsert(shard_fences).values(**row, fenced_at=func.now())
        owner.execute(stmt.on_conflict_do_update(index_elements=["tenant_id"], set_=row))


def unfence(owner: Connection, tenants: Iterable[str], *, to: int | None = None) -> None:
    """In the owner's transaction: the tenants' fences lifted (those towards ``to`` only)."""
    for tenant in tenants:
        owner.execute(_SET_TENANT, {"tenant": tenant})
        lifted = shard_fences.delete().where(shard_fences.c.tenant_id == tenant)
        if to is not None:
            lifted = lifted.where(shard_fences.c.moved_to == to)
        owner.execute(lifted)


def discard(owner: Connection, tenants: Iterable[str]) -> int:
    """In the owner's transaction: every row of ``tenants`` removed from this database (the
    referring rows first); how many."""
    owner.execute(_PURGE)
    removed = 0
    for tenant in tenants:
        owner.execute(_SET_TENANT, {"tenant": tenant})
        for table in reversed(TABLES):
            removed += owner.execute(table.delete().where(table.c.tenant_id == tenant)).rowcount
    return removed


def digests(engine: Engine, tenants: Sequence[str]) -> dict[str, tuple[int, str]]:
    """Per table, the count of the tenants' rows and a digest of them (every column but the
    renumbered and mapped ones)."""
    found: dict[str, tuple[int, str]] = {}
    with engine.begin() as conn:
        conn.execute(_UTC)
        for table in TABLES:
            renumbered = RENUMBERED.get(table.name)
            left_out = [*([renumbered] if renumbered else []), *MAPPED.get(table.name, ())]
            minus = "".join(f" - '{column}'" for column in left_out)
            row = f"(to_jsonb(t){minus})::text"
            query = text(
                f"SELECT count(*), md5(coalesce(string_agg(r, '|' ORDER BY r), '')) "
                f"FROM (SELECT {row} AS r FROM {table.name} t "
                f"WHERE tenant_id = ANY(:tenants)) s"
            )
            count, digest = conn.execute(query, {"tenants": list(tenants)}).one()
            found[table.name] = (int(count), str(digest))
    return found


def sequences(engine: Engine, tenants: Sequence[str]) -> dict[str, tuple[int, str, int, str]]:
    """Per run: its events (count, digest of seq and event id in order) and its journal
    entries (count, digest of sequence, entity and states in order)."""
    events = text(
        "SELECT run_id::text, count(*), md5(string_agg(seq || ':' || event_id, ',' ORDER BY seq))"
        " FROM outbox WHERE tenant_id = ANY(:tenants) GROUP BY run_id"
    )
    journal = text(
        "SELECT run_id::text, count(*), md5(string_agg(sequence || ':' || entity_id || ':' ||"
        " coalesce(from_state, '') || '>' || to_state, ',' ORDER BY sequence))"
        " FROM recovery_journal WHERE tenant_id = ANY(:tenants) GROUP BY run_id"
    )
    found: dict[str, tuple[int, str, int, str]] = {}
    with engine.connect() as conn:
        params = {"tenants": list(tenants)}
        for run, n, digest in conn.execute(events, params):
            found[run] = (int(n), str(digest), 0, "")
        for run, n, digest in conn.execute(journal, params):
            e_n, e_digest, _, _ = found.get(run, (0, "", 0, ""))
            found[run] = (e_n, e_digest, int(n), str(digest))
    return found


def gaps(engine: Engine, tenants: Sequence[str]) -> list[str]:
    """The runs whose events are not numbered 1 to n without a gap (invariant 11)."""
    query = text(
        "SELECT run_id::text FROM outbox WHERE tenant_id = ANY(:tenants) GROUP BY run_id"
        " HAVING min(seq) <> 1 OR max(seq) <> count(*) OR count(DISTINCT seq) <> count(*)"
    )
    with engine.connect() as conn:
        return [str(r) for (r,) in conn.execute(query, {"tenants": list(tenants)})]


def misplaced(engine: Engine, tenants: Sequence[str]) -> int:
    """The webhook deliveries whose feed position names another event than theirs (one the
    events' retention removed names none)."""
    query = text(
        "SELECT count(*) FROM webhook_deliveries d LEFT JOIN event_feed f"
        " ON f.tenant_id = d.tenant_id AND f.position = d.position"
        " WHERE d.tenant_id = ANY(:tenants) AND f.position IS NOT NULL"
        " AND (f.run_id, f.seq) IS DISTINCT FROM (d.run_id, d.seq)"
    )
    with engine.connect() as conn:
        return int(conn.execute(query, {"tenants": list(tenants)}).scalar_one())


def feeds(engine: Engine, tenants: Sequence[str]) -> dict[str, tuple[int, str]]:
    """Per tenant, its feed: the count and a digest of its events' positions, runs and seqs."""
    query = text(
        "SELECT tenant_id, count(*),"
        " md5(string_agg(position || ':' || run_id || ':' || seq, ',' ORDER BY position))"
        " FROM event_feed WHERE tenant_id = ANY(:tenants) GROUP BY tenant_id"
    )
    with engine.connect() as conn:
        rows = conn.execute(query, {"tenants": list(tenants)}).all()
    return {str(t): (int(n), str(digest)) for t, n, digest in rows}


def verify(source: Engine, target: Engine, tenants: Sequence[str]) -> None:
    """``RowsDiffer`` unless the target holds the tenants' rows as the source does: each
    table's count and digest, each run's events and journal entries, gap-free."""
    problems: list[str] = []
    here, there = digests(source, tenants), digests(target, tenants)
    for name, (count, digest) in here.items():
        other_count, other_digest = there[name]
        if count != other_count:
            problems.append(f"{name}: {count} rows on the source, {other_count} on the target")
        elif digest != other_digest:
            problems.append(f"{name}: the rows differ ({count} on each side)")
    runs_here, runs_there = sequences(source, tenants), sequences(target, tenants)
    for run in sorted(set(runs_here) | set(runs_there)):
        if runs_here.get(run) != runs_there.get(run):
            problems.append(f"run {run}: its events or journal entries differ")
    problems += [f"run {run}: its events have a gap on the target" for run in gaps(target, tenants)]
    if feeds(source, tenants) != feeds(target, tenants):
        problems.append("feed_pages: the tenants' feeds differ")
    wrong = misplaced(target, tenants)
    if wrong:
        problems.append(f"webhook_deliveries: {wrong} name another event's feed position")
    if problems:
        shown = "; ".join(problems[:10]) + ("" if len(problems) <= 10 else " ...")
        raise RowsDiffer(f"the copy differs from the source: {shown}")
