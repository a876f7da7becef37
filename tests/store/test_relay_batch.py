"""The set-based relay (issue 24): a batch costs the same few statements however many events it
holds, gives its events feed positions in outbox (commit) order, queues each tenant's events
to that tenant's subscriptions only, and notifies each tenant's feed once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg
from sqlalchemy import event, text
from store_support import subscribe

from runcontrol import reconcilers
from runcontrol.store import Database
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
