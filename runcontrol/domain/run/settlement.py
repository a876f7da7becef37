"""How attempts, steps and the run settle: an attempt's outcome moves its step (retry, fail,
succeed) and the run (next step, Completed, Failed); a terminal run closes what is still open;
a Cancelling run ends Cancelled once every attempt settled. Every concern that ends an attempt
or a run goes through here."""

from __future__ import annotations

from datetime import timedelta

from .. import events as ev
from ..backoff import backoff_delay
from ..hashing import canonical_hash
from ..model import (
    ApprovalRequest,
    Attempt,
    AttemptResult,
    CancellationIntent,
    Step,
)
from ..states import (
    ApprovalState,
    AttemptOutcome,
    AttemptState,
    FailureClass,
    RunState,
    SideEffectClass,
    StepState,
)
from .leases import Leases
from .values import (
    RUN_CONTROL,
    CommandContext,
    Options,
)


class Settlement(Leases):
    def _settle(
        self,
        ctx: CommandContext,
        attempt: Attempt,
        outcome: AttemptOutcome,
        failure_class: FailureClass | None,
        outcome_hash: str | None,
        *,
        settled_by: str,
        cause: str = "OutcomeReported",
        result: AttemptResult | None = None,
    ) -> None:
        self._move_attempt(ctx, attempt, outcome.attempt_state, cause)
        if result is not None:
            self.results[attempt.attempt_id] = result
            self._changes.results.append(result)
        attempt.outcome = outcome
        attempt.failure_class = failure_class
        attempt.outcome_hash = outcome_hash
        attempt.settled_at = ctx.now
        attempt.settled_by = settled_by
        self._release_lease(ctx, attempt, cause)
        self._emit(
            ctx,
            ev.AttemptOutcomeRecorded(
                run_id=self.run.run_id,
                step_id=attempt.step_id,
                attempt_id=attempt.attempt_id,
                outcome=outcome,
                failure_class=failure_class,
                outcome_hash=outcome_hash,
            ),
            step_id=attempt.step_id,
            attempt_id=attempt.attempt_id,
        )

    def _after_settled(self, ctx: CommandContext, attempt: Attempt, options: Options) -> None:
        step = self.step(attempt.step_id)
        outcome = attempt.outcome
        if self.run.state is RunState.CANCELLING:
            if outcome is AttemptOutcome.SUCCEEDED:
                # Completed effects stay visible (invariant 8): the step did succeed.
                step.outcome_hash = attempt.outcome_hash
                self._move_step(ctx, step, StepState.SUCCEEDED, "AttemptSucceeded")
            else:
                self._move_step(ctx, step, StepState.CANCELLED, "RunCancelled")
            self._finish_cancelling(ctx)
            return
        if outcome is AttemptOutcome.SUCCEEDED:
            step.outcome_hash = attempt.outcome_hash
            self._step_succeeded(ctx, step, "AttemptSucceeded")
            return
        failure = attempt.failure_class or FailureClass.TRANSIENT
        if failure is FailureClass.UNCERTAIN and step.side_effect_class.at_least(
            SideEffectClass.SHARED_WRITE
        ):
            # Invariant 6: a side effect may have happened; never retry on our own.
            step.failure_class = failure
            self._move_step(ctx, step, StepState.FAILED, "UncertainOutcome")
            self._fail_run(
                ctx,
                FailureClass.UNCERTAIN,
                f"step {step.name!r} ended Uncertain with side-effect class "
                f"{step.side_effect_class}; an operator must resolve it",
            )
            return
        retryable = failure.retryable or failure is FailureClass.UNCERTAIN
        if retryable and attempt.number < step.max_attempts:
            delay = backoff_delay(
                attempt.number,
                base_seconds=options.retry_base_seconds,
                cap_seconds=options.retry_cap_seconds,
                uniform=ctx.uniform,
            )
            step.not_before = ctx.now + timedelta(seconds=delay)
            self._move_step(ctx, step, StepState.PENDING, "RetryScheduled")
            self._emit(
                ctx,
                ev.StepRetryScheduled(
                    run_id=self.run.run_id,
                    step_id=step.step_id,
                    next_attempt_number=attempt.number + 1,
                    not_before=step.not_before,
                ),
                step_id=step.step_id,
            )
            return
        step.failure_class = failure
        self._move_step(ctx, step, StepState.FAILED, "AttemptFailedTerminally")
        reason = f"step {step.name!r} failed after {attempt.number} attempt(s) ({failure})"
        self._fail_run(ctx, failure, reason)

    def _step_succeeded(self, ctx: CommandContext, step: Step, cause: str) -> None:
        """The step succeeded; with it the last, the run completes."""
        self._move_step(ctx, step, StepState.SUCCEEDED, cause)
        if all(s.state is StepState.SUCCEEDED for s in self.steps):
            self.run.outcome_hash = canonical_hash([s.outcome_hash for s in self.steps])
            result = self.run_result()
            if result is not None:
                self.run.result_hash, self.run.result_bytes = result.outcome_hash, result.bytes
            self._move_run(ctx, RunState.COMPLETED)
            self._emit(
                ctx,
                ev.RunCompleted(
                    run_id=self.run.run_id,
                    tenant_id=self.run.tenant_id,
                    outcome_hash=self.run.outcome_hash,
                    result_hash=self.run.result_hash,
                ),
            )

    def _fail_run(
        self,
        ctx: CommandContext,
        failure_class: FailureClass,
        reason: str,
        *,
        cause: str | None = None,
    ) -> None:
        """The run fails. With attempts still held by workers (a graph's siblings) it fails
        as a cancel settles: the intent is recorded, the run is Cancelling while the holders
        are asked to stop, and it ends Failed once every attempt settled (``_finish_cancelling``
        ; the stop timeout settles a silent holder Uncertain). Otherwise it fails at once."""
        self.run.failure_class = failure_class
        self.run.failure_reason = reason
        held = any(a.state is AttemptState.LEASED for a in self.open_attempts())
        if held and self.run.state in (RunState.RUNNING, RunState.WAITING_FOR_APPROVAL):
            self._stop_siblings(ctx, reason, cause)
            return
        self._move_run(ctx, RunState.FAILED, cause)
        self._close_remaining(ctx, failure_class)
        self._emit_failed(ctx)

    def _emit_failed(self, ctx: CommandContext) -> None:
        self._emit(
            ctx,
            ev.RunFailed(
                run_id=self.run.run_id,
                tenant_id=self.run.tenant_id,
                failure_class=self.run.failure_class or FailureClass.TRANSIENT,
                reason=self.run.failure_reason or "",
            ),
        )

    def _stop_siblings(self, ctx: CommandContext, reason: str, cause: str | None) -> None:
        """A failing run's cancel of the attempts still running: intent first (invariant 8),
        what nobody holds settles now, the holders' settlement is observed."""
        self._record_intent(ctx, RUN_CONTROL, reason)
        self._move_run(ctx, RunState.CANCELLING, cause or "StepFailedTerminally")
        self._cancel_unheld(ctx)

    def _record_intent(
        self, ctx: CommandContext, requested_by: str, reason: str
    ) -> CancellationIntent:
        intent = CancellationIntent(
            intent_id=ctx.new_id(),
            run_id=self.run.run_id,
            tenant_id=self.run.tenant_id,
            requested_by=requested_by,
            reason=reason,
            requested_at=ctx.now,
        )
        self._changes.intents.append(intent)
        self.intents.append(intent)
        self._emit(
            ctx,
            ev.CancellationRequested(
                run_id=self.run.run_id, requested_by=requested_by, reason=reason
            ),
        )
        return intent

    def _cancel_unheld(self, ctx: CommandContext) -> None:
        """On the way to Cancelling: pending approvals end, and attempts nobody holds (never
        leased, or parked before their side effect) settle at once with their steps."""
        for approval in self.pending_approvals():
            self._move_approval(ctx, approval, ApprovalState.CANCELLED, "RunCancelled")
            self._emit_approval_decided(ctx, approval)
        for attempt in self.open_attempts():
            if attempt.state is not AttemptState.LEASED:
                self._cancel_unleased(ctx, attempt)
                self._move_step(
                    ctx, self.step(attempt.step_id), StepState.CANCELLED, "RunCancelled"
                )

    def _cancel_unleased(self, ctx: CommandContext, attempt: Attempt) -> None:
        """An attempt nobody holds settles as Cancelled at once: a Dispatched one never ran; a
        Parked one stopped before its side effect, which waited for the decision."""
        cause = (
            "CancelledWhileParked"
            if attempt.state is AttemptState.PARKED
            else "CancelledBeforeLease"
        )
        self._move_attempt(ctx, attempt, AttemptState.CANCELLED, cause)
        attempt.outcome = AttemptOutcome.CANCELLED
        attempt.failure_class = FailureClass.CANCELLATION
        attempt.settled_at = ctx.now
        attempt.settled_by = "run-control"

    def _close_remaining(self, ctx: CommandContext, failure_class: FailureClass) -> None:
        """On a terminal run: settle open attempts, cancel pending approvals and steps."""
        for attempt in self.open_attempts():
            if attempt.state is not AttemptState.LEASED:
                self._cancel_unleased(ctx, attempt)
            else:
                self._settle(
                    ctx,
                    attempt,
                    AttemptOutcome.CANCELLED,
                    failure_class,
                    None,
                    settled_by="run-control",
                    cause="RunEnded",
                )
        for approval in self.pending_approvals():
            self._move_approval(ctx, approval, ApprovalState.CANCELLED, "RunCancelled")
            self._emit_approval_decided(ctx, approval)
        for step in self.steps:
            if step.state is StepState.PENDING:
                self._move_step(ctx, step, StepState.CANCELLED, "RunEnded")
            elif step.state is StepState.RUNNING:
                self._move_step(ctx, step, StepState.CANCELLED, "RunCancelled")

    def _finish_cancelling(self, ctx: CommandContext) -> None:
        if self.run.state is not RunState.CANCELLING or self.open_attempts():
            return
        for step in self.steps:
            if step.state is StepState.PENDING:
                self._move_step(ctx, step, StepState.CANCELLED, "RunEnded")
            elif step.state is StepState.RUNNING:  # a wait: it held nothing
                self._move_step(ctx, step, StepState.CANCELLED, "RunCancelled")
        if self.run.failure_class is not None:  # a step failed: its siblings have settled
            self._move_run(ctx, RunState.FAILED)
            self._emit_failed(ctx)
            return
        self._move_run(ctx, RunState.CANCELLED)
        self._emit_cancelled(ctx, self.intents[-1] if self.intents else None)

    def _emit_cancelled(self, ctx: CommandContext, intent: CancellationIntent | None) -> None:
        self._emit(
            ctx,
            ev.RunCancelled(
                run_id=self.run.run_id,
                tenant_id=self.run.tenant_id,
                reason=intent.reason if intent else self.run.failure_reason,
                requested_by=intent.requested_by if intent else None,
            ),
        )

    def _emit_approval_decided(self, ctx: CommandContext, approval: ApprovalRequest) -> None:
        self._emit(
            ctx,
            ev.ApprovalDecided(
                approval_id=approval.approval_id,
                run_id=self.run.run_id,
                tenant_id=self.run.tenant_id,
                state=approval.state,
                decided_by=approval.decided_by,
                reason=approval.reason,
            ),
            step_id=approval.step_id,
            attempt_id=approval.attempt_id,
        )
