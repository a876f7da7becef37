"""Child runs (issue 32): a ``kind: run`` step starts a run of another workflow and takes its
result. The step holds no worker: it is Running while its child is open, like a wait.

Each run is its own grain, so the parent never writes the child's rows. Starting the step
records the child's id and number on the step (``Step.child``) and asks for the child's
submission after the commit (``ChildCall``, sent by the grain); the child's id and
idempotency key derive from (parent run, step, number), so sending it again is harmless.
The child's end reaches the parent as a command of its own (``ChildRunEnded``), sent by the
child's grain after its terminal commit. A host killed between the two commits loses
nothing: the step's ``due_at`` is the parent's durable reminder, and each time it comes due
(``redrive_children``) the parent submits its child again and asks it for its end, until
the end is recorded (a resend of it changes nothing: the step left Running once).

A failed child fails the step under its retry policy (a retry starts the next child, with
a new number); a cancel of the parent asks its open children to cancel and settles once
they have. A child is one level deeper than its parent; one beyond ``MAX_CHILD_DEPTH`` is
refused, which stops a cycle of workflows calling each other.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID, uuid5

from .. import errors, shards
from .. import events as ev
from ..hashing import canonical_json, result_hash
from ..machines import RunCommand, require
from ..model import Step
from ..states import FailureClass, RunState, StepState
from ..workflow import MAX_CHILD_DEPTH
from .changes import ChildAction
from .core import RunAggregate
from .settlement import (
    child_call,
    child_cancel,
    complete_if_done,
    fail_run,
    finish_cancelling,
    schedule_retry,
)
from .values import CommandContext, Options

# The namespace of child run ids: uuid5(this, "parent:step:number").
CHILD_RUNS = UUID("5b0c1e2a-7d1f-4c53-9a39-32c0f2c1d000")
CHILD_STARTED = "ChildStarted"
CHILD_RUN = "child-run"  # the actor of what a child tells its parent
# The command id of a submission refused for good, told as the child's end: no child run
# exists (``ChildRunEnded``'s event has no ``childState``).
REFUSED = "child-refused:"


def child_run_id(parent_run_id: UUID, step_id: UUID, number: int) -> UUID:
    """The id of the ``number``th child of the parent's step: the same every time, in the
    parent's virtual shard (a legacy parent's: the name-based id alone, as before shards)."""
    return shards.derive(parent_run_id, uuid5(CHILD_RUNS, f"{parent_run_id}:{step_id}:{number}"))


def child_key(parent_run_id: UUID, step_id: UUID, number: int) -> str:
    """The child's idempotency key (its submission is idempotent on it)."""
    return f"child:{parent_run_id}:{step_id}:{number}"


def start_child(agg: RunAggregate, ctx: CommandContext, step: Step, options: Options) -> None:
    """A ready run step starts its next child (submitted after the commit)."""
    require(RunCommand.DISPATCH, agg.run.state)
    number = int((step.child or {}).get("number", 0)) + 1
    child_id = child_run_id(agg.run.run_id, step.step_id, number)
    step.child = {"runId": str(child_id), "number": number}
    step.due_at = ctx.now + timedelta(seconds=options.child_check_seconds)
    if agg.run.state is RunState.ACCEPTED:
        agg.move_run(ctx, RunState.RUNNING)
    agg.move_step(ctx, step, StepState.RUNNING, CHILD_STARTED)
    workflow_id = str((step.wait or {}).get("workflowId"))
    if agg.run.child_depth > MAX_CHILD_DEPTH:
        _fail_step(
            agg,
            ctx,
            step,
            FailureClass.PERMANENT,
            f"step {step.name!r}: a child run deeper than {MAX_CHILD_DEPTH} levels is refused "
            f"(this run is {agg.run.depth or 0} deep; do its workflows call each other?)",
            "ChildDepthExceeded",
        )
        return
    agg.record(
        ctx, ev.ChildRunStarted, step, child_run_id=child_id, workflow_id=workflow_id, number=number
    )
    agg.ask_child(child_call(agg, step, ChildAction.SUBMIT))


