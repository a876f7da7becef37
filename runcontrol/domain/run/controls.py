"""Operator controls (issue 14): suspend, resume, retry a step, resolve an Uncertain attempt,
and the rerun link of a new run. Each records its journal entry, its outbox event and an audit
record naming the caller (``ctx.actor``) and the required reason, in the command's one
transaction. A finished run is terminal: no control reopens it, a rerun repeats it as a new run
(``runcontrol.grain``); resolving an attempt of a finished run corrects the attempt's record
only."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from .. import errors
from .. import events as ev
from ..machines import (
    ATTEMPT_RESOLUTIONS,
    STEP_CONTROLS,
    SUSPENSION_TRANSITIONS,
    RunCommand,
    check,
    require,
)
from ..model import (
    Attempt,
    Step,
)
from ..rates import reserved
from ..replay import ReplayOptions
from ..states import (
    AttemptOutcome,
    AttemptState,
    RunState,
    StepState,
    Suspension,
)
from .core import RunAggregate
from .settlement import after_settled
from .values import (
    CommandContext,
    Options,
    control_reason,
    failure_class_for,
)


def suspend(agg: RunAggregate, ctx: CommandContext, reason: str) -> None:
    """Hold the run: no step is dispatched and no dispatched attempt leased until it is
    resumed. Leases in hand may still renew, request approval and report."""
    reason = control_reason(reason)
    require(RunCommand.SUSPEND, agg.run.state)
    if agg.run.suspended_at is not None:
        raise errors.RunSuspended("the run is already suspended")
    agg.run.suspended_at = ctx.now
    _move_suspension(agg, ctx, Suspension.ACTIVE, Suspension.SUSPENDED)
    _control_event(agg, ctx, ev.RunSuspended, reason)
    agg.audit(ctx, "run-suspended", reason=reason, run_state=str(agg.run.state))


def resume(agg: RunAggregate, ctx: CommandContext, reason: str) -> None:
    """Lift the suspension; what is due is dispatched by the same command (the grain)."""
    reason = control_reason(reason)
    require(RunCommand.RESUME, agg.run.state)
    if agg.run.suspended_at is None:
        raise errors.RunNotSuspended("the run is not suspended")
    agg.run.suspended_at = None
    _move_suspension(agg, ctx, Suspension.SUSPENDED, Suspension.ACTIVE)
    _control_event(agg, ctx, ev.RunResumed, reason)
    agg.audit(ctx, "run-resumed", reason=reason, run_state=str(agg.run.state))


def retry_step(agg: RunAggregate, ctx: CommandContext, step_id: UUID, reason: str) -> Step:
    """Dispatch a new attempt of a step whose last attempt Failed, TimedOut or settled
    Uncertain and which waits for its retry: the backoff is skipped. The attempt is
    dispatched by the same command (the grain), or, while the run is suspended, by the
    resume; its lease carries a new fencing token."""
    reason = control_reason(reason)
    step = agg.step(step_id)
    require(RunCommand.RETRY_STEP, agg.run.state)
    previous = agg.attempts_of(step)
    last = previous[-1] if previous else None
    retryable = (AttemptState.FAILED, AttemptState.TIMED_OUT, AttemptState.UNCERTAIN)
    if step.state is not StepState.PENDING or last is None or last.state not in retryable:
        raise errors.IllegalTransition(
            f"step {step.name!r} is {step.state}: only a step waiting for its retry after "
            "a Failed, TimedOut or Uncertain attempt can be retried",
            step_id=str(step_id),
            step_state=str(step.state),
        )
    if not reserved(step.held, last.number + 1):  # a rate limit's hold stays: its instant
        step.not_before = None  # is the reservation, not a backoff
    cause = check("Step", STEP_CONTROLS, step.state, StepState.PENDING)
    agg.changed(step)
    agg.journal(ctx, "Step", step.step_id, step.state, StepState.PENDING, cause)
    _control_event(
        agg,
        ctx,
        ev.StepRetryRequested,
        reason,
        step_id=step.step_id,
        next_attempt_number=last.number + 1,
    )
    agg.audit(ctx, "step-retry", reason=reason, step_id=step.step_id, after=last.number)
    return step


def resolve_attempt(
    agg: RunAggregate,
    ctx: CommandContext,
    attempt_id: UUID,
    outcome: AttemptOutcome,
    reason: str,
    options: Options,
) -> Attempt:
    """Settle an Uncertain attempt as Succeeded or Failed, the operator having found out
    whether its side effect happened. When its step waits for the retry this attempt
    scheduled (a live run), the step settles as the normal path would: Succeeded moves the
    run on (the next step, or Completed); Failed keeps the scheduled retry. Otherwise (a
    finished run, or a later attempt already carries the step) only the attempt's record
    changes."""
    reason = control_reason(reason)
    if outcome not in (AttemptOutcome.SUCCEEDED, AttemptOutcome.FAILED):
        raise errors.ValidationFailed("an Uncertain attempt resolves as Succeeded or Failed")
    attempt = agg.attempt(attempt_id)
    if attempt.state is not AttemptState.UNCERTAIN:
        raise errors.IllegalTransition(
            f"the attempt is {attempt.state}: only an Uncertain attempt can be resolved",
            attempt_id=str(attempt_id),
            attempt_state=str(attempt.state),
        )
    step = agg.step(attempt.step_id)
    awaited = (
        agg.run.state is RunState.RUNNING
        and step.state is StepState.PENDING
        and agg.attempts_of(step)[-1].attempt_id == attempt_id
    )
    cause = check("Attempt", ATTEMPT_RESOLUTIONS, attempt.state, outcome.attempt_state)
    attempt.state = outcome.attempt_state
    agg.changed(attempt)
    agg.journal(ctx, "Attempt", attempt_id, AttemptState.UNCERTAIN, attempt.state, cause)
    attempt.outcome = outcome
    attempt.failure_class = failure_class_for(outcome, None)
    _control_event(
        agg,
        ctx,
        ev.AttemptOutcomeResolved,
        reason,
        step_id=step.step_id,
        attempt_id=attempt_id,
        from_outcome=AttemptOutcome.UNCERTAIN,
        outcome=outcome,
    )
    agg.audit(ctx, "attempt-resolved", reason=reason, attempt_id=attempt_id, outcome=str(outcome))
    if awaited and outcome is AttemptOutcome.SUCCEEDED:
        step.not_before = None
        after_settled(agg, ctx, attempt, options)
    return attempt


def _move_suspension(
    agg: RunAggregate, ctx: CommandContext, current: Suspension, target: Suspension
) -> None:
    cause = check("Run", SUSPENSION_TRANSITIONS, current, target)
    agg.journal(ctx, "Run", agg.run.run_id, current, target, cause)


def _control_event(
    agg: RunAggregate,
    ctx: CommandContext,
    event: type[ev.ControlEventBody],
    reason: str,
    **fields: Any,
) -> None:
    """The control's event: the run as it now is, who asked and why, and ``fields`` (its
    ``step_id`` and ``attempt_id`` also go on the envelope)."""
    agg.record(
        ctx,
        event,
        state=agg.run.state,
        suspended=agg.run.suspended_at is not None,
        requested_by=ctx.actor,
        reason=reason,
        **fields,
    )


def record_rerun(
    agg: RunAggregate, ctx: CommandContext, rerun_of: UUID, release: str, reason: str
) -> None:
    """On a new run: it reruns the finished run ``rerun_of`` (``release``: ``pinned`` or
    ``current``, the release it was given). Recorded on the new run, in its accepting
    statement: the finished run is never written again."""
    reason = control_reason(reason)
    agg.run.rerun_of = rerun_of
    agg.run_changed()
    agg.journal(ctx, "Run", agg.run.run_id, None, agg.run.state, "RerunRequested")
    _control_event(
        agg,
        ctx,
        ev.RunRerun,
        reason,
        rerun_of=rerun_of,
        release=release,
        release_id=agg.run.release_id,
    )
    agg.audit(
        ctx,
        "run-rerun",
        reason=reason,
        rerun_of=rerun_of,
        release=release,
        release_id=agg.run.release_id,
    )


def record_replay(
    agg: RunAggregate, ctx: CommandContext, replay_of: UUID, options: ReplayOptions, reason: str
) -> None:
    """On a new run: it replays the finished run ``replay_of`` (docs/replay.md), with
    ``options``. Recorded on the new run, in its accepting statement (before its first
    dispatch: it takes no concurrency key); the original is never written again."""
    reason = control_reason(reason)
    agg.run.replay_of = replay_of
    agg.run.replay = options.to_dict()
    agg.run_changed()
    agg.journal(ctx, "Run", agg.run.run_id, None, agg.run.state, "ReplayRequested")
    agg.audit(
        ctx,
        "run-replay",
        reason=reason,
        replay_of=replay_of,
        release_id=agg.run.release_id,
        **options.to_dict(),
    )
