"""Who may see what, beyond the tenant boundary that row-level security already draws."""

from __future__ import annotations

from .run import Principal
from .states import Role

# Roles that review or operate: they see every approval request of their tenant.
APPROVAL_OVERSEERS = frozenset(
    {Role.REVIEWER, Role.WORKSPACE_ADMIN, Role.PLATFORM_ADMIN, Role.OPERATOR, Role.OBSERVER}
)


def approvals_visible_only_to(principal: Principal) -> str | None:
    """None if the caller may list all approval requests of the tenant; otherwise the subject
    whose runs' requests are the only ones it may see (a Requester sees its own runs')."""
    if principal.roles & APPROVAL_OVERSEERS:
        return None
    return principal.subject
