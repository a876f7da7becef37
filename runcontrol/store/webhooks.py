"""The tenant-wide event feed and webhook subscriptions and deliveries (migration 0010).

Positions (0039): a relay pass writes the events it publishes into their tenants' feeds as one
page per tenant (``feed_pages``: the events' ids in publication order), the event at
``ids[i]`` at position ``first_position + i - 1``, the page starting after the tenant's last
one: a tenant's positions are its own, gap-free, and move with it. The pass holds a
transaction-level advisory lock (``FEED_LOCK``) until it commits, so a reader that sees
position p has seen every smaller one. Creating a subscription takes the same lock, so it
starts exactly after the last position committed before it and receives every one after
(nothing published meanwhile is missed). A webhook delivery names its event by position and
by ``(run_id, seq)``, which is how it is read.

Tenant-scoped functions run on ``Database.tenant()`` connections; ``publish`` and the delivery
job's functions on the system path.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Integer,
    Text,
    column,
    func,
    insert,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ..domain.webhooks import DeliveryState
from .queries.views import EVENT_HELD, EVENT_ROW, api_view, event_view, render
from .tables import TZ, outbox, webhook_deliveries, webhook_subscriptions

FEED_CHANNEL = "runcontrol_feed"  # NOTIFY payload: the tenant id whose feed grew
FEED_LOCK = zlib.crc32(b"runcontrol:event-feed")

SUBSCRIPTION = api_view(c for c in webhook_subscriptions.c.keys() if c != "secret")
NEVER = 2**63 - 1  # the ``starts_after`` of a run's subscription: no tenant-wide event


@dataclass(frozen=True, slots=True)
class RunScope:
    """What a run's subscription receives: the run's events of ``event_types``, rendered by
    the delivery job's ``format`` (``runcontrol.webhooks.Deliverer.formats``)."""

    run_id: UUID
    event_types: tuple[str, ...]
    format: str


DELIVERY = api_view(webhook_deliveries.c.keys())
_PENDING = DeliveryState.PENDING.value


def lock_feed(conn: Connection) -> None:
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": FEED_LOCK})


# A delivery queued afresh: the columns it sets, in the order ``_queue`` selects them.
_QUEUED = (
    "subscription_id",
    "position",
    "tenant_id",
    "run_id",
    "seq",
    "state",
    "attempts",
    "next_attempt_at",
    "updated_at",
)


# ---------------------------------------------------------------------- the relay (system)


# One statement per relay batch (issue 24): the published events' pages, one per tenant (0039;
# positions from the tenant's last page on, in id order), each event's pending delivery to
# every active subscription of its tenant that starts before it and to every active
# subscription of its run that takes its type (0028), and one NOTIFY per tenant.
_PUBLISH = text(
    """
    WITH taken AS (
        SELECT id, tenant_id, run_id, seq, event_type,
               row_number() OVER (PARTITION BY tenant_id ORDER BY id) AS n
        FROM outbox WHERE id = ANY(CAST(:ids AS bigint[]))
    ), heads AS (
        SELECT t.tenant_id,
               coalesce((SELECT p.first_position + cardinality(p.ids) - 1 FROM feed_pages p
                         WHERE p.tenant_id = t.tenant_id
                         ORDER BY p.first_position DESC LIMIT 1), 0) AS head
        FROM (SELECT DISTINCT tenant_id FROM taken) t
    ), fed AS (
        SELECT taken.*, heads.head + taken.n AS position FROM taken JOIN heads USING (tenant_id)
    ), paged AS (
        INSERT INTO feed_pages (tenant_id, first_position, ids, published_at)
        SELECT tenant_id, min(position), array_agg(id ORDER BY id), :now FROM fed
        GROUP BY tenant_id
    ), queued AS (
        INSERT INTO webhook_deliveries (subscription_id, position, tenant_id, run_id, seq,
                                        state, attempts, next_attempt_at, updated_at)
        SELECT s.subscription_id, fed.position, fed.tenant_id, fed.run_id, fed.seq,
               :pending, 0, :now, :now
        FROM fed JOIN webhook_subscriptions s
            ON s.tenant_id = fed.tenant_id AND fed.position > s.starts_after
        WHERE s.disabled_at IS NULL AND s.run_id IS NULL
        UNION ALL
        SELECT s.subscription_id, fed.position, fed.tenant_id, fed.run_id, fed.seq,
               :pending, 0, :now, :now
        FROM fed JOIN webhook_subscriptions s
            ON s.run_id = fed.run_id AND s.tenant_id = fed.tenant_id
        WHERE s.disabled_at IS NULL
          AND (s.event_types IS NULL OR fed.event_type = ANY(s.event_types))
    )
    SELECT tenant_id, count(*) AS events, pg_notify(:channel, tenant_id)
    FROM fed GROUP BY tenant_id
    """
)


