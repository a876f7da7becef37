"""Schedules and their fire times in PostgreSQL (migration 0023).

Tenant functions run on ``Database.tenant()`` connections (row-level security: the tenant, and
for a caller bound to a project, its project); the sweep's on the system path, each schedule
locked ``FOR UPDATE SKIP LOCKED`` while its fire times are decided, so two sweeps (or a sweep
and a backfill) never decide the same schedule at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Row, and_, delete, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ..domain import RunState
from ..domain.schedules import FireOutcome
from .queries.views import api_view, render
from .tables import release_aliases, releases, runs, schedule_fires, schedules

SCHEDULE = api_view(
    c for c in schedules.c.keys() if c not in ("tenant_id", "owner_roles", "owner_scopes", "spec")
)
FIRE = api_view(c for c in schedule_fires.c.keys() if c not in ("tenant_id", "schedule_id"))
TERMINAL = tuple(str(s) for s in RunState if s.terminal)
# The started fires looked at for open runs: the newest ones (a run a schedule started long
# before its newest hundred is not an overlap any policy waits for).
OPEN_WINDOW = 100
_STARTED = FireOutcome.STARTED.value


def schedule_view(m: Any) -> dict[str, Any]:
    """The API's view of a schedule's row; paused, it has no next fire time (a resume
    computes one from its own instant)."""
    view = {**render(m, SCHEDULE), **m["spec"]}
    if m["paused"]:
        view["nextFireAt"] = None
    return view


def release_named(
    conn: Connection, workflow_id: str, alias: str | None, release_id: str | None
) -> bool:
    """Whether the tenant's catalog has the release a submission would pin."""
    if release_id is not None:
        stmt = select(releases.c.release_id).where(
            releases.c.workflow_id == workflow_id, releases.c.release_id == release_id
        )
    else:
        stmt = select(release_aliases.c.alias).where(
            release_aliases.c.workflow_id == workflow_id,
            release_aliases.c.alias == (alias or "latest"),
        )
    return conn.execute(stmt.limit(1)).first() is not None


# ---------------------------------------------------------------------- tenant


def insert_schedule(conn: Connection, values: dict[str, Any]) -> None:
    conn.execute(pg_insert(schedules).values(**values))


def get_row(conn: Connection, schedule_id: UUID, *, lock: bool = False) -> Row[Any] | None:
    stmt = select(schedules).where(schedules.c.schedule_id == schedule_id)
    return conn.execute(stmt.with_for_update() if lock else stmt).first()


def list_schedules(
    conn: Connection, *, cursor: datetime | None, limit: int
) -> list[dict[str, Any]]:
    s = schedules.c
    stmt = select(schedules).order_by(s.created_at, s.schedule_id).limit(limit)
    if cursor is not None:
        stmt = stmt.where(s.created_at > cursor)
    return [schedule_view(r._mapping) for r in conn.execute(stmt)]


def update_schedule(conn: Connection, schedule_id: UUID, **values: Any) -> None:
    conn.execute(update(schedules).where(schedules.c.schedule_id == schedule_id).values(**values))


def delete_schedule(conn: Connection, schedule_id: UUID) -> bool:
    found = conn.execute(delete(schedules).where(schedules.c.schedule_id == schedule_id))
    return bool(found.rowcount)


def last_fires(conn: Connection, schedule_id: UUID, limit: int = 10) -> list[dict[str, Any]]:
    """The newest fire times handled, with the state of the run each started."""
    f = schedule_fires.c
    rows = conn.execute(
        select(schedule_fires, runs.c.state.label("run_state"))
        .outerjoin(runs, runs.c.run_id == f.run_id)
        .where(f.schedule_id == schedule_id)
        .order_by(f.nominal_at.desc())
        .limit(limit)
    )
    return [{**render(r._mapping, FIRE), "runState": r.run_state} for r in rows]


# ---------------------------------------------------------------------- both


