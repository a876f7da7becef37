"""The tenant's approval policy: publish a revision (WorkspaceAdmin, PlatformAdmin: scope
``factory.policies.manage``) and read the current one (anyone who reads approvals).

Revisions are immutable and numbered per tenant; a run keeps the revision it was accepted with,
so a new revision applies to runs submitted after it. Every process's policy cache hears of it
by NOTIFY (migration 0007). ``runcontrol policy FILE --tenant T`` publishes the same JSON.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from fastapi import Response

from schemas.api import PolicyRequest, PolicyView

from ..ports import policy
from ..ports.policy import DEFAULT_POLICY_ID, current_policy, document_from_dict, document_to_dict
from . import routes
from .auth import ApprovalsReader, PolicyManager
from .context import Svc, location

router = routes.router("/factory/policies", "policies")


def _view(policy_id: str, revision: str, document: dict[str, Any]) -> dict[str, Any]:
    return {"policyId": policy_id, "revision": revision, "document": document}


@router.post("", status_code=201, response_model=PolicyView)
async def publish_policy(
    caller: PolicyManager, svc: Svc, body: PolicyRequest, response: Response
) -> dict[str, Any]:
    """Publish the tenant's next approval policy revision.

    Scope `factory.policies.manage`; roles WorkspaceAdmin, PlatformAdmin. Applies to runs submitted
    from now on; running runs keep their pinned revision.
    """
    doc = document_from_dict(DEFAULT_POLICY_ID, "", body.model_dump(by_alias=True))
    published = await asyncio.to_thread(
        policy.publish_policy, svc.db, caller.tenant_id, doc, datetime.now(UTC)
    )
    response.headers["Location"] = location(router.prefix, "current")
    return _view(published.policy_id, published.revision, document_to_dict(published))


@router.get("/current", response_model=PolicyView)
async def get_current_policy(caller: ApprovalsReader, svc: Svc) -> dict[str, Any]:
    """The approval policy new runs of the tenant are pinned to.

    Scope `factory.approvals.read`. Revision `0` is the built-in default (no revision published
    yet).
    """
    doc = await svc.read_in_tenant(caller, current_policy)
    return _view(doc.policy_id, doc.revision, document_to_dict(doc))
