"""Tenant reads of approval requests: a page of them, one, and the run one belongs to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from sqlalchemy import ColumnElement, Connection, select

from ..tables import approval_requests, runs
from .runs import in_project, page
from .views import approval_view


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
    return page(conn, t, t.c.approval_id, conditions, cursor, limit, approval_view)


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
        .where(t.c.approval_id == approval_id, *in_project(project_id))
    )
    if requested_by is not None:
        query = query.where(t.c.requested_by == requested_by)
    row = conn.execute(query).first()
    return None if row is None else approval_view(row._mapping)


def approval_run(
    conn: Connection, approval_id: UUID, *, project_id: str | None = None
) -> UUID | None:
    """The run of an approval request in this tenant and (``project_id``) in that project."""
    t = approval_requests
    return conn.execute(
        select(t.c.run_id)
        .join(runs, runs.c.run_id == t.c.run_id)
        .where(t.c.approval_id == approval_id, *in_project(project_id))
    ).scalar_one_or_none()