def open_runs(conn: Connection, schedule_id: UUID) -> list[UUID | None]:
    """The runs the schedule started that are still open (None: started, not yet submitted)."""
    f = schedule_fires.c
    newest = (
        select(f.nominal_at, f.run_id, f.submitted_at)
        .where(f.schedule_id == schedule_id, f.outcome == _STARTED, f.error.is_(None))
        .order_by(f.nominal_at.desc())
        .limit(OPEN_WINDOW)
        .subquery()
    )
    rows = conn.execute(
        select(newest.c.run_id)
        .outerjoin(runs, runs.c.run_id == newest.c.run_id)
        .where(or_(newest.c.submitted_at.is_(None), runs.c.state.not_in(TERMINAL)))
    )
    return [r.run_id for r in rows]


def record_fire(
    conn: Connection,
    *,
    tenant_id: str,
    schedule_id: UUID,
    nominal_at: datetime,
    kind: str,
    outcome: str,
    cancels: Sequence[UUID] | None,
    now: datetime,
) -> bool:
    """The fire time's row; False when the time was handled already (a backfill, a trigger,
    an earlier sweep): each fire time is decided once."""
    found = conn.execute(
        pg_insert(schedule_fires)
        .values(
            tenant_id=tenant_id,
            schedule_id=schedule_id,
            nominal_at=nominal_at,
            kind=kind,
            outcome=outcome,
            cancels=[str(c) for c in cancels] if cancels else None,
            recorded_at=now,
        )
        .on_conflict_do_nothing(index_elements=["schedule_id", "nominal_at"])
        .returning(schedule_fires.c.nominal_at)
    )
    return found.first() is not None


def start_buffered(conn: Connection, schedule_id: UUID, nominal_at: datetime) -> None:
    f = schedule_fires.c
    conn.execute(
        update(schedule_fires)
        .where(f.schedule_id == schedule_id, f.nominal_at == nominal_at)
        .values(outcome=_STARTED)
    )


def count(conn: Connection, schedule_id: UUID, **deltas: int) -> None:
    """Add to the schedule's counters (``started``, ``skipped``, ``missed``)."""
    c = schedules.c
    values = {name: getattr(c, name) + n for name, n in deltas.items() if n}
    if values:
        conn.execute(update(schedules).where(c.schedule_id == schedule_id).values(**values))


# ---------------------------------------------------------------------- the sweep (system)


def due_schedules(conn: Connection, now: datetime, limit: int) -> list[Row[Any]]:
    """Schedules with a fire time due, or a buffered one to look at, locked for this sweep."""
    s = schedules.c
    return list(
        conn.execute(
            select(schedules)
            .where(~s.paused, or_(s.next_fire_at <= now, s.buffered_at.is_not(None)))
            .order_by(s.next_fire_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    )


def unsubmitted(conn: Connection, limit: int) -> list[Row[Any]]:
    """Started fires not yet submitted, oldest first, each with its schedule's owner and spec."""
    f = schedule_fires.c
    s = schedules.c
    return list(
        conn.execute(
            select(
                f.schedule_id,
                f.nominal_at,
                f.cancels,
                s.tenant_id,
                s.project_id,
                s.owner,
                s.owner_roles,
                s.owner_scopes,
                s.spec,
            )
            .join(schedules, s.schedule_id == f.schedule_id)
            .where(and_(f.outcome == _STARTED, f.submitted_at.is_(None)))
            .order_by(f.nominal_at)
            .limit(limit)
        )
    )


def mark_submitted(
    conn: Connection,
    schedule_id: UUID,
    nominal_at: datetime,
    now: datetime,
    *,
    run_id: UUID | None,
    error: str | None = None,
) -> None:
    f = schedule_fires.c
    conn.execute(
        update(schedule_fires)
        .where(f.schedule_id == schedule_id, f.nominal_at == nominal_at)
        .values(run_id=run_id, submitted_at=now, error=error)
    )
