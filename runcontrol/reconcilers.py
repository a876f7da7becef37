"""Reconcilers: idempotent functions of (store, clock) that say which grains must wake.

The scheduler only calls them and delivers the wakes. Two schedulers running at once are safe:
only the one holding the ``SchedulerLock`` (a Postgres advisory lock) runs its jobs, and a wake
is idempotent anyway (the grain re-checks what is due under its own version guard).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import psycopg
from sqlalchemy import text

from .domain import Options
from .store import Database, rates
from .store import queries as q
from .store import webhooks as feed
from .store.commit import EVENTS_CHANNEL
from .store.notify import Listener, libpq_url

log = logging.getLogger(__name__)


# NOTIFYed by a statement that makes a run's reminder near (migration 0020).
DUE_CHANNEL = "runcontrol_due"
SCHEDULER_LOCK = zlib.crc32(b"runcontrol:scheduler")


class SchedulerLock:
    """The one lock that makes a scheduler the active one: a session-level advisory lock on a
    connection of its own, taken once and held as long as that connection lives (a transaction
    per job per tick cost 14% of the scheduler's CPU, issue 24). ``held()`` says whether this
    scheduler may run its jobs: the lock is proven held by a round trip on its connection at
    most once per ``verify_s`` (``SELECT 1``: the session, and so its lock, is still there);
    after a lost connection (the database restarted, the backend was terminated) the next
    proof reconnects and tries to take it again. A second scheduler's ``held()`` stays False,
    trying again at most once per ``verify_s``, until the first one's connection ends (the
    process died, ``close``): two schedulers never run jobs at once, except for at most
    ``verify_s`` after the holder's connection was cut while its jobs went on."""

    def __init__(
        self, url: str, *, verify_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._url = libpq_url(url)
        self._verify_s = verify_s
        self._clock = clock
        self._conn: psycopg.Connection[Any] | None = None
        self._mine = False
        self._asked_at: float | None = None  # when the database last answered or refused
        self._mutex = threading.Lock()  # jobs ask from their threads

    def held(self) -> bool:
        with self._mutex:
            now = self._clock()
            if self._asked_at is not None and now - self._asked_at < self._verify_s:
                return self._mine
            self._asked_at = now
            try:
                if self._conn is None or self._conn.closed:
                    self._mine = False
                    self._conn = psycopg.connect(
                        self._url,
                        autocommit=True,
                        application_name="runcontrol-scheduler-lock",
                        connect_timeout=5,
                        keepalives=1,
                        keepalives_idle=30,
                        keepalives_interval=10,
                        keepalives_count=3,
                    )
                if self._mine:
                    self._conn.execute("SELECT 1")
                else:
                    row = self._conn.execute(
                        "SELECT pg_try_advisory_lock(%s)", (SCHEDULER_LOCK,)
                    ).fetchone()
                    self._mine = bool(row and row[0])
            except psycopg.Error:
                log.warning("the scheduler lock's connection failed; taking it again")
                self._drop()
            return self._mine

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn, self._mine = None, False

    def close(self) -> None:
        """Give the lock up at once (then end its connection): another scheduler may take it."""
        with self._mutex:
            if self._mine and self._conn is not None:
                with contextlib.suppress(psycopg.Error):
                    self._conn.execute("SELECT pg_advisory_unlock(%s)", (SCHEDULER_LOCK,))
            self._drop()
            self._asked_at = None


def lease_expiries(db: Database, now: datetime, options: Options) -> list[q.RunKey]:
    """LeaseExpiryReconciler: runs with a lease past expiresAt + RenewalGraceSeconds."""
    with db.system_tx() as conn:
        return q.expired_leases(conn, now, options.renewal_grace_seconds)


def approval_expiries(db: Database, now: datetime) -> list[q.RunKey]:
    """ApprovalExpiryReconciler: runs with a Pending approval past expiresAt."""
    with db.system_tx() as conn:
        return q.expired_approvals(conn, now)


@dataclass(frozen=True)
class DueRuns:
    """What a dispatch sweep found: the runs whose reminder has come, and the earliest reminder
    still ahead (None when no run has one)."""

    keys: list[q.RunKey]
    next_at: datetime | None


def due_dispatches(db: Database, now: datetime) -> DueRuns:
    """RunDispatcher sweep: runs whose reminder is due (Accepted, retry backoff over, ...)."""
    with db.system_tx() as conn:
        return DueRuns(q.due_runs(conn, now), q.next_due_after(conn, now))


class DispatchSignal:
    """When the dispatch sweep runs next (issue 24: not after every commit's events NOTIFY).

    - A statement that makes a reminder near NOTIFYs ``DUE_CHANNEL`` (migration 0020's
      trigger on ``runs.next_due_at``): the sweep runs at once.
    - The earliest reminder ahead, as the last sweep found it: the sweep runs when it comes.
    - While the last sweep found runs due (a run its wake left due: a dispatch past the
      tenant's capacity cap waits for another run's attempt to end), every commit's events
      NOTIFY, as before: ``events`` listens only then (``Listener(idle_s=...)``).
    - At the latest after ``interval_s`` (the periodic sweep stays the backstop).
    """

    def __init__(
        self,
        due: Listener,
        events: Listener,
        now: Callable[[], datetime],
        interval_s: float,
    ) -> None:
        self._due = due
        self._events = events
        self._now = now
        self._interval_s = interval_s
        self._watch_events = False
        self._next_at: datetime | None = None

    def observe(self, found: DueRuns) -> None:
        self._watch_events = bool(found.keys)
        self._next_at = found.next_at

    def mark(self) -> tuple[int, int]:
        """Taken before a sweep reads: a signal sent after it is never missed."""
        return (
            self._due.generation(DUE_CHANNEL, ()),
            self._events.generation(EVENTS_CHANNEL, ()),
        )

    async def wait(self, mark: tuple[int, int]) -> None:
        timeout = self._interval_s
        if self._next_at is not None:
            ahead = (self._next_at - self._now()).total_seconds()
            timeout = min(timeout, max(ahead, 0.0))
        waits = [self._due.wait(DUE_CHANNEL, (), mark[0], timeout)]
        if self._watch_events:
            waits.append(self._events.wait(EVENTS_CHANNEL, (), mark[1], timeout))
        tasks = [asyncio.ensure_future(w) for w in waits]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True)
