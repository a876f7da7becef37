"""How attempts, steps and the run settle: an attempt's outcome moves its step (retry, fail,
succeed) and the run (next step, Completed, Failed); a terminal run closes what is still open;
a Cancelling run ends Cancelled once every attempt settled. Every concern that ends an attempt
or a run goes through here."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from .. import conditions
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
from .changes import ChildAction, ChildCall
from .core import RunAggregate
from .leases import release_lease
from .values import (
    RUN_CONTROL,
    CommandContext,
    Options,
)


def settle(
    agg: RunAggregate,
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
    agg.move_attempt(ctx, attempt, outcome.attempt_state, cause)
    if result is not None:
        agg.add(result)
    attempt.outcome = outcome
    attempt.failure_class = failure_class
    attempt.outcome_hash = outcome_hash
    attempt.settled_at = ctx.now
    attempt.settled_by = settled_by
    release_lease(agg, ctx, attempt, cause)
    agg.record(ctx, ev.AttemptOutcomeRecorded, attempt)


def settle_unreported(
    agg: RunAggregate,
    ctx: CommandContext,
    attempt: Attempt,
    options: Options,
    *,
    settled_by: str,
    cause: str,
    outcome: AttemptOutcome = AttemptOutcome.UNCERTAIN,
    failure_class: FailureClass = FailureClass.UNCERTAIN,
) -> None:
    """Settle an attempt no worker reported on (its lease ended, the run's stop timeout
    passed, a restore found it leased), Uncertain unless told otherwise (invariant 6: its
    side effect may have happened), and move its step and run on."""
    settle(agg, ctx, attempt, outcome, failure_class, None, settled_by=settled_by, cause=cause)
    after_settled(agg, ctx, attempt, options)


def after_settled(
    agg: RunAggregate, ctx: CommandContext, attempt: Attempt, options: Options
) -> None:
    step = agg.step(attempt.step_id)
    outcome = attempt.outcome
    if agg.run.state is RunState.CANCELLING:
        if outcome is AttemptOutcome.SUCCEEDED:
            # Completed effects stay visible (invariant 8): the step did succeed.
            step.outcome_hash = attempt.outcome_hash
            agg.move_step(ctx, step, StepState.SUCCEEDED, "AttemptSucceeded")
        else:
            agg.move_step(ctx, step, StepState.CANCELLED, "RunCancelled")
        finish_cancelling(agg, ctx)
        return
    if outcome is AttemptOutcome.SUCCEEDED:
        step.outcome_hash = attempt.outcome_hash
        step_succeeded(agg, ctx, step, "AttemptSucceeded")
        return
    failure = attempt.failure_class or FailureClass.TRANSIENT
    if failure is FailureClass.UNCERTAIN and step.side_effect_class.at_least(
        SideEffectClass.SHARED_WRITE
    ):
        # Invariant 6: a side effect may have happened; never retry on our own.
        step.failure_class = failure
        agg.move_step(ctx, step, StepState.FAILED, "UncertainOutcome")
        fail_run(
            agg,
            ctx,
            FailureClass.UNCERTAIN,
            f"step {step.name!r} ended Uncertain with side-effect class "
            f"{step.side_effect_class}; an operator must resolve it",
        )
        return
    retryable = failure.retryable or failure is FailureClass.UNCERTAIN
    if retryable and attempt.number < step.max_attempts:
        schedule_retry(agg, ctx, step, attempt.number, options)
        return
    step.failure_class = failure
    agg.move_step(ctx, step, StepState.FAILED, "AttemptFailedTerminally")
    reason = f"step {step.name!r} failed after {attempt.number} attempt(s) ({failure})"
    fail_run(agg, ctx, failure, reason)


def schedule_retry(
    agg: RunAggregate, ctx: CommandContext, step: Step, number: int, options: Options
) -> None:
    """The step's ``number``th try failed and may be retried: Pending again after its
    backoff (a worker's next attempt, a run step's next child)."""
    delay = backoff_delay(
        number,
        base_seconds=options.retry_base_seconds,
        cap_seconds=options.retry_cap_seconds,
        uniform=ctx.uniform,
    )
    step.not_before = ctx.now + timedelta(seconds=delay)
    agg.move_step(ctx, step, StepState.PENDING, "RetryScheduled")
    agg.record(ctx, ev.StepRetryScheduled, step, next_attempt_number=number + 1)


def step_succeeded(agg: RunAggregate, ctx: CommandContext, step: Step, cause: str) -> None:
    """The step succeeded; with it the last, the run completes."""
    agg.move_step(ctx, step, StepState.SUCCEEDED, cause)
    complete_if_done(agg, ctx)


def skip_step(agg: RunAggregate, ctx: CommandContext, step: Step, cause: str) -> None:
    """The step will not run (its condition is false, or all its dependencies were
    skipped): Skipped, settled for its dependants; with it the last, the run completes."""
    if agg.run.state is RunState.ACCEPTED:
        agg.move_run(ctx, RunState.RUNNING)  # its first step settles, if without an attempt
    agg.move_step(ctx, step, StepState.SKIPPED, cause)
    agg.record(ctx, ev.StepSkipped, step, cause=cause)
    complete_if_done(agg, ctx)


def complete_if_done(agg: RunAggregate, ctx: CommandContext) -> None:
    """Every step succeeded or was skipped: the run completes, its final step's result its
    result (a skipped final step: none)."""
    if all(s.state.settled_for_dependants for s in agg.steps):
        agg.run.outcome_hash = canonical_hash([s.outcome_hash for s in agg.steps])
        result = agg.run_result()
        if result is not None:
            agg.run.result_hash, agg.run.result_bytes = result.outcome_hash, result.bytes
        agg.move_run(ctx, RunState.COMPLETED)
        agg.record(ctx, ev.RunCompleted, agg.run)


def fail_run(
    agg: RunAggregate,
    ctx: CommandContext,
    failure_class: FailureClass,
    reason: str,
    *,
    cause: str | None = None,
) -> None:
    """The run fails. With attempts still held by workers (a graph's siblings) it fails
    as a cancel settles: the intent is recorded, the run is Cancelling while the holders
    are asked to stop, and it ends Failed once every attempt settled (``finish_cancelling``
    ; the stop timeout settles a silent holder Uncertain). Otherwise it fails at once."""
    agg.run.failure_class = failure_class
    agg.run.failure_reason = reason
    held = any(a.state is AttemptState.LEASED for a in agg.open_attempts())
    held = held or bool(agg.open_children())  # a child run settles as a holder does
    if held and agg.run.state in (RunState.RUNNING, RunState.WAITING_FOR_APPROVAL):
        _stop_siblings(agg, ctx, reason, cause)
        return
    agg.move_run(ctx, RunState.FAILED, cause)
    close_remaining(agg, ctx, failure_class)
    _emit_failed(agg, ctx)


def _emit_failed(agg: RunAggregate, ctx: CommandContext) -> None:
    agg.record(
        ctx,
        ev.RunFailed,
        failure_class=agg.run.failure_class or FailureClass.TRANSIENT,
        reason=agg.run.failure_reason or "",
    )


def _stop_siblings(agg: RunAggregate, ctx: CommandContext, reason: str, cause: str | None) -> None:
    """A failing run's cancel of the attempts still running: intent first (invariant 8),
    what nobody holds settles now, the holders' settlement is observed."""
    record_intent(agg, ctx, RUN_CONTROL, reason)
    agg.move_run(ctx, RunState.CANCELLING, cause or "StepFailedTerminally")
    cancel_unheld(agg, ctx)


def record_intent(
    agg: RunAggregate, ctx: CommandContext, requested_by: str, reason: str
) -> CancellationIntent:
    intent = agg.new(
        CancellationIntent,
        intent_id=ctx.new_id(),
        requested_by=requested_by,
        reason=reason,
        requested_at=ctx.now,
    )
    agg.record(ctx, ev.CancellationRequested, intent)
    return intent


def cancel_unheld(agg: RunAggregate, ctx: CommandContext) -> None:
    """On the way to Cancelling: pending approvals end, and attempts nobody holds (never
    leased, or parked before their side effect) settle at once with their steps."""
    for approval in agg.pending_approvals():
        agg.move_approval(ctx, approval, ApprovalState.CANCELLED, "RunCancelled")
        emit_approval_decided(agg, ctx, approval)
    for attempt in agg.open_attempts():
        if attempt.state is not AttemptState.LEASED:
            cancel_unleased(agg, ctx, attempt)
            agg.move_step(ctx, agg.step(attempt.step_id), StepState.CANCELLED, "RunCancelled")
    for step in agg.open_children():  # intent: each child settles in its own grain
        agg.ask_child(child_cancel(agg, step))


def child_cancel(agg: RunAggregate, step: Step) -> ChildCall:
    """The cancel a Cancelling run asks of a run step's open child."""
    reason = (agg.intents[-1].reason if agg.intents else None) or "the parent run is cancelled"
    return child_call(
        agg, step, ChildAction.CANCEL, f"parent run {agg.run.run_id} cancelling: {reason}"
    )


def child_call(
    agg: RunAggregate, step: Step, action: ChildAction, reason: str | None = None
) -> ChildCall:
    """What to ask of the run step's current child (the same each time it is sent): its
    input is the step's ``input`` fields evaluated over the run's input and the
    dependencies' results, or (none given) the run's input."""
    child = step.child or {}
    wait = step.wait or {}
    fields = wait.get("input")
    results = agg.dependency_results(step)
    return ChildCall(
        action=action,
        step_id=step.step_id,
        step_name=step.name,
        child_run_id=UUID(str(child["runId"])),
        number=int(child["number"]),
        workflow_id=str(wait.get("workflowId")),
        release_alias=wait.get("releaseAlias"),
        input=dict(agg.run.input or {})
        if fields is None
        else {
            name: conditions.evaluate(conditions.parse(text), agg.run.input, results)
            for name, text in fields.items()
        },
        reason=reason,
    )


def cancel_unleased(agg: RunAggregate, ctx: CommandContext, attempt: Attempt) -> None:
    """An attempt nobody holds settles as Cancelled at once: a Dispatched one never ran; a
    Parked one stopped before its side effect, which waited for the decision."""
    cause = (
        "CancelledWhileParked" if attempt.state is AttemptState.PARKED else "CancelledBeforeLease"
    )
    agg.move_attempt(ctx, attempt, AttemptState.CANCELLED, cause)
    attempt.outcome = AttemptOutcome.CANCELLED
    attempt.failure_class = FailureClass.CANCELLATION
    attempt.settled_at = ctx.now
    attempt.settled_by = "run-control"


def close_remaining(agg: RunAggregate, ctx: CommandContext, failure_class: FailureClass) -> None:
    """On a terminal run: settle open attempts, cancel pending approvals and steps."""
    for attempt in agg.open_attempts():
        if attempt.state is not AttemptState.LEASED:
            cancel_unleased(agg, ctx, attempt)
        else:
            settle(
                agg,
                ctx,
                attempt,
                AttemptOutcome.CANCELLED,
                failure_class,
                None,
                settled_by="run-control",
                cause="RunEnded",
            )
    for approval in agg.pending_approvals():
        agg.move_approval(ctx, approval, ApprovalState.CANCELLED, "RunCancelled")
        emit_approval_decided(agg, ctx, approval)
    for step in agg.steps:
        if step.state is StepState.PENDING:
            agg.move_step(ctx, step, StepState.CANCELLED, "RunEnded")
        elif step.state is StepState.RUNNING:
            agg.move_step(ctx, step, StepState.CANCELLED, "RunCancelled")


def finish_cancelling(agg: RunAggregate, ctx: CommandContext) -> None:
    if agg.run.state is not RunState.CANCELLING or agg.open_attempts() or agg.open_children():
        return
    for step in agg.steps:
        if step.state is StepState.PENDING:
            agg.move_step(ctx, step, StepState.CANCELLED, "RunEnded")
        elif step.state is StepState.RUNNING:  # a wait: it held nothing
            agg.move_step(ctx, step, StepState.CANCELLED, "RunCancelled")
    if agg.run.failure_class is not None:  # a step failed: its siblings have settled
        agg.move_run(ctx, RunState.FAILED)
        _emit_failed(agg, ctx)
        return
    agg.move_run(ctx, RunState.CANCELLED)
    emit_cancelled(agg, ctx, agg.intents[-1] if agg.intents else None)


def emit_cancelled(
    agg: RunAggregate, ctx: CommandContext, intent: CancellationIntent | None
) -> None:
    agg.record(
        ctx,
        ev.RunCancelled,
        reason=intent.reason if intent else agg.run.failure_reason,
        requested_by=intent.requested_by if intent else None,
    )


def emit_approval_decided(
    agg: RunAggregate, ctx: CommandContext, approval: ApprovalRequest
) -> None:
    agg.record(ctx, ev.ApprovalDecided, approval)
