"""Approvals: DecideApproval and ListApprovals.

Who may decide (never the requester, approver roles, break-glass with a reason) is the
domain's rule; this module only hands it the verified principal and the request's fields.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any
from uuid import UUID

from fastapi import Path, Query, Request

from schemas.api import (
    ApprovalPage,
    ApprovalView,
    BulkDecisionItem,
    BulkDecisionRequest,
    BulkDecisionResponse,
    DecisionRequest,
)

from ..domain import ApprovalState, errors
from ..domain.access import approvals_visible_only_to
from ..edge import bulk, commands
from ..edge.commands import require_visible
from ..store import queries as q
from . import routes
from .auth import ApprovalsDecider, ApprovalsReader, Caller
from .context import Cursor, PageLimit, Services, Svc, found, list_page
from .limits import MeteredDecider
from .problems import responses
from .runs import RetryKey

router = routes.router("/factory/approvals", "approvals")
# The approvals of one run, under the run's path.
runs_router = routes.router("/factory/runs", "approvals")
ApprovalStates = Annotated[list[ApprovalState] | None, Query()]


@router.post(
    "/{approvalId}/decision", response_model=ApprovalView, responses=responses(409, 410, 429, 503)
)
async def decide_approval(
    caller: MeteredDecider,
    svc: Svc,
    body: DecisionRequest,
    approval_id: Annotated[UUID, Path(alias="approvalId")],
    idempotency_key: RetryKey = None,
) -> dict[str, Any]:
    """Approve, reject or request changes on the exact proposal version.

    Scope `factory.approvals.decide`; roles Reviewer, WorkspaceAdmin, PlatformAdmin (break-glass),
    within the caller's project unless a role spans the tenant. `version` is the request version
    decided on (optimistic concurrency): a mismatch or a second decision is 409, an expired or stale
    request is 410, the run's requester is refused with 403.
    """
    command = await commands.decide_approval(
        svc.outside(caller), idempotency_key, approval_id=approval_id, **body.model_dump()
    )
    approval = await svc.send(command)
    return q.approval_view(asdict(approval))


@router.post("/decisions", response_model=BulkDecisionResponse)
async def decide_approvals(
    caller: ApprovalsDecider,
    svc: Svc,
    body: BulkDecisionRequest,
    request: Request,
    idempotency_key: RetryKey = None,
) -> dict[str, Any]:
    """Decide many approval requests at once; one outcome per item.

    Scope `factory.approvals.decide`. Each item is one DecideApproval (its approval, decision,
    version and proposal hash), decided by the same rules and audited the same way: its outcome is
    `decided` (with the approval) or the refusal the single call would have answered (`stale`,
    `expired`, `forbidden`, `conflict`, `not-found`, ...). Each item takes one command of the
    tenant's rate. A retry with the same Idempotency-Key answers every item as the first call did.
    """
    bulk.distinct([i.approval_id for i in body.items], "approval")
    outside = svc.outside(caller, meter=request.app.state.rate_limiter)

    async def build(item: BulkDecisionItem) -> Any:
        fields = item.model_dump(exclude={"approval_id"})
        return await commands.decide_approval(
            outside, idempotency_key, approval_id=item.approval_id, **fields
        )

    outcomes = await bulk.each(
        body.items, lambda i: i.approval_id, build, svc.send, bulk.Outcome.DECIDED
    )
    return bulk.answer(
        outcomes,
        "approvalId",
        lambda approval: {"approval": q.approval_view(asdict(approval))},
    )


@router.get("", response_model=ApprovalPage, responses=responses(400))
async def list_approvals(
    caller: ApprovalsReader,
    svc: Svc,
    state: ApprovalStates = None,
    run_id: Annotated[UUID | None, Query(alias="runId")] = None,
    cursor: Cursor = None,
    limit: PageLimit = 50,
) -> dict[str, Any]:
    """Pending and decided approval requests visible to the caller's roles; paged.

    Scope `factory.approvals.read`. Newest first. Reviewers, workspace and platform admins,
    operators and observers see every request in their scope (their project; the tenant for
    operators and admins); anyone else sees the requests of the runs they requested.
    """
    return await _approvals_page(caller, svc, state, run_id, cursor, limit)


async def _approvals_page(
    caller: Caller,
    svc: Services,
    state: list[ApprovalState] | None,
    run_id: UUID | None,
    cursor: str | None,
    limit: int,
) -> dict[str, Any]:
    return await list_page(
        svc,
        caller,
        q.list_approvals,
        cursor,
        limit,
        states=[str(s) for s in state or ()],
        requested_by=approvals_visible_only_to(caller.principal),
        run_id=run_id,
    )


@runs_router.get("/{runId}/approvals", response_model=ApprovalPage, responses=responses(400))
async def list_run_approvals(
    caller: ApprovalsReader,
    svc: Svc,
    run_id: Annotated[UUID, Path(alias="runId")],
    state: ApprovalStates = None,
    cursor: Cursor = None,
    limit: PageLimit = 50,
) -> dict[str, Any]:
    """The approval requests of one run (every state), newest first; paged.

    Scope `factory.approvals.read`; the visibility of ListApprovals. A run the caller may not see
    answers 404.
    """
    await require_visible(caller, svc.db, run_id, tenant_wide_too=True)
    return await _approvals_page(caller, svc, state, run_id, cursor, limit)


@router.get("/{approvalId}", response_model=ApprovalView)
async def get_approval(
    caller: ApprovalsReader,
    svc: Svc,
    approval_id: Annotated[UUID, Path(alias="approvalId")],
) -> dict[str, Any]:
    """One approval request, as ListApprovals would show it to the caller.

    Scope `factory.approvals.read`; the same visibility as ListApprovals (404 for one the caller may
    not see).
    """
    requested_by = approvals_visible_only_to(caller.principal)
    view = await svc.read_in_scope(
        caller,
        lambda conn: q.get_approval(
            conn, approval_id, project_id=caller.project_scope, requested_by=requested_by
        ),
    )
    return found(view, errors.ApprovalNotFound(f"approval {approval_id} not found"))
