"""Bulk commands: many approval decisions, or many cancels, in one call.

A bulk call is its items' single commands, each made by the single command's builder
(``edge.commands``: the permission, the visibility, the command id from the caller's
idempotency key) and decided by the single command's rule in its run's grain (separation of
duties, quorum, the version, the audit of a refusal). Nothing here decides anything: it sends
the items side by side and names what each one's answer or refusal was (``ItemOutcome``). An
item's refusal never stops the others, and a retry of the call with the same idempotency key
gets each item's stored answer again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar
from uuid import UUID

from ..commands import Command
from ..domain import errors
from .errors import InsufficientScope, RateLimited, RequestInvalid, http_status

# Items sent at once: a replica's command budget (``api.max_commands_in_flight``) is shared
# with every other caller; a bulk call takes a few of it, not all.
BULK_CONCURRENCY = 8
MAX_BULK_ITEMS = 500

I = TypeVar("I")  # noqa: E741 - an item of a bulk call


class Outcome(StrEnum):
    """What became of one item. ``decided`` and ``accepted`` are the single command's success
    (a decision recorded; a cancel's intent recorded, its state observed)."""

    DECIDED = "decided"
    ACCEPTED = "accepted"
    STALE = "stale"  # the request went Stale, or the item named an older proposal
    EXPIRED = "expired"
    FORBIDDEN = "forbidden"  # the requester, outside the approver rule, no scope
    CONFLICT = "conflict"  # already decided, another version, the run has ended
    NOT_FOUND = "not-found"  # unknown, another tenant's or another project's
    INVALID = "invalid"
    RATE_LIMITED = "rate-limited"
    UNAVAILABLE = "unavailable"  # unknown whether it landed: retry with the same key


# Nearest class along the error's MRO wins (as ``edge.errors.STATUS`` does).
_OUTCOMES: dict[type[errors.RunControlError], Outcome] = {
    errors.ProposalHashMismatch: Outcome.STALE,
    errors.ApprovalGone: Outcome.EXPIRED,
    errors.Forbidden: Outcome.FORBIDDEN,
    InsufficientScope: Outcome.FORBIDDEN,
    errors.Conflict: Outcome.CONFLICT,
    errors.NotFound: Outcome.NOT_FOUND,
    errors.ValidationFailed: Outcome.INVALID,
    RequestInvalid: Outcome.INVALID,
    RateLimited: Outcome.RATE_LIMITED,
    errors.Unavailable: Outcome.UNAVAILABLE,
}


def outcome_of(error: errors.RunControlError) -> Outcome:
    if isinstance(error, errors.ApprovalGone) and error.details.get("gone") == "stale":
        return Outcome.STALE
    for cls in type(error).__mro__:
        found = _OUTCOMES.get(cls)
        if found is not None:
            return found
    return Outcome.UNAVAILABLE if error.retryable else Outcome.CONFLICT


@dataclass(frozen=True, slots=True)
class ItemOutcome:
    """One item's outcome: the single command's answer, or its refusal (the problem code, its
    HTTP status and detail, as the single call would have answered)."""

    target: UUID
    outcome: Outcome
    answer: Any = None
    code: str | None = None
    status: int | None = None
    detail: str | None = None


def distinct(targets: Sequence[UUID], what: str) -> None:
    """A bulk call names each target once (a second item for it would race the first)."""
    if len(set(targets)) != len(targets):
        raise errors.ValidationFailed(f"each {what} appears once in a bulk call", field="items")
    if len(targets) > MAX_BULK_ITEMS:
        raise errors.ValidationFailed(f"at most {MAX_BULK_ITEMS} items per call", field="items")


async def each(
    items: Sequence[I],
    target: Callable[[I], UUID],
    build: Callable[[I], Awaitable[Command[Any]]],
    send: Callable[[Command[Any]], Awaitable[Any]],
    success: Outcome,
) -> list[ItemOutcome]:
    """Build and send every item's command, ``BULK_CONCURRENCY`` at a time; the outcomes in
    the items' order."""
    gate = asyncio.Semaphore(BULK_CONCURRENCY)

    async def one(item: I) -> ItemOutcome:
        async with gate:
            try:
                answer = await send(await build(item))
            except errors.RunControlError as refusal:
                return ItemOutcome(
                    target(item),
                    outcome_of(refusal),
                    code=refusal.code,
                    status=http_status(refusal),
                    detail=str(refusal),
                )
            return ItemOutcome(target(item), success, answer)

    return list(await asyncio.gather(*(one(item) for item in items)))


def answer(
    outcomes: Sequence[ItemOutcome], target: str, shown: Callable[[Any], dict[str, Any]]
) -> dict[str, Any]:
    """A bulk call's answer: each item under its ``target`` key with its outcome, the refusal's
    code, status and detail, and ``shown(answer)`` for a success; then the counts."""
    items = [
        {
            target: o.target,
            "outcome": str(o.outcome),
            "code": o.code,
            "status": o.status,
            "detail": o.detail,
            **({} if o.answer is None else shown(o.answer)),
        }
        for o in outcomes
    ]
    return {"items": items, "counts": counts(outcomes)}


def counts(outcomes: Sequence[ItemOutcome]) -> dict[str, int]:
    """How many items had each outcome (every outcome named, zeros too)."""
    found = {str(o): 0 for o in Outcome}
    for item in outcomes:
        found[str(item.outcome)] += 1
    return found
