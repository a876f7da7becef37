"""Invariant 3, second half: publication is never proof. A sink that fails, and a relay killed
(SIGKILL, a real process) after its sinks were given the events and before the relay's floor
committed, leave the rows unpublished; the next relay publishes them again, and in the end
every outbox row is in its tenant's feed once and reached each consumer at least once, once
per its dedupe key (``eventId``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import text
from support import published

from runcontrol import reconcilers
from runcontrol.store import Database

NOW = datetime(2026, 6, 1, tzinfo=UTC)


class Consumer:
    """A sink that keeps every event it is given, and de-duplicates on ``eventId``."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []

    def publish(self, events: Sequence[dict[str, Any]]) -> None:
        self.received.extend(events)

    def by_key(self) -> dict[str, list[dict[str, Any]]]:
        keyed: dict[str, list[dict[str, Any]]] = {}
        for event in self.received:
            keyed.setdefault(str(event["eventId"]), []).append(event)
        return keyed


class Failing:
    def __init__(self, failures: int) -> None:
        self.failures = failures

    def publish(self, events: Sequence[dict[str, Any]]) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the broker is down")


def feed_positions(db: Database, run_ids: list[UUID]) -> list[str]:
    """The runs' events in the feed (each once: ``event_feed``, the pages' events, 0039)."""
    with db.system_tx() as conn:
        return [
            str(e)
            for e in conn.execute(
                text("SELECT event_id FROM event_feed WHERE run_id = ANY(:ids)"), {"ids": run_ids}
            ).scalars()
        ]


def relay_all(db: Database, sinks: Sequence[Any]) -> None:
    while reconcilers.relay_outbox(db, sinks, NOW).published:
        pass


def assert_delivered_once_per_key(consumer: Consumer, rows: dict[str, Any]) -> None:
    keyed = {k: v for k, v in consumer.by_key().items() if k in rows}
    assert set(keyed) == set(rows), "an outbox row never reached the consumer"
    for copies in keyed.values():  # a redelivery is the same event, never a different one
        assert all(c == copies[0] for c in copies), copies


def test_a_failing_sink_leaves_the_rows_unpublished_until_a_relay_delivers_them(
    db, tenant, make_leased_run
):
    relay_all(db, [Consumer()])  # what other tests left, out of the way
    run_ids = [make_leased_run(tenant).run_id for _ in range(3)]
    rows = published(db, run_ids)
    assert rows and all(v is None for v in rows.values())
    consumer, broker = Consumer(), Failing(failures=2)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            reconcilers.relay_outbox(db, [consumer, broker], NOW)
        # The consumer was given the batch, and yet nothing is published: not proof.
        assert all(v is None for v in published(db, run_ids).values())
        assert not feed_positions(db, run_ids)

    relay_all(db, [consumer, broker])
    after = published(db, run_ids)
    assert all(v is not None for v in after.values()), "a row was never marked published"
    assert_delivered_once_per_key(consumer, after)
    assert sorted(feed_positions(db, run_ids)) == sorted(after), "one feed row per event"
    assert len(consumer.by_key()[next(iter(after))]) == 3  # twice in failed passes, once after


RELAY_THEN_DIE = textwrap.dedent(
    """
    import json, os, signal, sys
    from datetime import datetime, UTC
    from runcontrol import reconcilers
    from runcontrol.store import Database

    class DieAfterPublishing:
        def publish(self, events):
            with open(sys.argv[2], "a", encoding="utf-8") as fh:
                for e in events:
                    fh.write(json.dumps(e, default=str, sort_keys=True) + "\\n")
            os.kill(os.getpid(), signal.SIGKILL)  # after the sink, before the floor commits

    reconcilers.relay_outbox(Database(sys.argv[1]), [DieAfterPublishing()], datetime.now(UTC))
    """
)


def test_a_relay_killed_between_publishing_and_marking_publishes_again(
    db, tenant, make_leased_run, tmp_path: Path
):
    relay_all(db, [Consumer()])
    run_ids = [make_leased_run(tenant).run_id for _ in range(2)]
    rows = published(db, run_ids)
    assert rows and all(v is None for v in rows.values())
    delivered = tmp_path / "delivered.jsonl"
    killed = subprocess.run(
        [sys.executable, "-c", RELAY_THEN_DIE, db.owner_url, str(delivered)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr  # killed inside the window, for real
    first = [json.loads(line) for line in delivered.read_text().splitlines()]
    assert {e["eventId"] for e in first} >= set(rows), "the killed relay published them"
    assert all(v is None for v in published(db, run_ids).values()), "marked: not killed?"
    assert not feed_positions(db, run_ids)

    consumer = Consumer()
    consumer.received.extend(first)  # what the consumer got from the relay that died
    relay_all(db, [consumer])
    after = published(db, run_ids)
    assert all(v is not None for v in after.values())
    assert_delivered_once_per_key(_normalised(consumer), after)
    assert sorted(feed_positions(db, run_ids)) == sorted(after)


def _normalised(consumer: Consumer) -> Consumer:
    """Events compared as JSON (the killed relay's copies went through a file)."""
    out = Consumer()
    out.received = [
        json.loads(json.dumps(e, default=str, sort_keys=True)) for e in consumer.received
    ]
    return out
