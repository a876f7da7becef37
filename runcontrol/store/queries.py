"""Read models and sweeps: the queries that are not one grain's command.

Tenant-scoped reads run on ``Database.tenant()`` connections (row-level security applies).
Each takes ``project_id``: the one project the caller may see (``domain.access.project_scope``),
or None for the whole tenant; a run of another project reads exactly like an unknown one.
Sweeps run on the system path (``Database.system_tx()``), the only all-tenant reader.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

from sqlalchemy import ColumnElement, Connection, and_, cast, func, select, text, tuple_, update

from ..domain.flow import CAPACITY_NAME, held_label
from .tables import (
    approval_requests,
    attempt_results,
    attempts,
    command_answers,
    leases,
    outbox,
    recovery_journal,
    runs,
    steps,
)

RunKey = tuple[str, UUID]  # (tenant_id, run_id)


def _json(value: Any) -> Any:
    """A column value as the API's JSON has it."""
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, Enum):
        return value.value
    return value


View = tuple[tuple[str, str], ...]  # (JSON key, column)


def _fields(columns: Iterable[str], renamed: Mapping[str, str] | None = None) -> View:
    """The API's camelCase key for each column, unless ``renamed`` names another."""
    renamed = renamed or {}
    return tuple((renamed.get(c) or _camel(c), c) for c in columns)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _view(m: Any, fields: View) -> dict[str, Any]:
    return {key: _json(m[column]) for key, column in fields}


# What the API shows of each table. An approval and an event are shown whole (an event without
# the relay's bookkeeping); a run, step, attempt and lease show a chosen part.
RUN_SUMMARY = _fields(
    (
        "run_id",
        "tenant_id",
        "project_id",
        "environment_id",
        "workflow_id",
        "release_id",
        "release_hash",
        "policy_revision",
        "model_profile_id",
        "snapshot_id",
        "budget_reservation_id",
        "state",
        "input_hash",
        "requested_by",
        "failure_class",
        "failure_reason",
        "outcome_hash",
        "version",
        "event_seq",
        "created_at",
        "updated_at",
        "rerun_of",
        "suspended_at",
        "result_hash",
        "result_bytes",
        "priority",
    ),
    {"event_seq": "lastEventSeq"},
)
LIMITS = _fields(("max_cost_usd", "max_minutes"))
STEP = _fields(
    (
        "step_id",
        "ordinal",
        "name",
        "agent_id",
        "skill_id",
        "state",
        "max_attempts",
        "gate",
        "side_effect_class",
        "not_before",
        "depends_on",
        "kind",
        "wait",
        "due_at",
        "held",
    )
)
ATTEMPT = _fields(
    (
        "attempt_id",
        "number",
        "state",
        "outcome",
        "outcome_hash",
        "failure_class",
        "dispatched_at",
        "settled_at",
        "holder",
    )
)
LEASE = _fields(("lease_id", "holder", "fencing_token", "expires_at"))
APPROVAL = _fields(approval_requests.c.keys())
EVENT = _fields(
    (c for c in outbox.c.keys() if c not in ("id", "published_at")), {"event_type": "type"}
)


# ---------------------------------------------------------------------- read models (tenant)


def run_summary(m: Any) -> dict[str, Any]:
    view = _view(m, RUN_SUMMARY)
    view["limits"] = _view(m, LIMITS)
    view["suspended"] = m["suspended_at"] is not None
    return view


def approval_view(m: Any) -> dict[str, Any]:
    return _view(m, APPROVAL)


def _in_project(project_id: str | None) -> list[ColumnElement[bool]]:
    return [] if project_id is None else [runs.c.project_id == project_id]


def run_visible(conn: Connection, run_id: UUID, *, project_id: str | None) -> bool:
    """True when the run exists in this tenant and, if given, in ``project_id``."""
    found = conn.execute(
        select(runs.c.run_id).where(runs.c.run_id == run_id, *_in_project(project_id))
    ).first()
    return found is not None


def get_run(
    conn: Connection, run_id: UUID, *, project_id: str | None = None
) -> dict[str, Any] | None:
    """A run with its steps, attempts, current leases and pending approvals; None when it is
    not in this tenant or (``project_id``) not in that project."""
    row = conn.execute(
        select(runs).where(runs.c.run_id == run_id, *_in_project(project_id))
    ).first()
    if row is None:
        return None
    view = run_summary(row._mapping)
    view["input"] = row._mapping["input"]
    view["result"], view["resultRef"] = run_result(conn, run_id, row._mapping["result_hash"])
    current = {
        r.attempt_id: r._mapping
        for r in conn.execute(
            select(leases).where(leases.c.run_id == run_id, leases.c.released_at.is_(None))
        )
    }
    by_step: dict[UUID, list[dict[str, Any]]] = {}
    for a in conn.execute(
        select(attempts).where(attempts.c.run_id == run_id).order_by(attempts.c.number)
    ):
        m = a._mapping
        lease = current.get(m["attempt_id"])
        attempt = _view(m, ATTEMPT)
        attempt["lease"] = None if lease is None else _view(lease, LEASE)
        by_step.setdefault(m["step_id"], []).append(attempt)
    view["steps"] = [
        {
            **_view(r._mapping, STEP),
            "heldReason": held_label(r._mapping["held"]),
            "attempts": by_step.get(r.step_id, []),
        }
        for r in conn.execute(
            select(steps).where(steps.c.run_id == run_id).order_by(steps.c.ordinal)
        )
    ]
    view["pendingApprovals"] = [
        approval_view(r._mapping)
        for r in conn.execute(
            select(approval_requests).where(
                approval_requests.c.run_id == run_id, approval_requests.c.state == "Pending"
            )
        )
    ]
    return view


