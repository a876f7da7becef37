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
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class GaugeSample:
    """What the scheduler's gauges show, read in one transaction: non-terminal runs by
    (tenant, state); per tenant, pending approvals and the oldest one's age (s); committed
    events not yet published and the oldest one's age (s, 0 when none); per (tenant, agent),
    dispatched attempts no worker takes (``queries.stalled_attempts``)."""

    runs_active: dict[tuple[str, str], int]
    approvals_pending: dict[str, tuple[int, float]]
    outbox_unpublished: int
    outbox_oldest_age: float
    stalled: dict[tuple[str, str], int] = field(default_factory=dict)


def sample_gauges(db: Database, now: datetime, stall_seconds: float | None = None) -> GaugeSample:
    with db.system_tx() as conn:
        pending = q.pending_approvals_by_tenant(conn)
        unpublished, oldest = q.unpublished_backlog(conn)
        runs_active = q.active_run_counts(conn)
        stalled = (
            {}
            if stall_seconds is None
            else {(t, a): n for t, a, n, _ in q.stalled_attempts(conn, now, stall_seconds)}
        )

    def age(since: datetime | None) -> float:
        return 0.0 if since is None else max((now - since).total_seconds(), 0.0)

    return GaugeSample(
        runs_active,
        {tenant: (n, age(first)) for tenant, (n, first) in pending.items()},
        unpublished,
        age(oldest),
        stalled,
    )


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
    lags: tuple[float, ...] = ()  # commit-to-publication of each event published (s)


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
    lags = tuple(max((now - r["occurred_at"]).total_seconds(), 0.0) for r in rows)
    return RelayReport(len(rows), max(lags), lags)


def retention(
    db: Database,
    now: datetime,
    journal_days: int,
    outbox_days: int = 90,
    answer_hours: float = 24,
) -> int:
    """Drop journal entries past retention (through the sanctioned purge function), published
    events past the event history's (their feed rows and webhook deliveries go with them) and
    results with them (the run keeps its result's hash and size), and command answers past the
    resend window."""
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
            text("DELETE FROM attempt_results WHERE created_at < :cutoff"),
            {"cutoff": now - timedelta(days=outbox_days)},
        )
        conn.execute(
            text("DELETE FROM command_answers WHERE created_at < :cutoff"),
            {"cutoff": now - timedelta(hours=answer_hours)},
        )
    return removed