def publish(conn: Connection, events: Sequence[dict[str, Any]], now: datetime) -> dict[str, int]:
    """Write ``events`` (outbox rows the relay's take published, oldest first) into their
    tenants' feeds, queue one delivery of each per active subscription of their tenant, and
    notify each tenant's feed: one statement (``_PUBLISH``), under the feed lock the take was
    made under. Answers how many events each tenant's feed gained. In the caller's
    transaction: all of it commits with the relay's floor or none does."""
    if not events:
        return {}
    found = conn.execute(
        _PUBLISH,
        {
            "ids": [int(e["id"]) for e in events],
            "now": now,
            "pending": _PENDING,
            "channel": FEED_CHANNEL,
        },
    )
    return {r.tenant_id: int(r.events) for r in found}


# ---------------------------------------------------------------------- the feed (tenant)

# The tenant's feed past position ``:after`` (row-level security keeps it to the tenant's pages
# and events): from the page that holds ``:after + 1`` on (``{pages}``: at most so many pages),
# each event with its position, then ``{where}``. An event the events' retention removed is
# not there (its position is not reused).
_FEED = """
SELECT {columns}, p.first_position + u.n - 1 AS position
FROM (SELECT first_position, ids FROM feed_pages
      WHERE first_position >= coalesce(
          (SELECT max(first_position) FROM feed_pages WHERE first_position <= :after), 0)
      ORDER BY first_position {pages}) p
CROSS JOIN LATERAL unnest(p.ids) WITH ORDINALITY AS u(id, n)
JOIN outbox o ON o.id = u.id
WHERE p.first_position + u.n - 1 > :after {where}
"""


def feed_after(conn: Connection, after: int, limit: int) -> list[dict[str, Any]]:
    """The tenant's published events after feed position ``after``, in position order, each an
    event envelope plus its ``position``. Project scope is row-level security's (0010). Reads
    at most ``limit + 1`` pages (a page holds one event at least)."""
    columns = ", ".join(f"o.{c.name}" for c in EVENT_ROW)
    query = _FEED.format(columns=columns, pages="LIMIT :pages", where="AND o.payload IS NOT NULL")
    rows = conn.execute(
        text(query + " ORDER BY position LIMIT :limit"),
        {"after": after, "pages": limit + 1, "limit": limit},
    )
    return [{**event_view(r._mapping), "position": r.position} for r in rows]


def feed_head(conn: Connection) -> int:
    """The tenant's last feed position (0: none yet)."""
    last = conn.execute(
        text(
            "SELECT first_position + cardinality(ids) - 1 FROM feed_pages"
            " ORDER BY first_position DESC LIMIT 1"
        )
    )
    return int(last.scalar() or 0)


# ---------------------------------------------------------------------- subscriptions (tenant)


def subscription_view(m: Any) -> dict[str, Any]:
    return render(m, SUBSCRIPTION)


def create_subscription(
    conn: Connection,
    *,
    subscription_id: UUID,
    tenant_id: str,
    url: str,
    secret: str,
    description: str | None,
    max_attempts: int,
    created_by: str,
    now: datetime,
    run: RunScope | None = None,
) -> dict[str, Any]:
    """A subscription to every event of the tenant published from now on, or with ``run``
    to that run's events of its types, rendered in its format: those published from now on,
    and the newest one already published (so it learns the run's state at once)."""
    lock_feed(conn)  # starts after every position committed so far, misses none after
    if run is None:
        scope: dict[str, Any] = {"starts_after": feed_head(conn)}
    else:  # never a tenant-wide one, for any relay (the previous release's too: 0028)
        scope = {
            "starts_after": NEVER,
            "run_id": run.run_id,
            "event_types": list(run.event_types),
            "format": run.format,
        }
    row = conn.execute(
        insert(webhook_subscriptions)
        .values(
            subscription_id=subscription_id,
            tenant_id=tenant_id,
            url=url,
            secret=secret,
            description=description,
            max_attempts=max_attempts,
            created_by=created_by,
            created_at=now,
            **scope,
        )
        .returning(webhook_subscriptions)
    ).one()
    if run is not None:
        newest = _RUN_FEED + " ORDER BY position DESC LIMIT 1"
        _queue(conn, subscription_id, newest, _run_params(run.run_id, run.event_types, 0), now)
    return subscription_view(row._mapping)


