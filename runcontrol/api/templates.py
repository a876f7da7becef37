"""Run templates (issue 44, docs/templates.md): create (``Proposed``), list, show, decide
(``Active`` or ``Rejected``), revoke, edit (a new version, ``Proposed`` again).

A template is tenant data under row-level security, seen and changed within the caller's
project unless a role spans the tenant (another tenant's is 404). Creating and editing need the
permission to submit runs; deciding and revoking the permission to decide approvals. The rules
are ``domain.templates``'; each write locks the version it changes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Path, Query, Response
from sqlalchemy import Connection

from schemas.api import (
    CreateTemplateRequest,
    RevokeTemplateRequest,
    TemplateDecisionRequest,
    TemplatePage,
    TemplateRequest,
    TemplateView,
    id_check,
)

from ..commands import TemplateRef
from ..domain import Limits, errors
from ..domain import templates as rules
from ..domain.templates import Template, TemplateState
from ..edge.auth import Caller
from ..store import templates as store
from . import routes
from .auth import ApprovalsDecider, RunsReader, RunSubmitter
from .context import Services, Svc, location
from .problems import responses

router = routes.router("/factory/templates", "templates")
TemplateIdPath = Annotated[
    str, Path(alias="templateId", min_length=1, max_length=200), id_check(segment=True)
]


def _version(conn: Connection, template_id: str) -> tuple[Template, int]:
    """The newest version, locked; another tenant's or project's is not found."""
    got = store.latest(conn, template_id, lock=True)
    if got is None:
        raise errors.TemplateNotFound(f"template {template_id} not found")
    return got


async def _change(
    caller: Caller,
    svc: Services,
    template_id: str,
    kind: str,
    change: Callable[[Template, datetime], None],
) -> dict[str, Any]:
    """The newest version, locked, changed by ``change`` (a decision, a revocation), saved
    with its audit entry (``kind``)."""
    now = datetime.now(UTC)

    def write(conn: Connection) -> dict[str, Any]:
        template, uses = _version(conn, template_id)
        change(template, now)
        store.save_state(conn, template, now)
        store.audit(conn, template, kind, caller.principal.subject, now)
        return store.view(template, uses)

    return await svc.read_in_scope(caller, write)


async def submission(
    svc: Services, caller: Caller, template_id: str, fields: dict[str, Any], limits: Limits
) -> Limits:
    """A run submitted from a template (``POST /factory/runs`` with ``templateId``): its newest
    version, Active, of the same workflow; ``fields`` get the input merged onto its defaults
    and checked (422 naming the failed rule), its alias unless the body names a release, and
    the version the run pins. Answers the limits: the body's, else the template's."""
    got = await svc.read_in_scope(caller, lambda conn: store.latest(conn, template_id))
    if got is None:
        raise errors.TemplateNotFound(f"template {template_id} not found")
    template = got[0]
    if template.state is not TemplateState.ACTIVE:
        raise errors.Conflict(f"template {template.reference} is {template.state}, not Active")
    if fields["workflow_id"] != template.workflow_id:
        raise errors.ValidationFailed(f"template {template_id} runs {template.workflow_id}")
    fields["input"] = rules.submission_input(template, fields["input"])
    if fields["release_alias"] is None and fields["release_id"] is None:
        fields["release_alias"] = template.release_alias
    fields["template"] = TemplateRef(template.template_id, template.version)
    if limits != Limits():
        return limits
    given = template.limits
    return Limits(max_cost_usd=given.get("maxCostUsd"), max_minutes=given.get("maxMinutes"))


def _content(body: TemplateRequest) -> dict[str, Any]:
    return body.model_dump(mode="json", by_alias=True, exclude={"template_id"})


@router.post("", status_code=201, response_model=TemplateView, responses=responses(409))
async def create_template(
    caller: RunSubmitter, svc: Svc, body: CreateTemplateRequest, response: Response
) -> dict[str, Any]:
    """A new template, `Proposed` until a Reviewer or WorkspaceAdmin other than its author
    decides it.

    Scope `factory.runs.write`. A bad input schema, proposal schema or expression is 422 and
    nothing is stored; an existing template id is 409 (edit it instead).
    """
    now = datetime.now(UTC)
    template = rules.from_dict(
        _content(body),
        tenant_id=caller.tenant_id,
        project_id=caller.principal.project_id,
        template_id=body.template_id,
        version=1,
        author=caller.principal.subject,
        now=now,
    )

    def create(conn: Connection) -> dict[str, Any]:
        if store.latest(conn, body.template_id) is not None:
            raise errors.Conflict(f"template {body.template_id} exists: edit it")
        store.insert(conn, template, now)
        store.audit(conn, template, "template-proposed", template.created_by, now)
        return store.view(template, 0)

    created = await svc.read_in_scope(caller, create)
    response.headers["Location"] = location(router.prefix, body.template_id)
    return created


@router.get("", response_model=TemplatePage)
async def list_templates(
    caller: RunsReader,
    svc: Svc,
    cursor: Annotated[datetime | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> dict[str, Any]:
    """Every template version in the caller's scope, oldest first; paged.

    Scope `factory.runs.read`.
    """
    items = await svc.read_in_scope(
        caller, lambda conn: store.versions(conn, cursor=cursor, limit=limit)
    )
    return {"items": items, "nextCursor": items[-1]["createdAt"] if len(items) == limit else None}


@router.get("/{templateId}", response_model=TemplateView)
async def get_template(
    caller: RunsReader,
    svc: Svc,
    template_id: TemplateIdPath,
    version: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
) -> dict[str, Any]:
    """A template's newest version (or `version`), with its state and uses.

    Scope `factory.runs.read`. Another tenant's or project's template is 404.
    """

    def read(conn: Connection) -> dict[str, Any]:
        got = store.latest(conn, template_id, version)
        if got is None:
            raise errors.TemplateNotFound(f"template {template_id} not found")
        return store.view(*got)

    return await svc.read_in_scope(caller, read)


@router.post("/{templateId}/decision", response_model=TemplateView, responses=responses(409))
async def decide_template(
    caller: ApprovalsDecider, svc: Svc, template_id: TemplateIdPath, body: TemplateDecisionRequest
) -> dict[str, Any]:
    """Approve (`Active`) or reject a `Proposed` version, bound to its version and content
    hash.

    Scope `factory.approvals.decide`. Never its author (403); a PlatformAdmin outside the
    approver roles decides only as break-glass with a reason (audited on the version).
    """

    def decide(template: Template, now: datetime) -> None:
        rules.decide(
            template,
            caller.principal.subject,
            caller.principal.roles,
            body.decision,
            body.version,
            body.content_hash,
            body.reason,
            now,
        )

    return await _change(caller, svc, template_id, "template-decided", decide)


@router.post("/{templateId}/revocation", response_model=TemplateView, responses=responses(409))
async def revoke_template(
    caller: ApprovalsDecider, svc: Svc, template_id: TemplateIdPath, body: RevokeTemplateRequest
) -> dict[str, Any]:
    """Revoke the newest version at once: from now on it pre-approves nothing.

    Scope `factory.approvals.decide`.
    """
    revoke = lambda t, _: rules.revoke(t, body.reason)  # noqa: E731
    return await _change(caller, svc, template_id, "template-revoked", revoke)


@router.put("/{templateId}", response_model=TemplateView, responses=responses(409))
async def edit_template(
    caller: RunSubmitter, svc: Svc, template_id: TemplateIdPath, body: TemplateRequest
) -> dict[str, Any]:
    """A new version of the template's content, `Proposed`: it needs a decision of its own;
    the version it replaces is `Superseded` (it pre-approves nothing from now on).

    Scope `factory.runs.write`. A bad schema or expression is 422, nothing stored.
    """
    now = datetime.now(UTC)

    def edit(conn: Connection) -> dict[str, Any]:
        template, _ = _version(conn, template_id)
        new = rules.edit(template, _content(body), caller.principal.subject, now)
        store.save_state(conn, template, now)
        store.insert(conn, new, now)
        store.audit(conn, new, "template-proposed", new.created_by, now)
        return store.view(new, 0)

    return await svc.read_in_scope(caller, edit)
