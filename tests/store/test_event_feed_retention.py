"""The relay gives published events feed positions and queues webhook deliveries in its own
transaction; retention drops old events with their feed rows and deliveries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from support import subscribe

from runcontrol import reconcilers
from runcontrol.store import webhooks as feed
from runcontrol.store.tables import event_feed, outbox, webhook_deliveries

LONG_AGO = datetime(2001, 1, 1, tzinfo=UTC)  # no other test publishes at this time


def _relay_all(db, now):  # type: ignore[no-untyped-def]
    while reconcilers.relay_outbox(db, [], now).published:
        pass


def test_relay_positions_fan_out_and_retention_cascade(db, make_leased_run, tenant):
    # Other tests' events are published now; only this test's are published LONG_AGO, so the
    # retention below removes this test's events only.
    _relay_all(db, datetime.now(UTC))
    sub = subscribe(db, tenant, LONG_AGO)
    run = make_leased_run(tenant)
    _relay_all(db, LONG_AGO)
    with db.tenant(tenant) as conn:
        events = (
            conn.execute(
                select(outbox.c.seq).where(outbox.c.run_id == run.run_id).order_by(outbox.c.seq)
            )
            .scalars()
            .all()
        )
        fed = feed.feed_after(conn, 0, 500)
        queued = conn.execute(
            select(webhook_deliveries.c.seq, webhook_deliveries.c.state).order_by(
                webhook_deliveries.c.position
            )
        ).all()
    assert [e["seq"] for e in fed] == list(events) and len(events) >= 2
    assert [e["position"] for e in fed] == sorted(e["position"] for e in fed)
    assert [tuple(q) for q in queued] == [(s, "Pending") for s in events]
    assert sub["startsAfter"] < fed[0]["position"]

    reconcilers.retention(db, LONG_AGO + timedelta(days=91), journal_days=365, outbox_days=90)
    with db.tenant(tenant) as conn:
        assert conn.execute(select(outbox).where(outbox.c.run_id == run.run_id)).all() == []
        assert conn.execute(select(event_feed)).all() == []
        assert conn.execute(select(webhook_deliveries)).all() == []