# The feed positions of a run's published events of ``:types`` (each found in its page: the
# newest pages first, where a recent run's are).
_RUN_FEED = """
SELECT o.tenant_id, o.run_id, o.seq, at.position FROM outbox o
CROSS JOIN LATERAL (
    SELECT p.first_position + array_position(p.ids, o.id) - 1 AS position FROM feed_pages p
    WHERE o.id = ANY(p.ids) ORDER BY p.first_position DESC LIMIT 1
) at
WHERE o.run_id = :run AND o.event_type = ANY(:types) AND at.position > :after
"""


def _run_params(run_id: UUID, event_types: Sequence[str], after: int) -> dict[str, Any]:
    return {"run": run_id, "types": list(event_types), "after": after}


def _queue(
    conn: Connection, subscription_id: UUID, feed: str, params: dict[str, Any], now: datetime
) -> int:
    """Queue (again) the events ``feed`` selects (a query answering their tenant, run, seq and
    position) for the subscription: delivered and dead-lettered ones start over, missing ones
    are added. Answers how many were queued."""
    d = webhook_deliveries
    rows = select(
        literal(subscription_id, PG_UUID(as_uuid=True)),
        column("position", BigInteger),
        column("tenant_id", Text),
        column("run_id", PG_UUID(as_uuid=True)),
        column("seq", BigInteger),
        literal(_PENDING, Text),
        literal(0, Integer),
        literal(now, TZ),
        literal(now, TZ),
    ).select_from(text(f"({feed}) AS f"))
    stmt = pg_insert(d).from_select(_QUEUED, rows)
    stmt = stmt.on_conflict_do_update(
        index_elements=[d.c.subscription_id, d.c.position],
        set_={
            "state": _PENDING,
            "attempts": 0,
            "next_attempt_at": stmt.excluded.next_attempt_at,
            "last_status": None,
            "last_error": None,
            "delivered_at": None,
            "updated_at": stmt.excluded.updated_at,
        },
    )
    return len(conn.execute(stmt.returning(d.c.position), params).all())


def get_subscription(conn: Connection, subscription_id: UUID) -> dict[str, Any] | None:
    """The subscription with its delivery counts by state; None if not in this tenant."""
    row = conn.execute(
        select(webhook_subscriptions).where(
            webhook_subscriptions.c.subscription_id == subscription_id
        )
    ).first()
    if row is None:
        return None
    d = webhook_deliveries.c
    counts: dict[str, int] = dict(
        conn.execute(
            select(d.state, func.count())
            .where(d.subscription_id == subscription_id)
            .group_by(d.state)
        ).all()
    )
    view = subscription_view(row._mapping)
    view["deliveries"] = {
        _camel_state(state): int(counts.get(state.value, 0)) for state in DeliveryState
    }
    return view


def _camel_state(state: DeliveryState) -> str:
    return state.value[0].lower() + state.value[1:]


def list_subscriptions(conn: Connection) -> list[dict[str, Any]]:
    """The tenant-wide subscriptions (a run's, an A2A push config, is its task's)."""
    s = webhook_subscriptions
    rows = conn.execute(
        select(s).where(s.c.run_id.is_(None)).order_by(s.c.created_at, s.c.subscription_id)
    )
    return [subscription_view(r._mapping) for r in rows]


def disable_subscription(conn: Connection, subscription_id: UUID, now: datetime) -> bool:
    """Stop deliveries to the subscription (its rows stay for the record); False if unknown."""
    s = webhook_subscriptions
    found = conn.execute(
        update(s)
        .where(s.c.subscription_id == subscription_id)
        .values(disabled_at=func.coalesce(s.c.disabled_at, now))
    )
    return found.rowcount == 1