class GaugeSample:
    """What the scheduler's gauges show, read in one transaction: non-terminal runs by
    (tenant, state); per tenant, pending approvals and the oldest one's age (s); committed
    events not yet published and the oldest one's age (s, 0 when none); per (tenant, agent),
    dispatched attempts no worker takes (``queries.stalled_attempts``); per (tenant, kind,
    name), the runs held for a concurrency slot and the oldest one's age (s, issue 21)."""

    runs_active: dict[tuple[str, str], int]
    approvals_pending: dict[str, tuple[int, float]]
    outbox_unpublished: int
    outbox_oldest_age: float
    stalled: dict[tuple[str, str], int] = field(default_factory=dict)
    flow_waiting: dict[tuple[str, str, str], tuple[int, float]] = field(default_factory=dict)
    held: dict[tuple[str, str], int] = field(default_factory=dict)  # (tenant, kind): steps
    rate_tokens: dict[tuple[str, str], float] = field(default_factory=dict)  # (tenant, bucket)


def sample_gauges(db: Database, now: datetime, stall_seconds: float | None = None) -> GaugeSample:
    with db.system_tx() as conn:
        pending = q.pending_approvals_by_tenant(conn)
        unpublished, oldest = q.unpublished_backlog(conn)
        runs_active = q.active_run_counts(conn)
        held = q.held_steps(conn)
        tokens = {(b.tenant_id, b.bucket): b.tokens for b in rates.bucket_states(conn, now)}
        stalled = (
            {}
            if stall_seconds is None
            else {(t, a): n for t, a, n, _ in q.stalled_attempts(conn, now, stall_seconds)}
        )
        flow_waiting = q.flow_backlog(conn, now)

    def age(since: datetime | None) -> float:
        return 0.0 if since is None else max((now - since).total_seconds(), 0.0)

    return GaugeSample(
        runs_active,
        {tenant: (n, age(first)) for tenant, (n, first) in pending.items()},
        unpublished,
        age(oldest),
        stalled,
        flow_waiting,
        held,
        tokens,
    )


class Sink(Protocol):
    """Where the outbox relay publishes committed events (a broker, a log, a webhook). A sink
    with an ``active`` attribute that is false is skipped (the relay then renders no events
    for it)."""

    def publish(self, events: Sequence[dict[str, Any]]) -> None: ...


class LogSink:
    def __init__(self) -> None:
        self._log = logging.getLogger("runcontrol.events")

    @property
    def active(self) -> bool:
        """Whether its lines would be logged (``runcontrol.events`` at INFO)."""
        return self._log.isEnabledFor(logging.INFO)

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
    behind: bool = False  # the floor stopped below ids already handed out (a mark waits)


RELAY_BATCH = 500  # events a relay pass publishes at most


