"""After a restore from backup: open leases revoked, their attempts settled Uncertain."""

from __future__ import annotations

from uuid import UUID

from .. import events as ev
from ..states import (
    ApprovalState,
    AttemptOutcome,
    AttemptState,
    FailureClass,
    RunState,
)
from .settlement import Settlement
from .values import (
    RESTORE_CHECK,
    RESTORED_FROM_BACKUP,
    CommandContext,
    Options,
)


class Restore(Settlement):
    def settle_restored_leases(self, ctx: CommandContext, options: Options) -> list[UUID]:
        """After the store was restored from a backup (spec, failure and recovery: "runs with
        open leases are reconciled as Uncertain and surfaced to operators"): a lease open in
        the backup may have been acted on after it was taken, by transitions the restore lost.
        Each such lease is revoked and audited, and its attempt settles ``Uncertain`` (cause
        ``restored-from-backup``); the run then goes on by its rules (invariant 6: a
        shared-write step is not retried, it fails the run for an operator). A pending approval
        of the attempt is cancelled with it. Answers the attempts settled (none: no change)."""
        settled: list[UUID] = []
        for attempt_id, lease in list(self.leases.items()):
            attempt = self.attempts.get(attempt_id)
            if self.run.state.terminal or attempt is None:
                break
            if attempt.state is not AttemptState.LEASED:
                continue
            self._audit(
                ctx,
                RESTORED_FROM_BACKUP,
                attempt_id=attempt_id,
                lease_id=lease.lease_id,
                holder=lease.holder,
                fencing_token=lease.fencing_token,
            )
            revoked = ev.LeaseRevoked(
                attempt_id=attempt_id,
                lease_id=lease.lease_id,
                holder=lease.holder,
                fencing_token=lease.fencing_token,
                reason=RESTORED_FROM_BACKUP,
            )
            self._emit(ctx, revoked, step_id=attempt.step_id, attempt_id=attempt_id)
            for approval in self.pending_approvals():
                if approval.attempt_id == attempt_id:
                    self._move_approval(
                        ctx, approval, ApprovalState.CANCELLED, RESTORED_FROM_BACKUP
                    )
                    self._emit_approval_decided(ctx, approval)
            if self.run.state is RunState.WAITING_FOR_APPROVAL and not self.pending_approvals():
                self._move_run(ctx, RunState.RUNNING, RESTORED_FROM_BACKUP)
            self._settle(
                ctx,
                attempt,
                AttemptOutcome.UNCERTAIN,
                FailureClass.UNCERTAIN,
                None,
                settled_by=RESTORE_CHECK,
                cause=RESTORED_FROM_BACKUP,
            )
            self._after_settled(ctx, attempt, options)
            settled.append(attempt_id)
        return settled
