"""Reconcilers: idempotent functions of (store, clock) that say which grains must wake.

The scheduler only calls them and delivers the wakes. Two schedulers running at once are safe:
each job holds a Postgres advisory lock while it runs, and a wake is idempotent anyway (the grain
re-checks what is due under its own version guard).
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import text

from .domain import Options
from .store import Database
from .store import queries as q
from .store import webhooks as feed

log = logging.getLogger(__name__)


@contextmanager
def job_lock(db: Database, job: str) -> Iterator[bool]:
    """Hold a session advisory lock for ``job``; yields False if another scheduler holds it."""
    key = zlib.crc32(f"runcontrol:{job}".encode())
    with db.system.connect() as conn:
        got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())
        conn.commit()
        try:
            yield got
        finally:
            if got:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()


def lease_expiries(db: Database, now: datetime, options: Options) -> list[q.RunKey]:
    """LeaseExpiryReconciler: runs with a lease past expiresAt + RenewalGraceSeconds."""
    with db.system_tx() as conn:
        return q.expired_leases(conn, now, options.renewal_grace_seconds)


def approval_expiries(db: Database, now: datetime) -> list[q.RunKey]:
    """ApprovalExpiryReconciler: runs with a Pending approval past expiresAt."""
    with db.system_tx() as conn:
        return q.expired_approvals(conn, now)


def due_dispatches(db: Database, now: datetime) -> list[q.RunKey]:
    """RunDispatcher sweep: runs whose reminder is due (Accepted, retry backoff over, ...)."""
    with db.system_tx() as conn:
        return q.due_runs(conn, now)


def active_runs(db: Database) -> dict[tuple[str, str], int]:
    """Non-terminal runs by (tenant, state), for the runs.active gauge."""
    with db.system_tx() as conn:
        return q.active_run_counts(conn)


class Sink(Protocol):
    """Where the outbox relay publishes committed events (a broker, a log, a webhook)."""

    def publish(self, events: Sequence[dict[str, Any]]) -> None: ...


class LogSink:
    def __init__(self) -> None:
        self._log = logging.getLogger("runcontrol.events")

    def publish(self, events: Sequence[dict[str, Any]]) -> None:
        for e in events:
            # Envelope only: payloads may carry artifact references that do not belong in logs.
            self._log.info("%s run=%s seq=%s", e["type"], e["runId"], e["seq"])


class JsonLinesSink:
    def __init__(self, path: str) -> None:
        self._path = path

    def publish(self, events: Sequence[dict[str, Any]]) -> None:
        with open(self._path, "a", encoding="utf-8") as fh:
            for e in events:
                fh.write(json.dumps(e, sort_keys=True) + "\n")


@dataclass(frozen=True)
class RelayReport:
    published: int
    max_lag_seconds: float


def relay_outbox(
    db: Database, sinks: Sequence[Sink], now: datetime, batch: int = 500
) -> RelayReport:
    """Publish committed outbox rows in commit order (so per run in seq order), then mark them.

    Marking gives each event its tenant feed position and queues its webhook deliveries in
    the same transaction (``store.webhooks.publish``; the delivery job sends them).
    At-least-once: a crash between publishing and marking republishes the batch, and consumers
    de-duplicate on eventId. Rows locked by another relay are skipped.
    """
    with db.system_tx() as conn:
        rows = q.unpublished(conn, batch)
        if not rows:
            return RelayReport(0, 0.0)
        events = [q.event_view(r) for r in rows]
        for sink in sinks:
            sink.publish(events)
        q.mark_published(conn, [r["id"] for r in rows], now)
        feed.publish(conn, rows, now)
    lag = max((now - r["occurred_at"]).total_seconds() for r in rows)
    return RelayReport(len(rows), max(lag, 0.0))


def retention(
    db: Database,
    now: datetime,
    journal_days: int,
    outbox_days: int = 90,
    answer_hours: float = 24,
) -> int:
    """Drop journal entries past retention (through the sanctioned purge function), published
    events past the event history's (their feed rows and webhook deliveries go with them), and
    command answers past the resend window."""
    with db.system_tx() as conn:
        removed = int(
            conn.execute(
                text("SELECT runcontrol_purge_journal(:cutoff)"),
                {"cutoff": now - timedelta(days=journal_days)},
            ).scalar()
            or 0
        )
        conn.execute(
            text("DELETE FROM outbox WHERE published_at IS NOT NULL AND published_at < :cutoff"),
            {"cutoff": now - timedelta(days=outbox_days)},
        )
        conn.execute(
            text("DELETE FROM command_answers WHERE created_at < :cutoff"),
            {"cutoff": now - timedelta(hours=answer_hours)},
        )
    return removed
