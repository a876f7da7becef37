"""Cancellation: intent first, then settlement (invariant 8), and the reminder's deadlines
(wall clock, lifetime, the holders' stop timeout)."""

from __future__ import annotations

from datetime import timedelta

from .. import errors
from ..machines import (
    RunCommand,
    allows,
)
from ..states import (
    AttemptState,
    FailureClass,
    RunState,
    StepState,
)
from .core import RunAggregate
from .leases import full_term
from .settlement import (
    cancel_unheld,
    cancel_unleased,
    close_remaining,
    emit_cancelled,
    finish_cancelling,
    record_intent,
    settle_unreported,
)
from .values import (
    LIFETIME_EXCEEDED,
    RUN_CONTROL,
    WALL_CLOCK_EXCEEDED,
    CommandContext,
    Options,
)


def cancel(
    agg: RunAggregate,
    ctx: CommandContext,
    requested_by: str,
    reason: str,
    options: Options | None = None,
) -> bool:
    """Record intent, then settle what can settle now; True if intent was recorded."""
    if not reason or not reason.strip():
        raise errors.ValidationFailed("a cancellation needs a reason")
    if not allows(RunCommand.CANCEL, agg.run.state):
        return False
    intent = record_intent(agg, ctx, requested_by, reason)
    if agg.run.state is RunState.ACCEPTED:
        agg.move_run(ctx, RunState.CANCELLED)
        close_remaining(agg, ctx, FailureClass.CANCELLATION)
        emit_cancelled(agg, ctx, intent)
        return True
    if agg.run.state is RunState.WAITING_FOR_APPROVAL:
        # The leases were suspended while a human decided: give each holder a full term
        # to observe the cancellation and settle its attempt itself.
        for lease in agg.leases.values():
            full_term(agg, ctx, lease, options or Options())
    agg.move_run(ctx, RunState.CANCELLING)
    cancel_unheld(agg, ctx)
    finish_cancelling(agg, ctx)
    return True


def enforce_deadlines(agg: RunAggregate, ctx: CommandContext, options: Options) -> str | None:
    """The reminder's part: past its deadline a run gets a cancellation intent (reason
    ``wall-clock-exceeded`` or ``lifetime-exceeded``); past the stop deadline a Cancelling
    run's open attempts are settled Uncertain (cause ``StopTimeout``: a holder that never
    reported may have acted), their leases revoked, and the run ends Cancelled. Answers
    what it did, or None."""
    if not allows(RunCommand.ENFORCE_DEADLINES, agg.run.state):
        # A human decision is never cut short by the run's clock: the approval's expiry
        # bounds that wait, and a run past its deadline is cancelled once it resumes.
        return None
    if agg.run.state is not RunState.CANCELLING:
        if ctx.now < agg.deadline(options):
            return None
        lifetime = agg.run.created_at + timedelta(seconds=options.max_run_lifetime_seconds)
        reason = LIFETIME_EXCEEDED if ctx.now >= lifetime else WALL_CLOCK_EXCEEDED
        cancel(agg, ctx, RUN_CONTROL, reason, options)
        return reason
    stop = agg.stop_deadline(options)
    if stop is None or ctx.now < stop:
        return None
    for attempt in agg.open_attempts():
        if attempt.state is not AttemptState.LEASED:
            cancel_unleased(agg, ctx, attempt)
            agg.move_step(ctx, agg.step(attempt.step_id), StepState.CANCELLED, "RunCancelled")
            continue
        settle_unreported(agg, ctx, attempt, options, settled_by=RUN_CONTROL, cause="StopTimeout")
    finish_cancelling(agg, ctx)
    return "stop-timeout"
