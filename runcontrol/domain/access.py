"""Who may do what: the published role -> operation -> scope table, and how far a caller sees.

A role grants operations; each operation needs one of the spec's scopes. A token is honoured
only where both agree: its *effective* scopes are the scopes it carries that one of its roles
grants, and an operation is allowed when a role grants the operation and the operation's scope
is effective. So a token never does more than its roles allow (an Observer token minted with
``factory.runs.write`` still cannot submit) nor more than its scopes allow (a Requester token
minted with only ``factory.runs.read`` cannot submit either).

Project scope: a caller sees and changes the runs (and their approvals and events) of the
project in its token only, unless one of its roles spans the tenant. The spec has the
Workspace admin decide across the workspace and the Platform admin break glass anywhere in it,
and surfaces runs to an operator (Uncertain outcomes, stuck cancellations) whatever their
project: those three roles span the tenant. Requester, Reviewer and Observer work inside their
project. The tenant boundary itself is row-level security's, below all of this.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

from .run import Principal
from .states import Role

RUNS_READ = "factory.runs.read"
RUNS_WRITE = "factory.runs.write"
APPROVALS_READ = "factory.approvals.read"
APPROVALS_DECIDE = "factory.approvals.decide"
RUNTIME = "factory.runtime"
WEBHOOKS_MANAGE = "factory.webhooks.manage"
POLICIES_MANAGE = "factory.policies.manage"
RUNS_OPERATE = "factory.runs.operate"
WORKFLOWS_MANAGE = "factory.workflows.manage"
ALL_SCOPES = (
    RUNS_READ,
    RUNS_WRITE,
    APPROVALS_READ,
    APPROVALS_DECIDE,
    RUNTIME,
    WEBHOOKS_MANAGE,
    POLICIES_MANAGE,
    RUNS_OPERATE,
    WORKFLOWS_MANAGE,
)


class Operation(StrEnum):
    SUBMIT_RUN = "SubmitRun"
    READ_RUNS = "ReadRuns"  # GetRun, ListRuns, the event history and stream
    CANCEL_RUN = "CancelRun"
    READ_APPROVALS = "ListApprovals"
    DECIDE_APPROVAL = "DecideApproval"
    RUNTIME = "Runtime"  # a worker's lease, approval request and outcome calls
    # Webhook subscriptions: they receive every event of the tenant, so only roles that
    # span the tenant manage them.
    MANAGE_WEBHOOKS = "ManageWebhooks"
    # Approval policy revisions (who approves what, quorum, expiry): the workspace's admins.
    MANAGE_POLICY = "ManagePolicy"
    # Run controls (suspend, resume, retry a step, resolve an attempt, rerun): the roles that
    # run the platform, which span the tenant.
    OPERATE_RUNS = "OperateRuns"
    # The workflow catalog: publish a release, move an alias (which release new submissions
    # pin): the workspace's admins. Reading the catalog is reading runs (ReadRuns).
    PUBLISH_RELEASE = "PublishRelease"


# The scope each operation needs (the spec's operations table).
OPERATION_SCOPE: Mapping[Operation, str] = {
    Operation.SUBMIT_RUN: RUNS_WRITE,
    Operation.READ_RUNS: RUNS_READ,
    Operation.CANCEL_RUN: RUNS_WRITE,
    Operation.READ_APPROVALS: APPROVALS_READ,
    Operation.DECIDE_APPROVAL: APPROVALS_DECIDE,
    Operation.RUNTIME: RUNTIME,
    Operation.MANAGE_WEBHOOKS: WEBHOOKS_MANAGE,
    Operation.MANAGE_POLICY: POLICIES_MANAGE,
    Operation.OPERATE_RUNS: RUNS_OPERATE,
    Operation.PUBLISH_RELEASE: WORKFLOWS_MANAGE,
}

_READ = frozenset({Operation.READ_RUNS, Operation.READ_APPROVALS})
_ADMIN = _READ | {
    Operation.SUBMIT_RUN,
    Operation.CANCEL_RUN,
    Operation.DECIDE_APPROVAL,
    Operation.MANAGE_WEBHOOKS,
    Operation.MANAGE_POLICY,
    Operation.OPERATE_RUNS,
    Operation.PUBLISH_RELEASE,
}

# The published table (README "Roles and scopes"). Deciding also needs the policy's approver
# rule (Reviewer, WorkspaceAdmin; PlatformAdmin only as audited break-glass): that is the
# domain's check at decision time, on top of this one.
ROLE_OPERATIONS: Mapping[Role, frozenset[Operation]] = {
    Role.OBSERVER: _READ,
    Role.REQUESTER: _READ | {Operation.SUBMIT_RUN, Operation.CANCEL_RUN},
    Role.REVIEWER: _READ | {Operation.DECIDE_APPROVAL},
    Role.OPERATOR: _READ
    | {Operation.CANCEL_RUN, Operation.MANAGE_WEBHOOKS, Operation.OPERATE_RUNS},
    Role.WORKSPACE_ADMIN: _ADMIN,
    Role.PLATFORM_ADMIN: _ADMIN,
    Role.WORKER: frozenset({Operation.RUNTIME}),
}

TENANT_WIDE_ROLES = frozenset({Role.OPERATOR, Role.WORKSPACE_ADMIN, Role.PLATFORM_ADMIN})

# Roles that review, operate or observe see every approval request in their scope; anyone
# else (a Requester) sees the requests of the runs it requested.
APPROVAL_OVERSEERS = frozenset(
    {Role.REVIEWER, Role.WORKSPACE_ADMIN, Role.PLATFORM_ADMIN, Role.OPERATOR, Role.OBSERVER}
)


def operations_of(roles: Iterable[Role]) -> frozenset[Operation]:
    return frozenset(op for role in roles for op in ROLE_OPERATIONS.get(role, ()))


def scopes_of(roles: Iterable[Role]) -> frozenset[str]:
    """The scopes the roles grant: what ``runcontrol token`` mints for them."""
    return frozenset(OPERATION_SCOPE[op] for op in operations_of(roles))


def effective_scopes(roles: Iterable[Role], token_scopes: Iterable[str]) -> frozenset[str]:
    """The token's scopes that its roles grant; any other scope it carries is ignored."""
    return frozenset(token_scopes) & scopes_of(roles)


def allows(roles: Iterable[Role], scopes: Iterable[str], operation: Operation) -> bool:
    """True when a role grants ``operation`` and the (effective) scopes hold its scope."""
    return operation in operations_of(roles) and OPERATION_SCOPE[operation] in frozenset(scopes)


def may_set_priority(roles: Iterable[Role], scopes: Iterable[str], priority: int) -> bool:
    """A run's priority above the default (issue 21) is an operator's decision: it needs the
    operations scope (``factory.runs.operate``, granted to WorkspaceAdmin and PlatformAdmin
    among the roles that submit); the default and below need nothing more than submitting."""
    return priority <= 3 or allows(roles, scopes, Operation.OPERATE_RUNS)


def project_scope(principal: Principal) -> str | None:
    """The one project the caller may see and change; None when one of its roles spans the
    tenant."""
    if principal.roles & TENANT_WIDE_ROLES:
        return None
    return principal.project_id


def approvals_visible_only_to(principal: Principal) -> str | None:
    """None if the caller may list every approval request in its scope; otherwise the subject
    whose runs' requests are the only ones it may see (a Requester sees its own runs')."""
    if principal.roles & APPROVAL_OVERSEERS:
        return None
    return principal.subject
