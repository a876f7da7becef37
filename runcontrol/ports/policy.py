"""Policy (BC-18/BC-20): revisioned documents saying which action classes need approval."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import func, select

from ..domain import PolicyDocument, Role, SideEffectClass, errors
from ..store.commit import Store
from ..store.database import Database
from ..store.notify import Listener
from ..store.tables import policies
from .cache import Immutable, TenantConfig

DEFAULT_POLICY_ID = "default"
BUILTIN_REVISION = "0"


class PolicyStore(Protocol):
    async def current(self, tenant_id: str) -> PolicyDocument: ...

    async def revision(self, tenant_id: str, policy_id: str, revision: str) -> PolicyDocument: ...


def document_to_dict(doc: PolicyDocument) -> dict[str, Any]:
    return {
        "approvalRequiredFor": sorted(str(c) for c in doc.approval_required_for),
        "approverRoles": sorted(str(r) for r in doc.approver_roles),
        "requiredApprovals": doc.required_approvals,
        "expiryHours": doc.expiry_hours,
    }


def document_from_dict(policy_id: str, revision: str, data: dict[str, Any]) -> PolicyDocument:
    try:
        return PolicyDocument(
            policy_id=policy_id,
            revision=revision,
            approval_required_for=frozenset(
                SideEffectClass(c) for c in data.get("approvalRequiredFor", [])
            ),
            approver_roles=frozenset(
                Role(r) for r in data.get("approverRoles", ["Reviewer", "WorkspaceAdmin"])
            ),
            required_approvals=int(data.get("requiredApprovals", 1)),
            expiry_hours=data.get("expiryHours"),
        )
    except (ValueError, TypeError) as exc:
        raise errors.ValidationFailed(f"invalid policy document: {exc}") from None


def _document(row: dict[str, Any]) -> PolicyDocument:
    return document_from_dict(row["policy_id"], str(row["revision"]), row["document"])


_COLUMNS = "SELECT policy_id, revision, document FROM policies"
_CURRENT = f"{_COLUMNS} WHERE policy_id = %s ORDER BY revision DESC LIMIT 1"
_REVISION = f"{_COLUMNS} WHERE policy_id = %s AND revision = %s"


class EmbeddedPolicyStore:
    """Revisions in Postgres; a tenant without one gets the built-in revision ``0``.

    ``publish`` is the (synchronous) admin path. ``current`` and ``revision`` are awaited on
    the grains' store: a revision is cached for good (revisions are immutable), the current one
    while the listener proves no newer one was published (``cache.py``)."""

    def __init__(
        self,
        db: Database,
        store: Store,
        listener: Listener | None = None,
        builtin: PolicyDocument | None = None,
    ) -> None:
        self._db = db
        self._store = store
        self._builtin = builtin or PolicyDocument(DEFAULT_POLICY_ID, BUILTIN_REVISION)
        self._current: TenantConfig[PolicyDocument] = TenantConfig(listener)
        self._revisions: Immutable[PolicyDocument] = Immutable()

    def publish(self, tenant_id: str, doc: PolicyDocument, now: datetime) -> PolicyDocument:
        with self._db.tenant(tenant_id) as conn:
            latest = conn.execute(
                select(func.max(policies.c.revision)).where(policies.c.policy_id == doc.policy_id)
            ).scalar()
            revision = (latest or 0) + 1
            conn.execute(
                policies.insert().values(
                    tenant_id=tenant_id,
                    policy_id=doc.policy_id,
                    revision=revision,
                    document=document_to_dict(doc),
                    created_at=now,
                )
            )
        self._current.forget(tenant_id)  # other processes hear it (NOTIFY, migration 0007)
        return document_from_dict(doc.policy_id, str(revision), document_to_dict(doc))

    async def current(self, tenant_id: str) -> PolicyDocument:
        async def fetch() -> PolicyDocument:
            found = await self._store.rows(tenant_id, _CURRENT, (DEFAULT_POLICY_ID,))
            return _document(found[0]) if found else self._builtin

        return await self._current.get(tenant_id, DEFAULT_POLICY_ID, fetch)

    async def revision(self, tenant_id: str, policy_id: str, revision: str) -> PolicyDocument:
        if revision == BUILTIN_REVISION and policy_id == self._builtin.policy_id:
            return self._builtin

        async def fetch() -> PolicyDocument:
            found = await self._store.rows(tenant_id, _REVISION, (policy_id, int(revision)))
            if not found:
                raise errors.NotFound(f"policy {policy_id} revision {revision} not found")
            return _document(found[0])

        return await self._revisions.get((tenant_id, policy_id, revision), fetch)
