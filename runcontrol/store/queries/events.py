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


# The relay's pass begins (0039, docs/write-path.md section 6): the feed lock (to the pass's
# commit: passes and subscriptions are ordered by it), and the last outbox id handed out (read
# before the lock is granted, it is only older: as safe). Reads only: the pass's transaction
# has no xid of its own yet, so its snapshots' xmin is the others' (``take_published``).
_BEGIN = text(
    """
    SELECT pg_advisory_xact_lock(:lock) IS NULL AS locked,
           (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END
            FROM outbox_id_seq) AS drawn
    """
)
_XMAX = text("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")

# The take, in a snapshot taken once the lock is held (the floor another relay committed is
# read): ``relay_state``'s row, the bound the floor may move to (``drawn`` if this snapshot's
# xmin has passed the pass's xmax, else the stored mark's ``drawn`` if it passed that mark's
# xmax, else the floor), and the rows up to it past the floor, oldest first (but those a
# shard move wrote already published: ``store/move_rows.py``). One row at least (the bound,
# with NULL columns when there is nothing to publish).
_TAKE = """
WITH bound AS (
    SELECT s.floor, s.mark_drawn, s.mark_xmax, x.xmin,
           CASE WHEN x.xmin >= :xmax THEN greatest(CAST(:drawn AS bigint), s.floor)
                WHEN x.xmin >= s.mark_xmax THEN s.mark_drawn
                ELSE s.floor END AS upto,
           coalesce(x.xmin >= :xmax OR x.xmin >= s.mark_xmax, false) AS passed
    FROM relay_state s,
         (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin) x
    WHERE s.id = 1
)
SELECT bound.floor, bound.mark_drawn, bound.mark_xmax, bound.xmin, bound.upto, bound.passed,
       {columns}
FROM bound LEFT JOIN LATERAL (
    SELECT * FROM outbox WHERE outbox.id > bound.floor AND outbox.id <= bound.upto
        AND outbox.published_at IS NULL  -- set only on a row a shard move brought published
    ORDER BY outbox.id LIMIT :limit
) outbox ON true
ORDER BY outbox.id
"""
_BOUND = ("floor", "mark_drawn", "mark_xmax", "xmin", "upto", "passed")
_ADVANCE = text(
    "UPDATE relay_state SET floor = :floor, mark_drawn = :mark_drawn, mark_xmax = :mark_xmax,"
    " updated_at = :now WHERE id = 1"
)


@dataclass(frozen=True, slots=True)
class RelayState:
    """``relay_state``'s row: every event row with ``id <= floor`` is published (or its
    transaction never committed); ``mark``: (the last id handed out, the snapshot xmax) of an
    earlier pass, which the floor may move up to once a snapshot's xmin has passed that xmax."""

    floor: int
    mark: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class Take:
    """A pass's take: its rows (oldest first) and the state to record once they are out."""

    rows: list[dict[str, Any]]
    was: RelayState
    then: RelayState


def take_published(conn: Connection, lock: int, limit: int = 500, *, whole: bool = True) -> Take:
    """The event rows a relay pass publishes, oldest first, and where its floor moves: no row is
    updated (0039). Every transaction that drew an outbox id up to ``drawn`` (read first) had
    its xid before the xmax read next (the write path writes its run before its events), so
    once a snapshot's xmin has passed that xmax each of them ended and the ids up to ``drawn``
    are settled: committed (visible to that snapshot) or never. The take's own snapshot checks
    this pass's mark, else the stored one (a busy database: the next pass publishes). In the
    caller's transaction, which holds the feed lock (``lock``) to its commit and records
    ``then`` (``advance``) only after every sink took the rows: at-least-once.
    ``whole=False``: each row's ``id`` and ``occurred_at`` only."""
    drawn = int(conn.execute(_BEGIN, {"lock": lock}).one().drawn)
    xmax = int(conn.execute(_XMAX).scalar_one())
    columns = EVENT_ROW if whole else (outbox.c.id, outbox.c.occurred_at)
    statement = text(_TAKE.format(columns=", ".join(f"outbox.{c.name}" for c in columns)))
    found = conn.execute(statement, {"drawn": drawn, "xmax": xmax, "limit": limit}).all()
    head = found[0]
    floor, upto, passed, xmin = int(head.floor), int(head.upto), bool(head.passed), int(head.xmin)
    mark = None if head.mark_drawn is None else (int(head.mark_drawn), int(head.mark_xmax))
    was = RelayState(floor, mark)
    rows = [
        {k: v for k, v in r._mapping.items() if k not in _BOUND} for r in found if r.id is not None
    ]
    if len(rows) == limit:  # the rest next pass, under a mark already passed (xmin only grows)
        return Take(rows, was, RelayState(int(rows[-1]["id"]), (upto, xmin)))
    if not passed and mark is not None:  # the stored mark has not passed: kept
        return Take(rows, was, RelayState(floor, mark))
    return Take(rows, was, RelayState(upto, (drawn, xmax) if drawn > upto else None))


def advance(conn: Connection, take: Take, now: datetime) -> None:
    """Record where the floor moved (one row update, when it changed)."""
    if take.then == take.was:
        return
    mark = take.then.mark
    conn.execute(
        _ADVANCE,
        {
            "floor": take.then.floor,
            "mark_drawn": None if mark is None else mark[0],
            "mark_xmax": None if mark is None else mark[1],
            "now": now,
        },
    )


# The event rows waiting for the relay (0039): past its floor (but those a shard move brought
# published).
UNPUBLISHED_SQL = (
    "published_at IS NULL AND id > (SELECT floor FROM relay_state WHERE relay_state.id = 1)"
)
UNPUBLISHED = text(UNPUBLISHED_SQL)


def unpublished_backlog(conn: Connection) -> tuple[int, datetime | None]:
    """How many committed events wait for the outbox relay, and the oldest one's commit."""
    row = conn.execute(
        select(func.count(), func.min(outbox.c.occurred_at)).where(UNPUBLISHED)
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
