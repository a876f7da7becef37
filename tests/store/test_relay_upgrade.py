"""The upgrade to the relay's floor (0039) on stored data: the events the previous relay marked
keep their feed positions (each tenant's, as pages), so a feed cursor and a webhook
delivery's position name the same event after it; the floor starts below the first event
still unmarked, which is published next in its tenant's feed; the previous relay's mark is
refused from then on (its pass rolls back, nothing is lost)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import DBAPIError

from runcontrol import reconcilers
from runcontrol.store import Database
from runcontrol.store import webhooks as feed

WHEN = datetime(1980, 1, 1, tzinfo=UTC)


def test_the_upgrade_keeps_every_feed_position_and_publishes_the_rest_after_them(
    fresh_url: str, tenant: str
) -> None:
    database = Database(fresh_url)
    other = f"{tenant}-b"
    runs = {tenant: uuid.uuid4(), other: uuid.uuid4()}
    # (tenant, seq, position the previous relay gave it: database-wide, None: not yet)
    events = [
        (tenant, 1, 1),
        (other, 1, 2),
        (tenant, 2, 3),
        (tenant, 3, 4),
        (other, 2, None),
        (tenant, 4, None),
        (other, 3, 5),  # published before the one above it: commit order is not id order
    ]
    owner = create_engine(fresh_url)
    try:
        database.migrate("0038")
        with owner.begin() as conn:  # as the previous release wrote and marked them
            for who, seq, position in events:
                conn.exec_driver_sql(
                    "INSERT INTO outbox (event_id, tenant_id, project_id, run_id, seq, topic,"
                    " event_type, producer, schema_version, payload, occurred_at, published_at,"
                    " feed_position) VALUES (%s, %s, 'p', %s, %s, 'run', 'RunStateChanged', 'test',"
                    " 1, '{}', %s, %s, %s)",
                    (uuid.uuid4(), who, runs[who], seq, WHEN, position and WHEN, position),
                )
        database.migrate()

        def fed(who: str) -> list[tuple[int, int]]:
            with database.tenant(who) as conn:
                return [(e["seq"], e["position"]) for e in feed.feed_after(conn, 0, 10)]

        assert fed(tenant) == [(1, 1), (2, 3), (3, 4)] and fed(other) == [(1, 2), (3, 5)]
        with database.tenant(tenant) as conn:  # a cursor inside the old positions
            assert [e["seq"] for e in feed.feed_after(conn, 3, 10)] == [3]
        with database.system_tx() as conn:
            floor = conn.exec_driver_sql("SELECT floor FROM relay_state").scalar_one()
            with pytest.raises(DBAPIError, match="permission denied"), conn.begin_nested():
                conn.exec_driver_sql(
                    "UPDATE outbox SET feed_position = 9 WHERE feed_position IS NULL"
                )
        assert floor == 4  # below the first row still unmarked (the fifth)

        assert reconcilers.relay_outbox(database, [], WHEN).published == 2
        assert fed(tenant) == [(1, 1), (2, 3), (3, 4), (4, 5)]
        assert fed(other) == [(1, 2), (3, 5), (2, 6)]  # each after its tenant's last position
        assert reconcilers.relay_outbox(database, [], WHEN).published == 0
    finally:
        owner.dispose()
        database.dispose()