def list_deliveries(
    conn: Connection,
    subscription_id: UUID,
    *,
    states: Sequence[str] = (),
    after: int = 0,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """The subscription's deliveries after feed position ``after``, in position order."""
    d = webhook_deliveries
    at_event = (outbox.c.run_id == d.c.run_id) & (outbox.c.seq == d.c.seq)
    query = select(d, outbox.c.event_id, outbox.c.event_type).join(outbox, at_event)
    query = query.where(d.c.subscription_id == subscription_id, d.c.position > after)
    if states:
        query = query.where(d.c.state.in_(list(states)))
    rows = conn.execute(query.order_by(d.c.position).limit(limit))
    return [
        {
            **render(r._mapping, DELIVERY),
            "eventId": str(r.event_id),
            "type": r.event_type,
        }
        for r in rows
    ]


def redeliver(conn: Connection, subscription: dict[str, Any], after: int, now: datetime) -> int:
    """Queue again every retained event of the tenant (of a run's subscription: of its run
    and types) after feed position ``after`` for the subscription (its view): delivered and
    dead-lettered ones start over, missing ones are added (events from before the
    subscription existed too). Answers how many were queued."""
    subscription_id = UUID(str(subscription["subscriptionId"]))
    if subscription["runId"] is None:
        feed = _FEED.format(columns="o.tenant_id, o.run_id, o.seq", pages="", where="")
        return _queue(conn, subscription_id, feed, {"after": after}, now)
    run = _run_params(UUID(str(subscription["runId"])), subscription["eventTypes"] or (), after)
    return _queue(conn, subscription_id, _RUN_FEED, run, now)


# ---------------------------------------------------------------------- delivery (system)


def due_heads(conn: Connection, now: datetime, limit: int) -> list[dict[str, Any]]:
    """For each (active subscription, run), its first pending delivery in seq order, when it
    is due: a run's later events wait behind it (per-run order), other runs do not."""
    d, s = webhook_deliveries, webhook_subscriptions
    heads = (
        select(d)
        .where(d.c.state == _PENDING)
        .distinct(d.c.subscription_id, d.c.run_id)
        .order_by(d.c.subscription_id, d.c.run_id, d.c.seq)
        .subquery()
    )
    rows = conn.execute(
        select(heads, s.c.url, s.c.secret, s.c.max_attempts, s.c.format)
        .join(s, s.c.subscription_id == heads.c.subscription_id)
        .where(s.c.disabled_at.is_(None), heads.c.next_attempt_at <= now)
        .order_by(heads.c.next_attempt_at)
        .limit(limit)
    )
    return [dict(r._mapping) for r in rows]


def next_pending(conn: Connection, subscription_id: UUID, run_id: UUID) -> dict[str, Any] | None:
    """The (subscription, run)'s first pending delivery, due or not."""
    d, s = webhook_deliveries, webhook_subscriptions
    row = conn.execute(
        select(d, s.c.url, s.c.secret, s.c.max_attempts, s.c.format)
        .join(s, s.c.subscription_id == d.c.subscription_id)
        .where(
            d.c.subscription_id == subscription_id,
            d.c.run_id == run_id,
            d.c.state == _PENDING,
            s.c.disabled_at.is_(None),
        )
        .order_by(d.c.seq)
        .limit(1)
    ).first()
    return None if row is None else dict(row._mapping)


def _as_read(delivery: dict[str, Any]) -> tuple[ColumnElement[bool], ...]:
    """The guard of an update to a delivery row as it was read: still pending, at the same
    attempt (a redelivery in between resets it)."""
    d = webhook_deliveries.c
    return (
        d.subscription_id == delivery["subscription_id"],
        d.position == delivery["position"],
        d.state == _PENDING,
        d.attempts == delivery["attempts"],
    )


def claim(conn: Connection, delivery: dict[str, Any], until: datetime, now: datetime) -> bool:
    """Take the delivery for one attempt: a guarded UPDATE on what was read (a second
    delivery job, or a redelivery in between, makes it 0 rows and this one skips it)."""
    found = conn.execute(
        update(webhook_deliveries)
        .where(
            *_as_read(delivery),
            webhook_deliveries.c.next_attempt_at == delivery["next_attempt_at"],
        )
        .values(next_attempt_at=until, updated_at=now)
    )
    return found.rowcount == 1


def envelope(conn: Connection, delivery: dict[str, Any]) -> dict[str, Any] | None:
    """The event a delivery row sends (by its run and seq); None once the events' retention
    removed it."""
    o = outbox.c
    row = conn.execute(
        select(*EVENT_ROW).where(
            o.run_id == delivery["run_id"], o.seq == delivery["seq"], EVENT_HELD
        )
    ).first()
    return None if row is None else event_view(row._mapping)


def record(
    conn: Connection,
    delivery: dict[str, Any],
    *,
    state: DeliveryState,
    status: int | None,
    error: str | None,
    next_attempt_at: datetime,
    now: datetime,
) -> bool:
    """Record one attempt's result, unless a redelivery re-queued the row meanwhile."""
    found = conn.execute(
        update(webhook_deliveries)
        .where(*_as_read(delivery))
        .values(
            state=state.value,
            attempts=webhook_deliveries.c.attempts + 1,
            last_status=status,
            last_error=error,
            next_attempt_at=next_attempt_at,
            delivered_at=now if state is DeliveryState.DELIVERED else None,
            updated_at=now,
        )
    )
    return found.rowcount == 1