def relay_outbox(
    db: Database, sinks: Sequence[Sink], now: datetime, batch: int = RELAY_BATCH
) -> RelayReport:
    """Publish committed outbox rows in commit order (so per run in seq order) without updating
    them (0039): the rows past the relay's floor whose ids are settled
    (``queries.take_published``), given to the sinks, then written into their tenants' feeds as
    one page per tenant with their webhook deliveries (``store.webhooks.publish``), then the
    floor recorded (one row per database, ``relay_state``). Five statements a pass, whatever its
    size, under the feed lock.
    At-least-once: the floor moves only after every sink took the batch, so a sink that fails
    or a crash between publishing and committing republishes it, and consumers de-duplicate on
    eventId.
    """
    readers = [s for s in sinks if getattr(s, "active", True)]
    with db.system_tx() as conn:
        take = q.take_published(conn, feed.FEED_LOCK, batch, whole=bool(readers))
        rows = take.rows
        if rows:
            if readers:  # rendered only for a sink that reads them (a fifth of the relay's CPU)
                events = [q.event_view(r) for r in rows]
                for sink in readers:
                    sink.publish(events)
            feed.publish(conn, rows, now)
        q.advance(conn, take, now)
    behind = take.then.mark is not None
    if not rows:
        return RelayReport(0, 0.0, behind=behind)
    lags = tuple(max((now - r["occurred_at"]).total_seconds(), 0.0) for r in rows)
    return RelayReport(len(rows), max(lags), lags, behind)


# How long a tick's relay waits, once, for the transactions in flight at its pass to end, when
# its floor stopped below ids already handed out (a busy database: they are group commits of a
# few milliseconds); else what they commit waits for the next tick (0039).
RELAY_SETTLE_S = 0.05


def relay_backlog(
    db: Database,
    sinks: Sequence[Sink],
    clock: Callable[[], datetime],
    batch: int = RELAY_BATCH,
    settle_s: float = RELAY_SETTLE_S,
) -> RelayReport:
    """Relay passes (``relay_outbox``, each its own transaction) until one publishes less than
    a full batch. One pass a tick capped the relay at a batch a second (500 events, ~38 runs of
    13 events): measured at 113 runs/s (issue 33), events were published ever later. A pass
    left behind by transactions in flight is followed, once, by another ``settle_s`` later."""
    published, lags, settled = 0, list[float](), False
    while True:
        report = relay_outbox(db, sinks, clock(), batch)
        published += report.published
        lags.extend(report.lags)
        if report.published == batch:
            continue
        if report.behind and not settled:
            settled = True
            time.sleep(settle_s)
            continue
        return RelayReport(published, max(lags, default=0.0), tuple(lags))


# An event row published before the events' horizon (0039: in a feed page of then).
_PAST = "o.id IN (SELECT unnest(ids) FROM feed_pages WHERE published_at < :cutoff)"


def retention(
    db: Database,
    now: datetime,
    journal_days: int,
    outbox_days: int = 90,
    answer_hours: float = 24,
) -> int:
    """Drop journal entries past retention (through the sanctioned purge function: the event
    rows carrying them), published events past the event history's (their webhook
    deliveries go with them; a row carrying journal entries keeps them, its payload NULL) and
    results, journaled calls and streamed output with them (the run keeps its result's hash and
    size), and command answers past the resend window."""
    with db.system_tx() as conn:
        removed = int(
            conn.execute(
                text("SELECT runcontrol_purge_journal(:cutoff)"),
                {"cutoff": now - timedelta(days=journal_days)},
            ).scalar()
            or 0
        )
        history = now - timedelta(days=outbox_days)
        # An event row carrying journal entries (0033) keeps them to the journal's horizon:
        # only its payload goes here (with its deliveries, as every event's); the others go
        # whole.
        # A tenant's newest feed page stays (0039): its positions go on from it.
        for statement in (
            f"DELETE FROM webhook_deliveries d USING outbox o WHERE {_PAST} AND o.run_id = d.run_id"
            " AND o.seq = d.seq",
            f"DELETE FROM outbox o WHERE {_PAST} AND journal IS NULL",
            f"UPDATE outbox o SET payload = NULL WHERE {_PAST}"
            " AND journal IS NOT NULL AND payload IS NOT NULL",
            "DELETE FROM feed_pages p WHERE published_at < :cutoff AND EXISTS (SELECT 1"
            " FROM feed_pages n WHERE n.tenant_id = p.tenant_id"
            " AND n.first_position > p.first_position)",
        ):
            conn.execute(text(statement), {"cutoff": history})
        for table, column, cutoff in (
            ("attempt_results", "created_at", history),
            ("output_chunks", "written_at", history),  # streamed output
            ("output_heads", "updated_at", history),
            ("journaled_calls", "recorded_at", history),
            ("command_answers", "created_at", now - timedelta(hours=answer_hours)),
        ):
            conn.execute(text(f"DELETE FROM {table} WHERE {column} < :cutoff"), {"cutoff": cutoff})
    return removed
