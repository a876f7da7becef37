"""The attempts waiting for a worker: what a claim may take, what a host's session sweep
hands its book, what a claim was granted, and the work no worker takes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, and_, cast, func, select

from ..tables import attempts, command_answers, leases, outbox, runs


def claimable(
    conn: Connection, agent_ids: Sequence[str], limit: int = 10, per_tenant: int | None = None
) -> list[tuple[str, UUID, UUID]]:
    """Dispatched, unleased attempts for these agents, the highest run priority first, then
    the oldest: (tenant, run, attempt).

    With ``per_tenant``: each tenant's first ``per_tenant`` of them in that order, by rank
    (every tenant's first, in the order of their heads, then every tenant's second, ...), so
    that one tenant's backlog cannot hide another's attempts from a claim that serves both (the
    host picks the tenant: ``runcontrol.workers.fair_shares``). A scan of the agents' dispatched
    attempts (the claimable index), not of the first ``limit``."""
    condition = attempts.c.state == "Dispatched"
    if agent_ids:
        condition = and_(condition, attempts.c.agent_id.in_(list(agent_ids)))
    # A suspended run's attempts wait for its resumption (they would only be refused).
    condition = and_(condition, runs.c.suspended_at.is_(None))
    joined = attempts.join(runs, runs.c.run_id == attempts.c.run_id)
    columns = (attempts.c.tenant_id, attempts.c.run_id, attempts.c.attempt_id)
    if per_tenant is None:
        query = (
            select(*columns)
            .select_from(joined)
            .where(condition)
            .order_by(runs.c.priority.desc(), attempts.c.dispatched_at)
            .limit(limit)
        )
    else:
        rank = func.row_number().over(
            partition_by=attempts.c.tenant_id,
            order_by=(runs.c.priority.desc(), attempts.c.dispatched_at),
        )
        ranked = (
            select(
                *columns,
                runs.c.priority,
                attempts.c.dispatched_at,
                rank.label("rank"),
            )
            .select_from(joined)
            .where(condition)
            .subquery()
        )
        query = (
            select(ranked.c.tenant_id, ranked.c.run_id, ranked.c.attempt_id)
            .where(ranked.c.rank <= per_tenant)
            .order_by(ranked.c.rank, ranked.c.priority.desc(), ranked.c.dispatched_at)
            .limit(limit)
        )
    return [(r.tenant_id, r.run_id, r.attempt_id) for r in conn.execute(query)]


def leasable(
    conn: Connection, dispatched_before: datetime, limit: int = 256
) -> list[tuple[str, UUID, UUID, str, datetime, dict[str, Any] | None, int]]:
    """Dispatched attempts of running, unsuspended runs, oldest first, with their run's input
    and priority: (tenant, run, attempt, agent, dispatched at, input, priority). A run host's
    session sweep: the attempts no host's own commits handed to its book (a restart, a
    drain)."""
    rows = conn.execute(
        select(
            attempts.c.tenant_id,
            attempts.c.run_id,
            attempts.c.attempt_id,
            attempts.c.agent_id,
            attempts.c.dispatched_at,
            runs.c.input,
            runs.c.priority,
        )
        .join(runs, runs.c.run_id == attempts.c.run_id)
        .where(
            attempts.c.state == "Dispatched",
            attempts.c.dispatched_at < dispatched_before,
            runs.c.state == "Running",
            runs.c.suspended_at.is_(None),
        )
        .order_by(attempts.c.dispatched_at)
        .limit(limit)
    )
    return [
        (r.tenant_id, r.run_id, r.attempt_id, r.agent_id, r.dispatched_at, r.input, r.priority)
        for r in rows
    ]


def claimed(conn: Connection, claim_id: str) -> tuple[str, UUID, dict[str, Any], Any] | None:
    """What the claim ``claim_id`` was granted, if its lease is still current: (tenant, run,
    stored ``AcquireLease`` answer, run input). A claim's ``AcquireLease`` commands carry the
    claim id as their command id, whichever run they found (index of migration 0011)."""
    a = command_answers
    lease_id = a.c.answer["value"]["lease_id"].astext
    row = conn.execute(
        select(a.c.tenant_id, a.c.run_id, a.c.answer, runs.c.input)
        .join(runs, runs.c.run_id == a.c.run_id)
        .join(leases, leases.c.lease_id == cast(lease_id, leases.c.lease_id.type))
        .where(
            a.c.command_id == claim_id,
            a.c.command == "AcquireLease",
            leases.c.released_at.is_(None),
        )
        .order_by(a.c.created_at.desc())
        .limit(1)
    ).first()
    return None if row is None else (row.tenant_id, row.run_id, row.answer, row.input)


def stalled_attempts(
    conn: Connection, now: datetime, wait_seconds: float, limit: int = 500
) -> list[tuple[str, str, int, datetime]]:
    """Per (tenant, agent), attempts dispatched more than ``wait_seconds`` ago and still
    unclaimed while no attempt of that tenant's agent was leased in that time: (tenant, agent,
    attempts waiting, oldest dispatch), oldest first; what the connection's tenant may see.
    Claims take the oldest first, so a worker of the agent that claimed at all would have
    taken one of these; a backlog still being worked is not stalled. The recent claims are the
    ``LeaseGranted`` events in a range of the events' time index (not a scan of leases)."""
    cutoff = now - timedelta(seconds=wait_seconds)
    claimed = attempts.alias("claimed")
    o = outbox
    claimed_lately = (
        select(o.c.id)
        .select_from(o.join(claimed, claimed.c.attempt_id == o.c.attempt_id))
        .where(
            o.c.occurred_at >= cutoff,
            o.c.event_type == "LeaseGranted",
            claimed.c.tenant_id == attempts.c.tenant_id,
            claimed.c.agent_id == attempts.c.agent_id,
        )
        .exists()
    )
    oldest = func.min(attempts.c.dispatched_at)
    rows = conn.execute(
        select(attempts.c.tenant_id, attempts.c.agent_id, func.count(), oldest)
        .where(attempts.c.state == "Dispatched", attempts.c.dispatched_at < cutoff, ~claimed_lately)
        .group_by(attempts.c.tenant_id, attempts.c.agent_id)
        .order_by(oldest)
        .limit(limit)
    )
    return [(r[0], r[1], int(r[2]), r[3]) for r in rows]
