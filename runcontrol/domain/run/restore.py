"""After a restore from backup: open leases revoked, their attempts settled Uncertain."""

from __future__ import annotations

from uuid import UUID

from .. import events as ev
from ..states import (
    ApprovalState,
    AttemptState,
    RunState,
)
from .core import RunAggregate
from .settlement import emit_approval_decided, settle_unreported
from .values import (
    RESTORE_CHECK,
    RESTORED_FROM_BACKUP,
    CommandContext,
    Options,
)


def settle_restored_leases(agg: RunAggregate, ctx: CommandContext, options: Options) -> list[UUID]:
    """After the store was restored from a backup (spec, failure and recovery: "runs with
    open leases are reconciled as Uncertain and surfaced to operators"): a lease open in
    the backup may have been acted on after it was taken, by transitions the restore lost.
    Each such lease is revoked and audited, and its attempt settles ``Uncertain`` (cause
    ``restored-from-backup``); the run then goes on by its rules (invariant 6: a
    shared-write step is not retried, it fails the run for an operator). A pending approval
    of the attempt is cancelled with it. Answers the attempts settled (none: no change)."""
    settled: list[UUID] = []
    for attempt_id, lease in list(agg.leases.items()):
        attempt = agg.attempts.get(attempt_id)
        if agg.run.state.terminal or attempt is None:
            break
        if attempt.state is not AttemptState.LEASED:
            continue
        agg.audit(
            ctx,
            RESTORED_FROM_BACKUP,
            attempt_id=attempt_id,
            lease_id=lease.lease_id,
            holder=lease.holder,
            fencing_token=lease.fencing_token,
        )
        agg.record(ctx, ev.LeaseRevoked, lease, attempt, reason=RESTORED_FROM_BACKUP)
        for approval in agg.pending_approvals():
            if approval.attempt_id == attempt_id:
                agg.move_approval(ctx, approval, ApprovalState.CANCELLED, RESTORED_FROM_BACKUP)
                emit_approval_decided(agg, ctx, approval)
        if agg.run.state is RunState.WAITING_FOR_APPROVAL and not agg.pending_approvals():
            agg.move_run(ctx, RunState.RUNNING, RESTORED_FROM_BACKUP)
        settle_unreported(
            agg, ctx, attempt, options, settled_by=RESTORE_CHECK, cause=RESTORED_FROM_BACKUP
        )
        settled.append(attempt_id)
    return settled