def redrive_children(agg: RunAggregate, ctx: CommandContext, options: Options) -> int:
    """The reminder's part: each open child whose check is due is submitted again (or, the
    run Cancelling, asked again to cancel) and asked for its end. Answers how many."""
    due = [s for s in agg.open_children() if s.due_at is not None and s.due_at <= ctx.now]
    for step in due:
        step.due_at = ctx.now + timedelta(seconds=options.child_check_seconds)
        agg.changed(step)
        agg.touch(ctx)
        cancelling = agg.run.state is RunState.CANCELLING
        agg.ask_child(
            child_cancel(agg, step) if cancelling else child_call(agg, step, ChildAction.CHECK)
        )
    return len(due)


def child_ended(
    agg: RunAggregate,
    ctx: CommandContext,
    step_id: UUID,
    child_run_id: UUID,
    state: str,
    result: Any,
    failure_class: str | None,
    reason: str | None,
    options: Options,
) -> str:
    """The child run ``child_run_id`` of the step ended ``state``: Completed, its result is
    the step's; otherwise the step fails under its retry policy (a retry starts the next
    child), or, the parent Cancelling, is Cancelled. A report of a child that is not the
    step's current one, or of one already recorded, changes nothing. Answers the step's
    state."""
    try:
        ended = RunState(state)
    except ValueError:
        raise errors.ValidationFailed(f"{state!r} is not a run state") from None
    if not ended.terminal:
        raise errors.ValidationFailed(f"a child run's end is terminal, not {state}")
    step = agg.step(step_id)
    current = (step.child or {}).get("runId")
    if current != str(child_run_id) or step.state is not StepState.RUNNING:
        return str(step.state)
    step.due_at = None
    text = canonical_json(result).decode() if ended is RunState.COMPLETED else None
    failure = _failure_of(ended, failure_class)
    refused = (ctx.command_id or "").startswith(REFUSED)
    agg.record(
        ctx,
        ev.ChildRunEnded,
        step,
        child_run_id=child_run_id,
        state=str(ended),
        reason=reason,
        result_hash=None if text is None else result_hash(text),
        failure_class=failure,
        child_state=None if refused else str(ended),
    )
    cancelling = agg.run.state is RunState.CANCELLING
    if text is not None:
        if len(text.encode()) > options.result_max_bytes:
            _fail_step(
                agg,
                ctx,
                step,
                FailureClass.PERMANENT,
                f"step {step.name!r}: its child's result is larger than "
                f"{options.result_max_bytes} bytes",
                "ChildResultTooLarge",
            )
            return str(step.state)
        step.result_json = text
        step.outcome_hash = agg.step_result(step).outcome_hash  # type: ignore[union-attr]
        agg.move_step(ctx, step, StepState.SUCCEEDED, "ChildCompleted")
        if cancelling:  # completed effects stay visible (invariant 8)
            finish_cancelling(agg, ctx)
        else:
            complete_if_done(agg, ctx)
        return str(step.state)
    if cancelling:
        agg.move_step(ctx, step, StepState.CANCELLED, "RunCancelled")
        finish_cancelling(agg, ctx)
        return str(step.state)
    assert failure is not None
    number = int((step.child or {}).get("number", 1))
    why = f"step {step.name!r}: child run {child_run_id} ended {ended}" + (
        f" ({reason})" if reason else ""
    )
    if failure.retryable and number < step.max_attempts:
        schedule_retry(agg, ctx, step, number, options)
        return str(step.state)
    _fail_step(agg, ctx, step, failure, why, "ChildFailed")
    return str(step.state)


def _failure_of(ended: RunState, failure_class: str | None) -> FailureClass | None:
    """What a child's end fails its step with: its failure class when Failed (transient when
    it names none), cancellation when Cancelled; None when Completed."""
    if ended is RunState.COMPLETED:
        return None
    if ended is not RunState.FAILED:
        return FailureClass.CANCELLATION
    try:
        return FailureClass(failure_class or FailureClass.TRANSIENT)
    except ValueError:
        raise errors.ValidationFailed(f"{failure_class!r} is not a failure class") from None


def _fail_step(
    agg: RunAggregate,
    ctx: CommandContext,
    step: Step,
    failure: FailureClass,
    reason: str,
    cause: str,
) -> None:
    step.due_at = None
    step.failure_class = failure
    agg.move_step(ctx, step, StepState.FAILED, cause)
    fail_run(agg, ctx, failure, reason)
