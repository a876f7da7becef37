"""The set-based relay (issue 24): a batch costs the same few statements however many events it
holds, gives its events feed positions in outbox (commit) order, queues each tenant's events
to that tenant's subscriptions only, and notifies each tenant's feed once. Since 0039 it
updates no event row: its floor (``relay_state``) moves, and each tenant's feed gains a page."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg
from sqlalchemy import event, text
from support import fed, published, subscribe

from runcontrol import reconcilers
from runcontrol.store import Database, queries
from runcontrol.store.notify import libpq_url
from runcontrol.store.webhooks import FEED_CHANNEL, FEED_LOCK, feed_after

NOW = datetime(2026, 6, 2, tzinfo=UTC)


def _relay_all(db: Database) -> None:
    while reconcilers.relay_outbox(db, [], NOW).published:
        pass


@contextmanager
def _statements(db: Database) -> Iterator[list[str]]:
    """The statements the system engine sends meanwhile (SQLAlchemy's own cursor hook)."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(db.system, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(db.system, "before_cursor_execute", record)


def _subscribe(db: Database, tenant: str) -> UUID:
    return UUID(subscribe(db, tenant, NOW)["subscriptionId"])


def _floor(db: Database) -> int:
    with db.system_tx() as conn:
        return int(conn.execute(text("SELECT floor FROM relay_state")).scalar_one())


def test_a_batch_costs_the_same_statements_whatever_its_size(db, make_leased_run, tenant):
    _relay_all(db)
    make_leased_run(tenant)
    with _statements(db) as small:
        one = reconcilers.relay_outbox(db, [], NOW)
    for _ in range(6):
        make_leased_run(tenant)
    with _statements(db) as large:
        many = reconcilers.relay_outbox(db, [], NOW)
    assert 0 < one.published < many.published
    # the floor, its bound, the take, the pages with the deliveries, the floor recorded
    assert len(small) == len(large) <= 5, (small, large)


def test_positions_follow_commit_order_and_deliveries_stay_in_their_tenant(
    db, make_leased_run, tenant
):
    _relay_all(db)
    other = f"t-{uuid.uuid4().hex[:12]}"
    subs = {tenant: _subscribe(db, tenant), other: _subscribe(db, other)}
    run_ids = [make_leased_run(t).run_id for t in (tenant, other, tenant, other, tenant)]
    with psycopg.connect(libpq_url(db.system_url), autocommit=True) as listening:
        listening.execute(f"LISTEN {FEED_CHANNEL}")
        report = reconcilers.relay_outbox(db, [], NOW)
        told = [n.payload for n in listening.notifies(timeout=5.0, stop_after=2)]
    rows = [r for r in fed(db, run_ids) if r.position is not None]
    assert report.published >= len(rows) > len(run_ids)
    for t in subs:  # each tenant's positions its own, in outbox (commit) order, with no hole
        positions = [r.position for r in rows if r.tenant_id == t]
        assert positions == list(range(positions[0], positions[0] + len(positions)))
    assert sorted(told) == sorted(subs)  # one NOTIFY per tenant whose feed grew

    with db.system_tx() as conn:
        queued = conn.execute(
            text(
                "SELECT subscription_id, tenant_id, position, state FROM webhook_deliveries"
                " WHERE subscription_id = ANY(:subs) ORDER BY position"
            ),
            {"subs": list(subs.values())},
        ).all()
    for t, sub in subs.items():
        mine = [r.position for r in rows if r.tenant_id == t]
        got = [q for q in queued if q.subscription_id == sub]
        assert [q.position for q in got] == mine
        assert {(q.tenant_id, q.state) for q in got} == {(t, "Pending")}


def _event(conn: psycopg.Connection[Any], tenant: str, run_id: UUID, seq: int) -> int:
    """An outbox row written straight to the table (its id drawn now): its id."""
    found = conn.execute(
        "INSERT INTO outbox (event_id, tenant_id, project_id, run_id, seq, topic, event_type,"
        " producer, schema_version, payload, occurred_at)"
        " VALUES (%s, %s, 'p', %s, %s, 'runs', 'Probe', 'test', 1, '{}', now()) RETURNING id",
        (uuid.uuid4(), tenant, run_id, seq),
    ).fetchone()
    assert found is not None
    return int(found[0])


def _positions(db: Database, run_id: UUID, ids: list[int]) -> list[int | None]:
    """Each of the run's outbox rows' feed position (None: not published; a row not committed
    is not)."""
    found = {r.id: r.position for r in fed(db, [run_id])}
    return [found.get(i) for i in ids]


def test_a_row_committed_after_a_larger_id_was_published_is_published_after_it(db, tenant):
    """The floor never passes the id of a transaction that drew it and has not committed:
    while it is open, passes publish the rows after it and the floor stays below it; once it
    commits, the next passes publish it (after the larger id, in its tenant's feed) and the
    floor passes both. Without the snapshot's check the floor would pass the open row and
    skip it for ever."""
    _relay_all(db)
    run_id = uuid.uuid4()
    url = libpq_url(db.owner_url)
    with psycopg.connect(url) as late, psycopg.connect(url, autocommit=True) as other:
        slow = _event(late, tenant, run_id, 1)  # drawn, not committed
        quick = _event(other, tenant, run_id, 2)
        assert quick > slow
        for _ in range(5):  # passes while the slow transaction is open: quick waits too
            reconcilers.relay_outbox(db, [], NOW)
        assert _floor(db) < slow and _positions(db, run_id, [slow, quick]) == [None, None]
        late.commit()
    deadline = time.monotonic() + 10
    while None in _positions(db, run_id, [slow, quick]):
        assert time.monotonic() < deadline, "the late row was not published"
        reconcilers.relay_outbox(db, [], NOW)
    first, second = _positions(db, run_id, [slow, quick])
    assert first is not None and second is not None and first < second  # id order, once settled
    assert _floor(db) >= quick


def test_a_tick_waits_once_for_the_transactions_in_flight_at_its_pass(db, tenant):
    """A tick's first pass, left behind by a writer in flight, is followed once by another a
    moment later: what the writer committed meanwhile is published by the same tick, not the
    next one (a second later). The clock commits the writer when the second pass starts."""
    _relay_all(db)
    run_id = uuid.uuid4()
    url = libpq_url(db.owner_url)
    with psycopg.connect(url) as late, psycopg.connect(url, autocommit=True) as other:
        slow = _event(late, tenant, run_id, 1)
        quick = _event(other, tenant, run_id, 2)
        passes: list[datetime] = []

        def clock() -> datetime:
            if passes:  # the second pass: the writer has committed
                late.commit()
            passes.append(NOW)
            return NOW

        report = reconcilers.relay_backlog(db, [], clock, settle_s=0.01)
    assert len(passes) == 2 and report.published == 2
    assert None not in _positions(db, run_id, [slow, quick])


def test_publication_updates_no_event_row(db, make_leased_run, tenant):
    """No per-event write on the hot path (0039): every event row keeps the tuple its commit
    wrote (an UPDATE, even a HOT one, writes a new version: another ctid and xmin), and the
    relay's passes write one ``relay_state`` row and one feed page per tenant."""
    _relay_all(db)
    runs = [make_leased_run(tenant).run_id for _ in range(3)]
    versions = text("SELECT id, ctid::text, xmin::text FROM outbox WHERE run_id = ANY(:ids)")
    with db.system_tx() as conn:
        before = sorted(conn.execute(versions, {"ids": runs}).all())
    _relay_all(db)
    assert all(p is not None for p in published(db, runs).values())
    with db.system_tx() as conn:
        after = sorted(conn.execute(versions, {"ids": runs}).all())
        pages = conn.execute(
            text("SELECT count(*) FROM feed_pages WHERE tenant_id = :t"), {"t": tenant}
        ).scalar_one()
    assert after == before and len(before) > len(runs)
    assert pages == 1  # one pass, one tenant


def test_a_feed_cursor_reads_the_same_events_across_passes(db, make_leased_run, tenant):
    """A position names one event for good: reading the feed from a cursor after later passes
    answers the same events at the same positions, then the new ones after them."""
    _relay_all(db)
    make_leased_run(tenant)
    _relay_all(db)
    with db.tenant(tenant) as conn:
        first = feed_after(conn, 0, 500)
    make_leased_run(tenant)
    _relay_all(db)
    with db.tenant(tenant) as conn:
        again = feed_after(conn, 0, 500)
        cursor = first[-1]["position"]
        newer = feed_after(conn, cursor, 500)
        paged = feed_after(conn, cursor - 2, 3)  # a cursor inside a page, a limit across two
    assert again[: len(first)] == first and again[len(first) :] == newer and newer
    assert [e["position"] for e in again] == list(range(1, len(again) + 1))
    assert paged == again[len(first) - 2 : len(first) + 1]


def test_a_backlog_larger_than_a_batch_is_relayed_in_one_call(db, make_leased_run, tenant):
    """The scheduler's tick relays passes until one is short: a backlog of several batches is
    published by one call, not one batch a tick."""
    _relay_all(db)
    runs = [make_leased_run(tenant) for _ in range(4)]
    with db.system_tx() as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM outbox WHERE run_id = ANY(:ids)"
                " AND id > (SELECT floor FROM relay_state)"
            ),
            {"ids": [r.run_id for r in runs]},
        ).scalar_one()
    assert waiting >= 8
    report = reconcilers.relay_backlog(db, [], lambda: NOW, batch=3)
    assert report.published >= waiting and len(report.lags) == report.published
    assert reconcilers.relay_outbox(db, [], NOW).published == 0


def test_an_outbox_sequence_not_used_yet_marks_no_id_handed_out(scratch):
    """A new database's sequence says ``last_value`` 1 before it has handed out any id: the
    relay reads 0 then (else the floor could pass the first event before it is written)."""
    with scratch.system_tx() as conn:
        assert conn.execute(text("SELECT is_called FROM outbox_id_seq")).scalar_one() is False
        take = queries.take_published(conn, FEED_LOCK)
    assert take.rows == [] and take.then == queries.RelayState(0, None)
