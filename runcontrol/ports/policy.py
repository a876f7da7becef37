"""Policy (BC-18/BC-20): revisioned documents saying which action classes need approval."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Connection, func, select, text

from ..domain import ExpiryAction, PolicyDocument, Role, SideEffectClass, errors, limits
from ..domain.rates import RateLimits
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
    out: dict[str, Any] = {
        "approvalRequiredFor": sorted(str(c) for c in doc.approval_required_for),
        "approverRoles": sorted(str(r) for r in doc.approver_roles),
        "requiredApprovals": doc.required_approvals,
        "assignees": sorted(doc.assignees),
        "expiryHours": doc.expiry_hours,
        "expiryAction": str(doc.expiry_action),
        "maxReRequests": doc.max_re_requests,
    }
    # Absent rather than null: a revision without rate limits keeps its document as before.
    if doc.rate_limits is not None:
        out["rateLimits"] = doc.rate_limits.to_dict()
    if doc.mcp_decisions:  # likewise
        out["mcpDecisions"] = True
    return out


# A field a document leaves out takes the built-in policy's value.
_DEFAULTS = document_to_dict(PolicyDocument("x", "0"))
FIELDS = frozenset({*_DEFAULTS, "rateLimits", "mcpDecisions"})


def document_from_dict(policy_id: str, revision: str, data: dict[str, Any]) -> PolicyDocument:
    """A policy document from its JSON form (a file, a request body, a stored revision);
    anything malformed is ``ValidationFailed`` naming the field."""
    if not isinstance(data, dict):
        raise errors.ValidationFailed("a policy document is a JSON object")
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise errors.ValidationFailed(
            f"unknown policy fields: {', '.join(unknown)} (known: {', '.join(sorted(FIELDS))})"
        )
    try:
        assignees = _list(data, "assignees", [])
        if len(assignees) > limits.MAX_ASSIGNEES:
            raise ValueError(f"assignees names at most {limits.MAX_ASSIGNEES} subjects")
        expiry_hours = data.get("expiryHours")
        if expiry_hours is not None:
            limits.number(expiry_hours, "expiryHours", 0, limits.MAX_EXPIRY_HOURS, above=True)
        return PolicyDocument(
            policy_id=policy_id,
            revision=revision,
            approval_required_for=frozenset(
                SideEffectClass(c)
                for c in _list(data, "approvalRequiredFor", _DEFAULTS["approvalRequiredFor"])
            ),
            approver_roles=frozenset(
                Role(r) for r in _list(data, "approverRoles", _DEFAULTS["approverRoles"])
            ),
            required_approvals=limits.integer(
                data.get("requiredApprovals", 1), "requiredApprovals", 1, limits.MAX_APPROVALS
            ),
            assignees=frozenset(limits.name(a, "assignees[]") for a in assignees),
            expiry_hours=expiry_hours,
            expiry_action=ExpiryAction(data.get("expiryAction", "fail")),
            max_re_requests=limits.integer(
                data.get("maxReRequests", 3), "maxReRequests", 0, limits.MAX_RE_REQUESTS
            ),
            rate_limits=(
                None if data.get("rateLimits") is None else RateLimits.from_dict(data["rateLimits"])
            ),
            mcp_decisions=_flag(data, "mcpDecisions"),
        )
    except errors.ValidationFailed as exc:
        raise errors.ValidationFailed(f"invalid policy document: {exc}", **exc.details) from None
    except (ValueError, TypeError) as exc:
        raise errors.ValidationFailed(f"invalid policy document: {exc}") from None


def _list(data: dict[str, Any], name: str, default: list[str]) -> list[Any]:
    value = data.get(name, default)
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a list of strings")
    return value


def _flag(data: dict[str, Any], name: str) -> bool:
    value = data.get(name, False)
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false")
    return value


def publish_policy(
    db: Database, tenant_id: str, doc: PolicyDocument, now: datetime
) -> PolicyDocument:
    """Store ``doc`` as the tenant's next revision of its policy (revisions are immutable;
    runs keep the revision they were accepted with). Every process's cache hears of it by
    NOTIFY (migration 0007)."""
    with db.tenant(tenant_id) as conn:
        conn.execute(
            text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": f"policy:{tenant_id}"}
        )
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
    return document_from_dict(doc.policy_id, str(revision), document_to_dict(doc))


def current_policy(conn: Connection, builtin: PolicyDocument | None = None) -> PolicyDocument:
    """The tenant's current revision (``conn`` is in the tenant), or the built-in one."""
    row = (
        conn.execute(
            select(policies.c.policy_id, policies.c.revision, policies.c.document)
            .where(policies.c.policy_id == DEFAULT_POLICY_ID)
            .order_by(policies.c.revision.desc())
            .limit(1)
        )
        .mappings()
        .first()
    )
    if row is None:
        return builtin or PolicyDocument(DEFAULT_POLICY_ID, BUILTIN_REVISION)
    return _document(dict(row))


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
        published = publish_policy(self._db, tenant_id, doc, now)
        self._current.forget(tenant_id)  # other processes hear it (NOTIFY, migration 0007)
        return published

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
