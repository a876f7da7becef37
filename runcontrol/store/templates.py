"""Run templates in PostgreSQL (migration 0032, issue 44): a row per version, read and written
on ``Database.tenant()`` connections (row-level security: the tenant, and for a caller bound
to a project, its project). A version's content is written once; its state, decision and use
count change. ``lock``: the row ``FOR UPDATE``, so two decisions (or a decision and a revoke) of
one version are taken one after the other. A version's uses are counted per pre-approval in
``template_uses`` (migration 0036), by the statement that writes the template's vote, guarded
by the pre-approval's maxUses (``runcontrol_template_use``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ..domain.templates import Pinned, Template, TemplateState, from_dict
from .queries.views import api_view, render
from .tables import audit_log, run_templates, template_uses

VIEW = api_view(
    (c for c in run_templates.c.keys() if c not in ("tenant_id", "content", "project_id")),
)
_t = run_templates.c
_u = template_uses.c
_OF_VERSION = (
    _u.tenant_id == _t.tenant_id,
    _u.template_id == _t.template_id,
    _u.version == _t.version,
)
# A version's uses, all its pre-approvals' (the view's).
USES = (
    select(func.coalesce(func.sum(_u.uses), 0)).where(*_OF_VERSION).scalar_subquery().label("uses")
)
# The grain's read of a run's pinned version (``RunGrain.pinned_template``), with the uses of
# each of its pre-approvals (``pinned``).
PINNED = (
    "SELECT t.*, (SELECT jsonb_object_agg(u.pre_approval, u.uses) FROM template_uses u "
    "WHERE u.tenant_id = t.tenant_id AND u.template_id = t.template_id "
    "AND u.version = t.version) AS uses "
    "FROM run_templates t WHERE t.template_id = %s AND t.version = %s"
)
# What changes of a version after it is written.
_STATE = ("state", "decided_by", "decided_at", "reason", "break_glass")


def view(template: Template, uses: int) -> dict[str, Any]:
    """The API's view of one version: its columns, its uses and its content."""
    row = _row(template, template.created_at)
    return {**render(row, VIEW), "uses": uses, **template.document()}


def _row(template: Template, now: datetime) -> dict[str, Any]:
    return {
        "template_id": template.template_id,
        "version": template.version,
        "tenant_id": template.tenant_id,
        "project_id": template.project_id,
        "workflow_id": template.workflow_id,
        "release_alias": template.release_alias,
        "content_hash": template.content_hash,
        "content": template.document(),
        "created_by": template.created_by,
        "created_at": template.created_at,
        "updated_at": now,
        **{c: getattr(template, c) for c in _STATE},
    }


def template_of(m: Any) -> Template:
    """A stored version as the domain's, its content read back as it was written."""
    template = from_dict(
        m["content"],
        tenant_id=m["tenant_id"],
        project_id=m["project_id"],
        template_id=m["template_id"],
        version=m["version"],
        author=m["created_by"],
        now=m["created_at"],
        stored=True,
    )
    template.state = TemplateState(m["state"])
    for column in _STATE[1:]:
        setattr(template, column, m[column])
    return template


def pinned(row: Mapping[str, Any]) -> Pinned:
    """A ``PINNED`` row as the grain's: the version, and each pre-approval's uses in order."""
    template = template_of(row)
    uses = row["uses"] or {}
    return Pinned(template, tuple(uses.get(str(i), 0) for i in range(len(template.pre_approvals))))


def insert(conn: Connection, template: Template, now: datetime) -> None:
    conn.execute(pg_insert(run_templates).values(**_row(template, now)))


def audit(conn: Connection, template: Template, kind: str, actor: str, now: datetime) -> None:
    """The audit entry of what ``actor`` did to a version (``template-proposed``,
    ``-decided``, ``-revoked``; a break-glass decision says so), in the same transaction."""
    detail = {
        "templateId": template.template_id,
        "version": template.version,
        "contentHash": template.content_hash,
        "state": str(template.state),
        "reason": template.reason,
        "breakGlass": template.break_glass,
    }
    values = {"kind": kind, "actor": actor, "detail": detail, "occurred_at": now}
    conn.execute(audit_log.insert().values(tenant_id=template.tenant_id, run_id=None, **values))


def save_state(conn: Connection, template: Template, now: datetime) -> None:
    """A version's decision, revocation or supersession."""
    t = run_templates.c
    conn.execute(
        update(run_templates)
        .where(t.template_id == template.template_id, t.version == template.version)
        .values(updated_at=now, **{c: getattr(template, c) for c in _STATE})
    )


def latest(
    conn: Connection, template_id: str, version: int | None = None, *, lock: bool = False
) -> tuple[Template, int] | None:
    """A version (the newest when ``version`` is None) and its uses."""
    t = run_templates.c
    stmt = select(run_templates, USES).where(t.template_id == template_id)
    if version is not None:
        stmt = stmt.where(t.version == version)
    stmt = stmt.order_by(t.version.desc()).limit(1)
    row = conn.execute(stmt.with_for_update() if lock else stmt).first()
    return None if row is None else (template_of(row._mapping), row.uses)


def versions(conn: Connection, *, cursor: datetime | None, limit: int) -> list[dict[str, Any]]:
    """Every version in scope, oldest first."""
    t = run_templates.c
    stmt = select(run_templates, USES).order_by(t.created_at, t.template_id, t.version)
    stmt = stmt.limit(limit)
    if cursor is not None:
        stmt = stmt.where(t.created_at > cursor)
    return [view(template_of(r._mapping), r.uses) for r in conn.execute(stmt)]
