"""The set-based relay (issue 24): a batch costs the same few statements however many events it
holds, gives its events feed positions in outbox (commit) order, queues each tenant's events
to that tenant's subscriptions only, and notifies each tenant's feed once."""

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
from support import subscribe

from runcontrol import reconcilers
from runcontrol.store import Database, queries
from runcontrol.store.notify import libpq_url
from runcontrol.store.webhooks import FEED_CHANNEL

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


def _fed(db: Database, run_ids: list[UUID]) -> list[Any]:
    """(outbox id, feed position, tenant) of the runs' published events, by outbox id."""
    with db.system_tx() as conn:
        return conn.execute(
            text(
                "SELECT o.id, f.position, f.tenant_id FROM outbox o"
                " JOIN event_feed f ON f.event_id = o.event_id"
                " WHERE o.run_id = ANY(:ids) ORDER BY o.id"
            ),
            {"ids": run_ids},
        ).all()


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
    assert len(small) == len(large) <= 3, (small, large)


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
    fed = _fed(db, run_ids)
    assert report.published >= len(fed) > len(run_ids)
    positions = [r.position for r in fed]
    # Outbox order is commit order: the positions follow it, with no hole in the batch.
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
        mine = [r.position for r in fed if r.tenant_id == t]
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


def _published(db: Database, ids: list[int]) -> list[bool]:
    with db.system_tx() as conn:
        marks = dict(
            conn.execute(
                text("SELECT id, published_at IS NOT NULL FROM outbox WHERE id = ANY(:ids)"),
                {"ids": ids},
            ).all()
        )
    return [bool(marks.get(i, False)) for i in ids]  # a row not committed is not published


def test_the_floor_moves_past_published_rows_and_never_past_a_row_still_being_written(db, tenant):
    """A relay that keeps its floor reads past the rows it published, and never past the id of
    a transaction that drew it and has not committed: that row, committed after rows with
    larger ids were published, is published by the next pass."""
    _relay_all(db)
    floor = reconcilers.RelayFloor()
    run_id = uuid.uuid4()
    url = libpq_url(db.owner_url)
    with psycopg.connect(url) as late, psycopg.connect(url, autocommit=True) as other:
        slow = _event(late, tenant, run_id, 1)  # drawn, not committed
        quick = _event(other, tenant, run_id, 2)
        assert quick > slow
        deadline = time.monotonic() + 10
        while not _published(db, [quick])[0] or floor.mark is None:
            assert time.monotonic() < deadline, "the committed row was not published"
            reconcilers.relay_outbox(db, [], NOW, floor=floor)
        for _ in range(5):  # passes while the slow transaction is open
            reconcilers.relay_outbox(db, [], NOW, floor=floor)
        assert floor.after < slow and _published(db, [slow, quick]) == [False, True]
        late.commit()
    deadline = time.monotonic() + 10
    while not _published(db, [slow])[0]:
        assert time.monotonic() < deadline, "the late row was not published"
        reconcilers.relay_outbox(db, [], NOW, floor=floor)
    while floor.after < quick:  # once every writer up to them ended, the floor passes both
        assert time.monotonic() < deadline, f"the floor stayed at {floor.after}"
        reconcilers.relay_outbox(db, [], NOW, floor=floor)


def test_a_backlog_larger_than_a_batch_is_relayed_in_one_call(db, make_leased_run, tenant):
    """The scheduler's tick relays passes until one is short: a backlog of several batches is
    published by one call, not one batch a tick."""
    _relay_all(db)
    runs = [make_leased_run(tenant) for _ in range(4)]
    with db.system_tx() as conn:
        waiting = conn.execute(
            text("SELECT count(*) FROM outbox WHERE published_at IS NULL AND run_id = ANY(:ids)"),
            {"ids": [r.run_id for r in runs]},
        ).scalar_one()
    assert waiting >= 8
    report = reconcilers.relay_backlog(db, [], lambda: NOW, reconcilers.RelayFloor(), batch=3)
    assert report.published >= waiting and len(report.lags) == report.published
    assert reconcilers.relay_outbox(db, [], NOW).published == 0


def test_an_outbox_sequence_not_used_yet_marks_no_id_handed_out(scratch):
    """A new database's sequence says ``last_value`` 1 before it has handed out any id: the
    mark is 0 then (else the floor could pass the first event before it is written)."""
    with scratch.system_tx() as conn:
        assert conn.execute(text("SELECT is_called FROM outbox_id_seq")).scalar_one() is False
        drawn, _, _ = queries.sequence_mark(conn)
    assert drawn == 0