def run_result(conn: Connection, run_id: UUID, result_hash: str | None) -> tuple[Any, Any]:
    """The run's result content (result, result_ref): a stored result of the run with its
    result's hash (any of them holds the same content); (None, None) when it has none, or
    retention removed it."""
    if result_hash is None:
        return None, None
    r = attempt_results
    found = conn.execute(
        select(r.c.result_json, r.c.result_ref)
        .where(r.c.run_id == run_id, r.c.outcome_hash == result_hash)
        .limit(1)
    ).first()
    if found is None:
        return None, None
    content = None if found.result_json is None else json.loads(found.result_json)
    return content, found.result_ref


def encode_cursor(created_at: datetime, key: str) -> str:
    raw = json.dumps([created_at.isoformat(), key]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    padded = cursor + "=" * (-len(cursor) % 4)
    created, key = json.loads(base64.urlsafe_b64decode(padded))
    return datetime.fromisoformat(created), str(key)


def list_runs(
    conn: Connection,
    *,
    project_id: str | None,
    states: Sequence[str] = (),
    workflow_id: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> tuple[list[dict[str, Any]], str | None]:
    """Newest first, keyset-paged on (created_at, run_id)."""
    conditions = _in_project(project_id)
    if states:
        conditions.append(runs.c.state.in_(list(states)))
    if workflow_id:
        conditions.append(runs.c.workflow_id == workflow_id)
    return _page(conn, runs, runs.c.run_id, conditions, cursor, limit, run_summary)


def list_approvals(
    conn: Connection,
    *,
    project_id: str | None,
    states: Sequence[str] = (),
    requested_by: str | None = None,
    run_id: UUID | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> tuple[list[dict[str, Any]], str | None]:
    """Newest first, keyset-paged on (created_at, approval_id); ``run_id``: one run's."""
    t = approval_requests
    conditions: list[ColumnElement[bool]] = []
    if run_id is not None:
        conditions.append(t.c.run_id == run_id)
    if project_id is not None:
        in_project = select(runs.c.run_id).where(runs.c.project_id == project_id)
        conditions.append(t.c.run_id.in_(in_project))
    if requested_by is not None:
        conditions.append(t.c.requested_by == requested_by)
    if states:
        conditions.append(t.c.state.in_(list(states)))
    return _page(conn, t, t.c.approval_id, conditions, cursor, limit, approval_view)


def get_approval(
    conn: Connection,
    approval_id: UUID,
    *,
    project_id: str | None,
    requested_by: str | None = None,
) -> dict[str, Any] | None:
    """One approval request as ``list_approvals`` would show it to the same caller, or None."""
    t = approval_requests
    query = (
        select(t)
        .join(runs, runs.c.run_id == t.c.run_id)
        .where(t.c.approval_id == approval_id, *_in_project(project_id))
    )
    if requested_by is not None:
        query = query.where(t.c.requested_by == requested_by)
    row = conn.execute(query).first()
    return None if row is None else approval_view(row._mapping)


def _page(
    conn: Connection,
    table: Any,
    key: Any,
    conditions: list[Any],
    cursor: str | None,
    limit: int,
    view: Any,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page newest first, keyset-paged on (created_at, key), plus the next page's cursor."""
    query = select(table).where(*conditions).order_by(table.c.created_at.desc(), key.desc())
    if cursor:
        created, after = decode_cursor(cursor)
        query = query.where(tuple_(table.c.created_at, key) < (created, UUID(after)))
    rows = [r._mapping for r in conn.execute(query.limit(limit + 1))]
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        next_cursor = encode_cursor(rows[-1]["created_at"], str(rows[-1][key.name]))
    return [view(m) for m in rows], next_cursor


def approval_run(
    conn: Connection, approval_id: UUID, *, project_id: str | None = None
) -> UUID | None:
    """The run of an approval request in this tenant and (``project_id``) in that project."""
    t = approval_requests
    return conn.execute(
        select(t.c.run_id)
        .join(runs, runs.c.run_id == t.c.run_id)
        .where(t.c.approval_id == approval_id, *_in_project(project_id))
    ).scalar_one_or_none()


def event_view(m: Any) -> dict[str, Any]:
    return _view(m, EVENT)


def events_after(
    conn: Connection, run_id: UUID, after_seq: int, limit: int = 500
) -> list[dict[str, Any]]:
    """The run's committed events with seq > after_seq, in order (the SSE replay cursor)."""
    rows = conn.execute(
        select(outbox)
        .where(outbox.c.run_id == run_id, outbox.c.seq > after_seq)
        .order_by(outbox.c.seq)
        .limit(limit)
    )
    return [event_view(r._mapping) for r in rows]


# ---------------------------------------------------------------------- sweeps (system path)


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


def run_input(conn: Connection, run_id: UUID) -> dict[str, Any] | None:
    """The run's input (what a claim hands its worker with the lease)."""
    found = conn.execute(select(runs.c.input).where(runs.c.run_id == run_id)).first()
    return None if found is None else found.input


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
    taken one of these; a backlog still being worked is not stalled. The recent claims come
    from the journal's time index (a range, not a scan of leases)."""
    cutoff = now - timedelta(seconds=wait_seconds)
    claimed = attempts.alias("claimed")
    j = recovery_journal
    claimed_lately = (
        select(j.c.id)
        .select_from(j.join(claimed, claimed.c.attempt_id == j.c.entity_id))
        .where(
            j.c.occurred_at >= cutoff,
            j.c.entity == "Attempt",
            j.c.to_state == "Leased",
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


def take_unpublished(conn: Connection, now: datetime, limit: int = 500) -> list[dict[str, Any]]:
    """Mark the oldest unpublished outbox rows published at ``now`` and answer them, oldest
    first: one ``UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED) ... RETURNING``, so a
    second relay skips them. The mark is the caller's transaction's: if it does not commit (a
    sink failed, the relay died after its sinks had the events) the rows stay unpublished and
    the next relay publishes them again (at-least-once)."""
    picked = (
        select(outbox.c.id)
        .where(outbox.c.published_at.is_(None))
        .order_by(outbox.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .subquery("picked")
    )
    rows = conn.execute(
        update(outbox)
        .where(outbox.c.id == picked.c.id)
        .values(published_at=now)
        .returning(*outbox.c)
    )
    return sorted((dict(r._mapping) for r in rows), key=lambda r: int(r["id"]))


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


def unpublished_backlog(conn: Connection) -> tuple[int, datetime | None]:
    """How many committed events wait for the outbox relay, and the oldest one's commit."""
    row = conn.execute(
        select(func.count(), func.min(outbox.c.occurred_at)).where(outbox.c.published_at.is_(None))
    ).one()
    return int(row[0]), row[1]


# ---------------------------------------------------------------------- flow control (0017)

_QUEUES = """
WITH k AS (SELECT tenant_id, name, key, kind FROM flow_slots
           UNION SELECT tenant_id, name, key, kind FROM flow_waiters)
SELECT k.tenant_id, k.name, k.key, k.kind,
       coalesce(s.holders, 0) AS holders,
       coalesce(s.max_holders, w.max_holders) AS max_holders,
       coalesce(w.waiting, 0) AS waiting,
       coalesce(w.promoted, 0) AS promoted,
       w.oldest
FROM k
LEFT JOIN LATERAL (SELECT count(*) AS holders, max(max_holders) AS max_holders FROM flow_slots
                   WHERE tenant_id = k.tenant_id AND name = k.name AND key = k.key) s ON true
LEFT JOIN LATERAL (SELECT count(*) FILTER (WHERE NOT promoted) AS waiting,
                          count(*) FILTER (WHERE promoted) AS promoted,
                          max(max_holders) AS max_holders,
                          min(enqueued_at) FILTER (WHERE NOT promoted) AS oldest
                   FROM flow_waiters
                   WHERE tenant_id = k.tenant_id AND name = k.name AND key = k.key) w ON true
ORDER BY waiting DESC, k.name, k.key
LIMIT :limit
"""


def flow_queues(conn: Connection, now: datetime, limit: int = 500) -> list[dict[str, Any]]:
    """Per concurrency key with holders or waiters (and the tenant's cap): its limit, holders,
    promoted and waiting runs, and the oldest waiter's age (s). Tenant-scoped by row-level
    security; the busiest keys first."""
    found = []
    for r in conn.execute(text(_QUEUES), {"limit": limit}).mappings():
        oldest = r["oldest"]
        found.append(
            {
                "tenantId": r["tenant_id"],
                "kind": r["kind"],
                "name": r["name"] if r["name"] != CAPACITY_NAME else None,
                "key": r["key"],
                "limit": int(r["max_holders"]),
                "holders": int(r["holders"]),
                "promoted": int(r["promoted"]),
                "waiting": int(r["waiting"]),
                "oldestWaitingSeconds": (
                    None if oldest is None else max(0.0, (now - oldest).total_seconds())
                ),
            }
        )
    return found


def flow_backlog(conn: Connection, now: datetime) -> dict[tuple[str, str, str], tuple[int, float]]:
    """The scheduler's gauges: per (tenant, kind, name) over all its keys, how many runs wait
    for a slot and the oldest one's age (s)."""
    rows = conn.execute(
        text(
            "SELECT tenant_id, kind, name, count(*), min(enqueued_at) FROM flow_waiters"
            " WHERE NOT promoted GROUP BY tenant_id, kind, name"
        )
    )
    return {(r[0], r[1], r[2]): (int(r[3]), max(0.0, (now - r[4]).total_seconds())) for r in rows}
