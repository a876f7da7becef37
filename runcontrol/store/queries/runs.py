"""Tenant reads of runs (row-level security applies): one run whole, a page of them, a run's
input and result; and the keyset paging the lists share."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Required, TypedDict, Unpack
from uuid import UUID

from sqlalchemy import ColumnElement, Connection, String, and_, cast, func, or_, select, tuple_

from ...domain.flow import held_label
from ...domain.hashing import result_hash as result_hash_of
from ..tables import (
    approval_requests,
    attempt_results,
    attempts,
    journaled_calls,
    leases,
    runs,
    steps,
)
from .views import ATTEMPT, CALL, CHILD, LEASE, STEP, approval_view, render, run_summary


def in_project(project_id: str | None) -> list[ColumnElement[bool]]:
    return [] if project_id is None else [runs.c.project_id == project_id]


def run_visible(conn: Connection, run_id: UUID, *, project_id: str | None) -> bool:
    """True when the run exists in this tenant and, if given, in ``project_id``."""
    found = conn.execute(
        select(runs.c.run_id).where(runs.c.run_id == run_id, *in_project(project_id))
    ).first()
    return found is not None


def get_run(
    conn: Connection, run_id: UUID, *, project_id: str | None = None
) -> dict[str, Any] | None:
    """A run with its steps, attempts, current leases, journaled calls (hash and size, not
    content) and pending approvals; None when it is not in this tenant or (``project_id``) not
    in that project."""
    row = conn.execute(select(runs).where(runs.c.run_id == run_id, *in_project(project_id))).first()
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
        attempt = render(m, ATTEMPT)
        attempt["lease"] = None if lease is None else render(lease, LEASE)
        by_step.setdefault(m["step_id"], []).append(attempt)
    calls = step_calls(conn, run_id)
    view["steps"] = [
        {
            **render(r._mapping, STEP),
            "heldReason": held_label(r._mapping["held"]),
            "result": None if r.result_json is None else json.loads(r.result_json),
            "attempts": by_step.get(r.step_id, []),
            "calls": calls.get(r.step_id, []),
        }
        for r in conn.execute(
            select(steps).where(steps.c.run_id == run_id).order_by(steps.c.ordinal)
        )
    ]
    view["children"] = [
        render(r._mapping, CHILD)
        for r in conn.execute(
            select(runs)
            .where(runs.c.parent_run_id == run_id)
            .order_by(runs.c.created_at, runs.c.run_id)
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


def step_calls(conn: Connection, run_id: UUID) -> dict[UUID, list[dict[str, Any]]]:
    """The run's journaled calls by step, oldest first: name, occurrence, hash, size, when,
    and whether the call failed; never their content (it is not read)."""
    c = journaled_calls
    columns = [c.c[name] for _, name in CALL]
    found: dict[UUID, list[dict[str, Any]]] = {}
    query = (
        select(c.c.step_id, c.c.error.is_not(None).label("failed"), *columns)
        .where(c.c.run_id == run_id)
        .order_by(c.c.recorded_at, c.c.name, c.c.occurrence)
    )
    for r in conn.execute(query):
        call = render(r._mapping, CALL)
        call["failed"] = r.failed
        found.setdefault(r.step_id, []).append(call)
    return found


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
    if found is None:  # a step no worker executes holds its own (a signal's body, a child's)
        held = conn.execute(
            select(steps.c.result_json).where(
                steps.c.run_id == run_id, steps.c.result_json.is_not(None)
            )
        )
        text = next((t for (t,) in held if result_hash_of(t) == result_hash), None)
        return (None, None) if text is None else (json.loads(text), None)
    content = None if found.result_json is None else json.loads(found.result_json)
    return content, found.result_ref


def run_input(conn: Connection, run_id: UUID) -> dict[str, Any] | None:
    """The run's input (what a claim hands its worker with the lease)."""
    found = conn.execute(select(runs.c.input).where(runs.c.run_id == run_id)).first()
    return None if found is None else found.input


def encode_cursor(created_at: datetime, key: str) -> str:
    raw = json.dumps([created_at.isoformat(), key]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    padded = cursor + "=" * (-len(cursor) % 4)
    created, key = json.loads(base64.urlsafe_b64decode(padded))
    return datetime.fromisoformat(created), str(key)


@dataclass(frozen=True, slots=True)
class RunContext:
    """Filters of A2A's ListTasks: the context (a run's correlation id, else its id) and
    runs updated after a time."""

    correlation_id: str | None = None
    updated_after: datetime | None = None


class RunFilters(TypedDict, total=False):
    """Which runs ``list_runs`` pages through and ``count_runs`` counts: those of
    ``project_id`` (None: the tenant's), in ``states``, of ``workflow_id``; ``parent_run_id``:
    a run's children only; ``context``: an A2A ListTasks' filters."""

    project_id: Required[str | None]
    states: Sequence[str]
    workflow_id: str | None
    parent_run_id: UUID | None
    context: RunContext | None
    replays: str  # exclude (the default), only, include: replay runs (docs/replay.md)


def list_runs(
    conn: Connection, *, cursor: str | None = None, limit: int = 50, **filters: Unpack[RunFilters]
) -> tuple[list[dict[str, Any]], str | None]:
    """Newest first, keyset-paged on (created_at, run_id)."""
    return page(conn, runs, runs.c.run_id, _run_filters(filters), cursor, limit, run_summary)


def _run_filters(filters: RunFilters) -> list[ColumnElement[bool]]:
    conditions = in_project(filters["project_id"])
    context, states = filters.get("context"), filters.get("states")
    workflow_id, parent_run_id = filters.get("workflow_id"), filters.get("parent_run_id")
    if context is not None and context.correlation_id is not None:
        # A run's context: its correlation id, else its own id (a2a.tasks.context_id).
        own = and_(
            runs.c.correlation_id.is_(None), cast(runs.c.run_id, String) == context.correlation_id
        )
        conditions.append(or_(runs.c.correlation_id == context.correlation_id, own))
    if context is not None and context.updated_after is not None:
        conditions.append(runs.c.updated_at > context.updated_after)
    if states:
        conditions.append(runs.c.state.in_(list(states)))
    if workflow_id:
        conditions.append(runs.c.workflow_id == workflow_id)
    if parent_run_id is not None:
        conditions.append(runs.c.parent_run_id == parent_run_id)
    replays = filters.get("replays", "exclude")
    if replays == "exclude":
        conditions.append(runs.c.replay_of.is_(None))
    elif replays == "only":
        conditions.append(runs.c.replay_of.is_not(None))
    return conditions


def count_runs(conn: Connection, **filters: Unpack[RunFilters]) -> int:
    """How many runs ``list_runs`` would page through with these filters."""
    conditions = _run_filters(filters)
    return int(conn.execute(select(func.count()).select_from(runs).where(*conditions)).scalar_one())


def page(
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
