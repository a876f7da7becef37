"""Read models and sweeps: the queries that are not one grain's command.

Tenant-scoped reads run on ``Database.tenant()`` connections (row-level security applies).
Sweeps run on the system path (``Database.system_tx()``), the only all-tenant reader.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import ColumnElement, Connection, and_, func, select, tuple_, update

from .tables import (
    approval_requests,
    attempts,
    leases,
    outbox,
    runs,
    steps,
)

RunKey = tuple[str, UUID]  # (tenant_id, run_id)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _s(value: Any) -> str | None:
    return None if value is None else str(value)


# ---------------------------------------------------------------------- read models (tenant)


def run_summary(m: Any) -> dict[str, Any]:
    return {
        "runId": str(m["run_id"]),
        "tenantId": m["tenant_id"],
        "projectId": m["project_id"],
        "environmentId": m["environment_id"],
        "workflowId": m["workflow_id"],
        "releaseId": m["release_id"],
        "releaseHash": m["release_hash"],
        "policyRevision": m["policy_revision"],
        "modelProfileId": m["model_profile_id"],
        "snapshotId": str(m["snapshot_id"]),
        "budgetReservationId": _s(m["budget_reservation_id"]),
        "state": m["state"],
        "inputHash": m["input_hash"],
        "requestedBy": m["requested_by"],
        "failureClass": m["failure_class"],
        "failureReason": m["failure_reason"],
        "outcomeHash": m["outcome_hash"],
        "limits": {
            "maxCostUsd": float(m["max_cost_usd"]) if m["max_cost_usd"] is not None else None,
            "maxMinutes": m["max_minutes"],
        },
        "version": m["version"],
        "lastEventSeq": m["event_seq"],
        "createdAt": _iso(m["created_at"]),
        "updatedAt": _iso(m["updated_at"]),
    }


def approval_view(m: Any) -> dict[str, Any]:
    return {
        "approvalId": str(m["approval_id"]),
        "runId": str(m["run_id"]),
        "stepId": str(m["step_id"]),
        "attemptId": str(m["attempt_id"]),
        "tenantId": m["tenant_id"],
        "actionClass": m["action_class"],
        "proposalHash": m["proposal_hash"],
        "policyRevision": m["policy_revision"],
        "approverRule": m["approver_rule"],
        "requiredApprovals": m["required_approvals"],
        "requestedBy": m["requested_by"],
        "state": m["state"],
        "decidedBy": m["decided_by"],
        "decidedAt": _iso(m["decided_at"]),
        "reason": m["reason"],
        "version": m["version"],
        "createdAt": _iso(m["created_at"]),
        "expiresAt": _iso(m["expires_at"]),
    }


def get_run(conn: Connection, run_id: UUID) -> dict[str, Any] | None:
    """A run with its steps, attempts, current leases and pending approvals."""
    row = conn.execute(select(runs).where(runs.c.run_id == run_id)).first()
    if row is None:
        return None
    view = run_summary(row._mapping)
    view["input"] = row._mapping["input"]
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
        by_step.setdefault(m["step_id"], []).append(
            {
                "attemptId": str(m["attempt_id"]),
                "number": m["number"],
                "state": m["state"],
                "outcome": m["outcome"],
                "outcomeHash": m["outcome_hash"],
                "failureClass": m["failure_class"],
                "dispatchedAt": _iso(m["dispatched_at"]),
                "settledAt": _iso(m["settled_at"]),
                "lease": None
                if lease is None
                else {
                    "leaseId": str(lease["lease_id"]),
                    "holder": lease["holder"],
                    "fencingToken": lease["fencing_token"],
                    "expiresAt": _iso(lease["expires_at"]),
                },
            }
        )
    view["steps"] = [
        {
            "stepId": str(m["step_id"]),
            "ordinal": m["ordinal"],
            "name": m["name"],
            "agentId": m["agent_id"],
            "skillId": m["skill_id"],
            "state": m["state"],
            "maxAttempts": m["max_attempts"],
            "gate": m["gate"],
            "sideEffectClass": m["side_effect_class"],
            "notBefore": _iso(m["not_before"]),
            "attempts": by_step.get(m["step_id"], []),
        }
        for m in (
            r._mapping
            for r in conn.execute(
                select(steps).where(steps.c.run_id == run_id).order_by(steps.c.ordinal)
            )
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
    states: Sequence[str] = (),
    workflow_id: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> tuple[list[dict[str, Any]], str | None]:
    """Newest first, keyset-paged on (created_at, run_id)."""
    conditions: list[ColumnElement[bool]] = []
    if states:
        conditions.append(runs.c.state.in_(list(states)))
    if workflow_id:
        conditions.append(runs.c.workflow_id == workflow_id)
    return _page(conn, runs, runs.c.run_id, conditions, cursor, limit, run_summary)


def list_approvals(
    conn: Connection,
    *,
    states: Sequence[str] = (),
    requested_by: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> tuple[list[dict[str, Any]], str | None]:
    """Newest first, keyset-paged on (created_at, approval_id)."""
    t = approval_requests
    conditions: list[ColumnElement[bool]] = []
    if requested_by is not None:
        conditions.append(t.c.requested_by == requested_by)
    if states:
        conditions.append(t.c.state.in_(list(states)))
    return _page(conn, t, t.c.approval_id, conditions, cursor, limit, approval_view)


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


def approval_run(conn: Connection, approval_id: UUID) -> UUID | None:
    return conn.execute(
        select(approval_requests.c.run_id).where(approval_requests.c.approval_id == approval_id)
    ).scalar_one_or_none()


def event_view(m: Any) -> dict[str, Any]:
    return {
        "eventId": str(m["event_id"]),
        "seq": m["seq"],
        "type": m["event_type"],
        "topic": m["topic"],
        "runId": str(m["run_id"]),
        "tenantId": m["tenant_id"],
        "projectId": m["project_id"],
        "stepId": _s(m["step_id"]),
        "attemptId": _s(m["attempt_id"]),
        "correlationId": m["correlation_id"],
        "causationId": m["causation_id"],
        "producer": m["producer"],
        "schemaVersion": m["schema_version"],
        "occurredAt": _iso(m["occurred_at"]),
        "payload": m["payload"],
    }


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
    conn: Connection, agent_ids: Sequence[str], limit: int = 10
) -> list[tuple[str, UUID, UUID]]:
    """Dispatched, unleased attempts for these agents, oldest first: (tenant, run, attempt)."""
    condition = attempts.c.state == "Dispatched"
    if agent_ids:
        condition = and_(condition, attempts.c.agent_id.in_(list(agent_ids)))
    rows = conn.execute(
        select(attempts.c.tenant_id, attempts.c.run_id, attempts.c.attempt_id)
        .where(condition)
        .order_by(attempts.c.dispatched_at)
        .limit(limit)
    )
    return [(r.tenant_id, r.run_id, r.attempt_id) for r in rows]


def unpublished(conn: Connection, limit: int = 500) -> list[dict[str, Any]]:
    """The oldest unpublished outbox rows, locked so a second relay skips them."""
    rows = conn.execute(
        select(outbox)
        .where(outbox.c.published_at.is_(None))
        .order_by(outbox.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return [dict(r._mapping) for r in rows]


def mark_published(conn: Connection, ids: Sequence[int], now: datetime) -> None:
    if ids:
        conn.execute(update(outbox).where(outbox.c.id.in_(list(ids))).values(published_at=now))


def active_run_counts(conn: Connection) -> dict[tuple[str, str], int]:
    rows = conn.execute(
        select(runs.c.tenant_id, runs.c.state, func.count())
        .where(runs.c.state.in_(("Accepted", "Running", "WaitingForApproval", "Cancelling")))
        .group_by(runs.c.tenant_id, runs.c.state)
    )
    return {(r[0], r[1]): int(r[2]) for r in rows}
