"""The system path's sweeps (the reminders, leases and approvals come due: every tenant's
runs, on ``Database.system_tx()``) and the gauges of the service's state."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection, func, select

from ..tables import approval_requests, leases, runs, steps
from .views import RunKey


def due_runs(conn: Connection, now: datetime, limit: int = 500) -> list[RunKey]:
    """Runs whose durable reminder (next_due_at) has come: RunDispatcher's periodic sweep."""
    rows = conn.execute(
        select(runs.c.tenant_id, runs.c.run_id)
        .where(runs.c.next_due_at <= now)
        .order_by(runs.c.next_due_at)
        .limit(limit)
    )
    return [(r.tenant_id, r.run_id) for r in rows]


def next_due_after(conn: Connection, now: datetime) -> datetime | None:
    """The earliest reminder still ahead of ``now`` (the first entry of ix_runs_due)."""
    found: datetime | None = conn.execute(
        select(func.min(runs.c.next_due_at)).where(runs.c.next_due_at > now)
    ).scalar_one()
    return found


def expired_leases(
    conn: Connection, now: datetime, grace_seconds: float, limit: int = 500
) -> list[RunKey]:
    """Runs holding a current lease past expiresAt + grace (LeaseExpiryReconciler)."""
    cutoff = now - timedelta(seconds=grace_seconds)
    rows = conn.execute(
        select(leases.c.tenant_id, leases.c.run_id)
        .join(runs, runs.c.run_id == leases.c.run_id)
        .where(
            leases.c.released_at.is_(None),
            leases.c.expires_at < cutoff,
            runs.c.state != "WaitingForApproval",
        )
        .distinct()
        .limit(limit)
    )
    return [(r.tenant_id, r.run_id) for r in rows]


def runs_with_open_leases(conn: Connection) -> list[RunKey]:
    """Runs holding a current lease, whatever its expiry (restore-check, after a restore)."""
    rows = conn.execute(
        select(leases.c.tenant_id, leases.c.run_id).where(leases.c.released_at.is_(None)).distinct()
    )
    return [(r.tenant_id, r.run_id) for r in rows]


def expired_approvals(conn: Connection, now: datetime, limit: int = 500) -> list[RunKey]:
    """Runs with a Pending approval past expiresAt (ApprovalExpiryReconciler)."""
    t = approval_requests
    rows = conn.execute(
        select(t.c.tenant_id, t.c.run_id)
        .where(t.c.state == "Pending", t.c.expires_at <= now)
        .distinct()
        .limit(limit)
    )
    return [(r.tenant_id, r.run_id) for r in rows]


def active_run_counts(conn: Connection) -> dict[tuple[str, str], int]:
    rows = conn.execute(
        select(runs.c.tenant_id, runs.c.state, func.count())
        .where(runs.c.state.in_(("Accepted", "Running", "WaitingForApproval", "Cancelling")))
        .group_by(runs.c.tenant_id, runs.c.state)
    )
    return {(r[0], r[1]): int(r[2]) for r in rows}


def held_steps(conn: Connection) -> dict[tuple[str, str], int]:
    """Per (tenant, held kind): the Pending steps held (a rate limit's reservation admits
    them later, 0018), from the partial index on held steps."""
    kind = steps.c.held["kind"].astext
    rows = conn.execute(
        select(steps.c.tenant_id, kind, func.count())
        .where(steps.c.held.is_not(None), steps.c.state == "Pending")
        .group_by(steps.c.tenant_id, kind)
    )
    return {(r[0], str(r[1])): int(r[2]) for r in rows}


def pending_approvals_by_tenant(conn: Connection) -> dict[str, tuple[int, datetime]]:
    """Per tenant: how many approval requests are pending, and when the oldest was made."""
    rows = conn.execute(
        select(
            approval_requests.c.tenant_id, func.count(), func.min(approval_requests.c.created_at)
        )
        .where(approval_requests.c.state == "Pending")
        .group_by(approval_requests.c.tenant_id)
    )
    return {r[0]: (int(r[1]), r[2]) for r in rows}
