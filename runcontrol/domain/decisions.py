"""What every decision keeps, a run approval's and a template's (issue 44): bound to the
version and the content hash it was read at; a decider outside the approver rule only as a
PlatformAdmin's break-glass with a reason."""

from __future__ import annotations

from . import errors
from .states import Role


def bound_to(version: int, current: int, content_hash: str, current_hash: str, what: str) -> None:
    """A decision names the version and the content hash it was read at: refuse another."""
    if version != current:
        raise errors.ApprovalVersionMismatch(
            f"{what} version is {current}, not {version}", current_version=current
        )
    if content_hash != current_hash:
        raise errors.ProposalHashMismatch(f"the decision is for another {what} content")


def outside_rule(eligible: bool, roles: frozenset[Role], reason: str | None, rule: str) -> bool:
    """Whether a decider outside the approver rule decides as break-glass (a PlatformAdmin
    with a reason, audited); anyone else outside it is refused (``rule`` says why)."""
    if eligible:
        return False
    if Role.PLATFORM_ADMIN not in roles:
        raise errors.Forbidden(rule)
    if not (reason and reason.strip()):
        raise errors.BreakGlassReasonRequired("break-glass decisions require a reason")
    return True
