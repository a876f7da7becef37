"""The outbox read: a run's events after a cursor (the SSE replay), the relay's take of the
unpublished ones, and their backlog."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import ColumnElement, Connection, Table, func, select, text

from ..tables import outbox
from .views import EVENT_HELD, EVENT_ROW, event_view


@dataclass(frozen=True, slots=True)
class RowsAfter:
    """The read of a run's rows of ``table`` whose ``cursor`` column is past ``after``, in its
    order, each as ``view`` shows it (a resumable stream's page: the events by seq, the output
    by position)."""

    table: Table
    cursor: str
    view: Callable[[Any], dict[str, Any]]

    held: ColumnElement[bool] | None = None  # which rows are still shown (all: None)
    columns: tuple[ColumnElement[Any], ...] = ()  # what is read of each (all: ())

    def __call__(
        self, conn: Connection, run_id: UUID, after: int, limit: int = 500
    ) -> list[dict[str, Any]]:
        column = self.table.c[self.cursor]
        query = select(*(self.columns or (self.table,)))
        query = query.where(self.table.c.run_id == run_id, column > after)
        if self.held is not None:
            query = query.where(self.held)
        rows = conn.execute(query.order_by(column).limit(limit))
        return [self.view(r._mapping) for r in rows]


# The run's committed events with seq > after, in order (the SSE replay cursor).
events_after = RowsAfter(outbox, "seq", event_view, EVENT_HELD, EVENT_ROW)


# The relay's take (issue 42): the oldest rows without a feed position, locked (a second
# relay skips them), numbered in id order from the feed's counter (drawn once for the batch),
# and marked published with their positions in one UPDATE: no feed row of their own.
_TAKE = """
WITH picked AS (
    SELECT id FROM outbox WHERE feed_position IS NULL AND id > :after
    ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED
), counted AS (
    SELECT count(*) AS n FROM picked
), drawn AS (  -- the batch's positions: the counter's next n values, gap-free
    SELECT CASE WHEN n = 0 THEN 0
                ELSE setval('feed_position_seq', nextval('feed_position_seq') + n - 1) - n
           END AS base
    FROM counted
), numbered AS (
    SELECT id, (SELECT base FROM drawn) + row_number() OVER (ORDER BY id) AS position
    FROM picked
)
UPDATE outbox SET published_at = :now, feed_position = numbered.position
FROM numbered WHERE outbox.id = numbered.id
RETURNING {columns}
"""


def take_unpublished(
    conn: Connection, now: datetime, limit: int = 500, *, whole: bool = True, after: int = 0
) -> list[dict[str, Any]]:
    """Publish the oldest unpublished outbox rows at ``now`` and answer them, oldest first:
    each marked published with its tenant feed position (in id order), in one ``UPDATE ...
    FROM (SELECT ... FOR UPDATE SKIP LOCKED) ... RETURNING``, so a second relay skips them.
    The caller holds the feed lock (``store.webhooks.lock_feed``) to its commit, so positions
    grow in commit order. The mark is the caller's transaction's: if it does not commit (a
    sink failed, the relay died after its sinks had the events) the rows stay unpublished and
    the next relay publishes them again (at-least-once). ``whole=False``: each row's ``id``
    and ``occurred_at`` only (what the feed and the lag need, when no sink reads events).
    ``after``: only rows past this id (``RelayFloor``: every row up to it is published)."""
    columns = EVENT_ROW if whole else (outbox.c.id, outbox.c.occurred_at)
    statement = text(_TAKE.format(columns=", ".join(f"outbox.{c.name}" for c in columns)))
    rows = conn.execute(statement.columns(*columns), {"after": after, "limit": limit, "now": now})
    return sorted((dict(r._mapping) for r in rows), key=lambda r: int(r["id"]))


def settled_floor(conn: Connection, after: int, settled: int) -> int:
    """The largest id up to ``settled`` (ids at or below it all committed or aborted) below
    which no row is unpublished, past ``after``: in the caller's transaction, after its marks."""
    first = conn.execute(
        select(func.min(outbox.c.id)).where(
            outbox.c.feed_position.is_(None), outbox.c.id > after, outbox.c.id <= settled
        )
    ).scalar()
    return settled if first is None else int(first) - 1


def sequence_mark(conn: Connection) -> tuple[int, int, int]:
    """The last outbox id handed out (0: none yet), then (in a later statement, so a later
    snapshot) the snapshot's xmin and xmax: every transaction that drew an id up to the first
    had its xid before the third. Holds for a sequence without a cache (``CACHE 1``, the
    BIGSERIAL default): a cache hands out values below ``last_value`` later."""
    drawn = int(
        conn.execute(
            text(
                "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END"
                " FROM outbox_id_seq"
            )
        ).scalar_one()
    )
    xmin, xmax = conn.execute(
        text(
            "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint,"
            " pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
        )
    ).one()
    return drawn, int(xmin), int(xmax)


def unpublished_backlog(conn: Connection) -> tuple[int, datetime | None]:
    """How many committed events wait for the outbox relay, and the oldest one's commit."""
    row = conn.execute(
        select(func.count(), func.min(outbox.c.occurred_at)).where(outbox.c.feed_position.is_(None))
    ).one()
    return int(row[0]), row[1]


def attempts_in_events(
    conn: Connection, run_id: UUID, event_type: str, up_to_seq: int | None = None
) -> set[str]:
    """The attempt ids the run's events of ``event_type`` (up to ``up_to_seq``) name
    (``payload.attemptId``)."""
    o = outbox.c
    query = select(o.payload["attemptId"].astext).where(
        o.run_id == run_id, o.event_type == event_type
    )
    if up_to_seq is not None:
        query = query.where(o.seq <= up_to_seq)
    rows = conn.execute(query)
    return {str(r[0]) for r in rows if r[0] is not None}
