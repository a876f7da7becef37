"""Outcomes: the lease holder's one report per attempt (invariant 5), and the lease expiry
reconciler's settlement of an attempt nobody reported (invariant 6 for side effects)."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from .. import errors
from .. import events as ev
from ..hashing import is_hash
from ..machines import (
    RunCommand,
    allows,
)
from ..model import (
    Attempt,
)
from ..states import (
    AttemptOutcome,
    AttemptState,
    FailureClass,
    SideEffectClass,
)
from .settlement import Settlement
from .values import (
    WORKER_OUTCOMES,
    CommandContext,
    Options,
    failure_class_for,
)


class Outcomes(Settlement):
    def report_outcome(
        self,
        ctx: CommandContext,
        attempt_id: UUID,
        holder: str,
        fencing_token: int,
        outcome: AttemptOutcome,
        options: Options,
        *,
        failure_class: FailureClass | None = None,
        outcome_hash: str | None = None,
        lease_id: UUID | None = None,
    ) -> Attempt:
        attempt = self.attempt(attempt_id)
        if outcome not in WORKER_OUTCOMES:
            raise errors.ValidationFailed(f"a worker cannot report {outcome}")
        if outcome_hash is not None and not is_hash(outcome_hash):
            raise errors.ValidationFailed("outcomeHash must be a sha256 canonical hash")
        failure_class = failure_class_for(outcome, failure_class)
        if attempt.state.terminal:
            if (
                attempt.settled_by == holder
                and attempt.fencing_token == fencing_token
                and attempt.outcome is outcome
                and attempt.outcome_hash == outcome_hash
                and attempt.failure_class == failure_class
            ):
                return attempt  # the same report retried (at-least-once delivery): no effect
            if attempt.settled_by == holder and attempt.fencing_token == fencing_token:
                self._audit(
                    ctx,
                    "duplicate-outcome",
                    attempt_id=attempt_id,
                    holder=holder,
                    fencing_token=fencing_token,
                    outcome=str(outcome),
                )
                raise errors.OutcomeAlreadyRecorded(
                    "this attempt already has its outcome", attempt_id=str(attempt_id)
                )
            self._audit(
                ctx,
                "stale-fencing-token",
                attempt_id=attempt_id,
                holder=holder,
                fencing_token=fencing_token,
                reason=f"attempt settled as {attempt.state}",
            )
            raise errors.StaleFencingToken(
                f"the attempt was settled as {attempt.state}; this lease is stale",
                attempt_id=str(attempt_id),
            )
        self._held_lease(ctx, attempt, holder, fencing_token, options, lease_id)
        if any(a.attempt_id == attempt_id for a in self.pending_approvals()):
            raise errors.IllegalTransition(
                "the attempt awaits an approval decision; report after the decision"
            )
        self._settle(ctx, attempt, outcome, failure_class, outcome_hash, settled_by=holder)
        self._after_settled(ctx, attempt, options)
        return attempt

    def expire_lease(self, ctx: CommandContext, attempt_id: UUID, options: Options) -> bool:
        """LeaseExpiryReconciler: settle an attempt whose lease passed expiry + grace."""
        attempt = self.attempts.get(attempt_id)
        lease = self.leases.get(attempt_id)
        if attempt is None or lease is None or attempt.state is not AttemptState.LEASED:
            return False
        if not allows(RunCommand.EXPIRE_LEASE, self.run.state):
            return False  # the lease is suspended while a human decides
        if ctx.now <= lease.expires_at + timedelta(seconds=options.renewal_grace_seconds):
            return False
        step = self.step(attempt.step_id)
        side_effecting = step.side_effect_class.at_least(SideEffectClass.SHARED_WRITE)
        self._emit(
            ctx,
            ev.LeaseExpired(
                attempt_id=attempt_id,
                lease_id=lease.lease_id,
                holder=lease.holder,
                fencing_token=lease.fencing_token,
            ),
            step_id=step.step_id,
            attempt_id=attempt_id,
        )
        if side_effecting:  # invariant 6: the side effect may have happened
            outcome, failure, cause = (
                AttemptOutcome.UNCERTAIN,
                FailureClass.UNCERTAIN,
                "OutcomeReported",
            )
        else:
            outcome, failure, cause = (
                AttemptOutcome.TIMED_OUT,
                FailureClass.TRANSIENT,
                "LeaseExpired",
            )
        self._settle(
            ctx, attempt, outcome, failure, None, settled_by="lease-expiry-reconciler", cause=cause
        )
        self._after_settled(ctx, attempt, options)
        return True
