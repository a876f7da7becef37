"""Leases: a worker's claim of an attempt, fenced by a token that strictly increases per run
(invariant 5); a renewal extends it, and every command of a holder checks it first."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from .. import errors
from .. import events as ev
from ..machines import (
    RunCommand,
    allows,
    require,
)
from ..model import (
    Attempt,
    Lease,
)
from ..states import (
    AttemptState,
)
from .core import RunAggregate
from .values import (
    CommandContext,
    LeaseGrant,
    Options,
)


def acquire_lease(
    agg: RunAggregate, ctx: CommandContext, attempt_id: UUID, holder: str, options: Options
) -> LeaseGrant:
    attempt = agg.attempt(attempt_id)
    if not holder:
        raise errors.ValidationFailed("a lease needs a holder identity")
    if attempt.state is AttemptState.LEASED:
        lease = agg.leases[attempt_id]
        if lease.holder == holder:
            return agg.lease_grant(attempt, lease)  # a retried claim: same lease
        raise errors.LeaseHeld("the attempt is leased to another worker")
    if attempt.state.terminal:
        raise errors.LeaseRejected(
            f"the attempt is settled ({attempt.state})", attempt_id=str(attempt_id)
        )
    if attempt.state is AttemptState.PARKED:
        raise errors.LeaseRejected(
            "the attempt waits for an approval decision", attempt_id=str(attempt_id)
        )
    require(RunCommand.ACQUIRE_LEASE, agg.run.state)
    if agg.run.suspended_at is not None:
        raise errors.LeaseRejected("no new lease while the run is suspended", suspended=True)
    agg.run.fencing_seq += 1
    if agg.run.deadline_at is None and agg.run.limits.max_minutes:
        # The wall-clock budget runs from the first lease grant: work starts there.
        agg.run.deadline_at = ctx.now + timedelta(minutes=agg.run.limits.max_minutes)
    lease = agg.new(
        Lease,
        lease_id=ctx.new_id(),
        attempt_id=attempt_id,
        holder=holder,
        fencing_token=agg.run.fencing_seq,
        granted_at=ctx.now,
        expires_at=ctx.now + timedelta(seconds=options.lease_seconds),
    )
    agg.move_attempt(ctx, attempt, AttemptState.LEASED, "LeaseGranted")
    attempt.lease_id = lease.lease_id
    attempt.fencing_token = lease.fencing_token
    attempt.holder = holder
    agg.record(ctx, ev.LeaseGranted, lease, attempt)
    return agg.lease_grant(attempt, lease)


def refused(
    agg: RunAggregate,
    ctx: CommandContext,
    kind: str,
    error: errors.RunControlError,
    attempt_id: UUID,
    holder: str,
    **detail: Any,
) -> errors.RunControlError:
    """A holder's command refused: audited as ``kind`` (the attempt, the holder and
    ``detail``); answers ``error``, for the caller to raise."""
    agg.audit(ctx, kind, attempt_id=attempt_id, holder=holder, **detail)
    return error


def held_lease(
    agg: RunAggregate,
    ctx: CommandContext,
    attempt: Attempt,
    holder: str,
    token: int,
    options: Options,
    lease_id: UUID | None = None,
) -> Lease:
    """The caller's lease if it is the current one; otherwise audit and refuse (inv. 5).
    ``lease_id``, when the caller names its lease, must be the current lease's id."""
    lease = agg.leases.get(attempt.attempt_id)

    def refuse(kind: str, error: errors.RunControlError, **detail: Any) -> errors.RunControlError:
        return refused(
            agg, ctx, kind, error, attempt.attempt_id, holder, fencing_token=token, **detail
        )

    attempt_key = str(attempt.attempt_id)
    if lease is None or attempt.state is not AttemptState.LEASED:
        raise refuse(
            "lease-rejected",
            errors.StaleFencingToken(
                "the attempt has no current lease for this token", attempt_id=attempt_key
            ),
            reason="no current lease",
        )
    if token != lease.fencing_token:
        raise refuse(
            "stale-fencing-token",
            errors.StaleFencingToken(
                f"fencing token {token} is stale (current {lease.fencing_token})",
                attempt_id=attempt_key,
            ),
            current_token=lease.fencing_token,
        )
    if lease_id is not None and lease_id != lease.lease_id:
        raise refuse(
            "lease-rejected",
            errors.StaleFencingToken(
                f"lease {lease_id} is not the attempt's current lease", attempt_id=attempt_key
            ),
            reason=f"lease {lease_id} is not the current lease",
        )
    if holder != lease.holder:
        raise refuse("lease-not-held", errors.LeaseNotHeld("the caller does not hold this lease"))
    deadline = lease.expires_at + timedelta(seconds=options.renewal_grace_seconds)
    if ctx.now > deadline and allows(RunCommand.EXPIRE_LEASE, agg.run.state):
        raise refuse(
            "lease-expired", errors.LeaseExpired("the lease expired and is being reconciled")
        )
    return lease


def renew_lease(
    agg: RunAggregate,
    ctx: CommandContext,
    attempt_id: UUID,
    holder: str,
    fencing_token: int,
    options: Options,
    *,
    lease_id: UUID | None = None,
) -> LeaseGrant:
    attempt = agg.attempt(attempt_id)
    lease = held_lease(agg, ctx, attempt, holder, fencing_token, options, lease_id)
    stop = agg.stop_deadline(options)
    if stop is not None and ctx.now >= stop:
        raise refused(
            agg,
            ctx,
            "renewal-after-stop-timeout",
            errors.LeaseRejected(
                "the run was cancelled and its stop timeout has passed",
                attempt_id=str(attempt_id),
            ),
            attempt_id,
            holder,
            fencing_token=fencing_token,
        )
    full_term(agg, ctx, lease, options)
    agg.touch(ctx)
    return agg.lease_grant(attempt, lease)


def full_term(agg: RunAggregate, ctx: CommandContext, lease: Lease, options: Options) -> None:
    """The lease runs a full term from now (a renewal, or a holder's wait that ended)."""
    lease.expires_at = ctx.now + timedelta(seconds=options.lease_seconds)
    agg.changed(lease)


def release_lease(
    agg: RunAggregate, ctx: CommandContext, attempt: Attempt, cause: str
) -> Lease | None:
    lease = agg.leases.pop(attempt.attempt_id, None)
    if lease is not None:
        lease.released_at = ctx.now
        lease.release_cause = cause
        agg.changed(lease)
    return lease
