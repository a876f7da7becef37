"""Steps no worker executes: ``kind: wait`` (a timer) and ``kind: signal`` (an input from
outside). A ready one starts at once, without an attempt (it holds no worker).

A timer, and a signal's timeout, is the run's durable reminder (``Step.due_at``, in
``next_due``): the sweep wakes the run from the store however many hosts died meanwhile, and
the step settles once (a Running step leaves Running once, under the run's version guard). A
timer already due when the step starts, or overdue after downtime, fires at the next wake.

A signal is kept on the first step that waits for its name and has none yet, Pending or
Running: one sent before its step waits is delivered when the step starts, never lost; a
second one for the same steps is refused (a resend with the same key gets the first answer,
from the grain's memo). The body becomes the step's result (its canonical hash the step's
outcome hash); it is run data, kept in the step's row, never in an event or a log.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from .. import errors
from .. import events as ev
from ..hashing import canonical_hash, canonical_json
from ..machines import RunCommand, require
from ..model import Step
from ..states import FailureClass, RunState, StepState
from ..workflow import SIGNAL, WAIT
from .core import RunAggregate
from .settlement import fail_run, step_succeeded
from .values import CommandContext, Options

TIMER_FIRED = "timer-fired"
SIGNAL_RECEIVED = "signal-received"
SIGNAL_TIMED_OUT = "signal-timed-out"
MAX_SIGNAL_BYTES = 64 * 1024  # a signal's body, as canonical JSON: a result's size


def start_wait(agg: RunAggregate, ctx: CommandContext, step: Step) -> None:
    """A ready wait or signal step starts waiting (the dispatch of a step no worker
    executes); a signal kept for it is delivered at once."""
    require(RunCommand.DISPATCH, agg.run.state)
    wait = step.wait or {}
    due: datetime | None
    if step.kind == SIGNAL:
        timeout = wait.get("timeoutSeconds")
        due = None if timeout is None else ctx.now + timedelta(seconds=float(timeout))
    elif "until" in wait:
        due = datetime.fromisoformat(str(wait["until"]))
    else:
        due = ctx.now + timedelta(seconds=float(wait.get("seconds") or 0))
    step.due_at = due
    agg.move_step(ctx, step, StepState.RUNNING, "WaitStarted")
    signal = wait.get("signal") if step.kind == SIGNAL else None
    agg.record(ctx, ev.StepWaiting, step, signal=signal, until=due)
    if agg.run.state is RunState.ACCEPTED:
        agg.move_run(ctx, RunState.RUNNING)
    if step.signal is not None:
        _end_wait(agg, ctx, step, step.signal["body"], SIGNAL_RECEIVED)


def waiting_steps(agg: RunAggregate) -> list[Step]:
    return [s for s in agg.steps if s.kind in (WAIT, SIGNAL) and s.state is StepState.RUNNING]


def receive_signal(
    agg: RunAggregate, ctx: CommandContext, name: str, body: Any, sent_by: str
) -> Step:
    """A signal from outside (``sent_by``, audited): kept on the step that waits for it,
    and delivered if that step waits now. Answers the step."""
    require(RunCommand.SIGNAL, agg.run.state)
    if len(canonical_json(body)) > MAX_SIGNAL_BYTES:
        raise errors.ValidationFailed(
            f"a signal's body is at most {MAX_SIGNAL_BYTES} bytes of canonical JSON"
        )
    named = [s for s in agg.steps if s.kind == SIGNAL and (s.wait or {}).get("signal") == name]
    if not named:
        raise errors.SignalNotAwaited(
            f"no step of this run waits for a signal named {name!r}", signal=name
        )
    step = next((s for s in named if not s.state.terminal and s.signal is None), None)
    if step is None:
        raise errors.SignalAlreadyReceived(
            f"the run's steps waiting for {name!r} have their signal", signal=name
        )
    signal_id = ctx.new_id()
    step.signal = {
        "signalId": str(signal_id),
        "body": body,
        "sentBy": sent_by,
        "receivedAt": ctx.now.isoformat(),
    }
    agg.changed(step)
    agg.audit(ctx, "signal-received", step_id=step.step_id, signal=name, sent_by=sent_by)
    waiting = step.state is StepState.RUNNING
    agg.record(
        ctx,
        ev.SignalReceived,
        step,
        signal_id=signal_id,
        name=name,
        sent_by=sent_by,
        delivered=waiting,
    )
    if waiting:
        _end_wait(agg, ctx, step, body, SIGNAL_RECEIVED)
    return step


def fire_due_waits(agg: RunAggregate, ctx: CommandContext, options: Options) -> int:
    """The reminder's part: every waiting step whose timer (or signal timeout) is due
    settles, once (a second wake finds it settled). Answers how many did."""
    fired = 0
    for step in waiting_steps(agg):
        if agg.run.state.terminal or agg.run.state is RunState.CANCELLING:
            break
        if step.due_at is None or step.due_at > ctx.now:
            continue
        fired += 1
        if step.kind == WAIT:
            ended = {"firedAt": step.due_at.isoformat(), "endedAt": ctx.now.isoformat()}
            _end_wait(agg, ctx, step, ended, TIMER_FIRED)
            continue
        wait = step.wait or {}
        if wait.get("onTimeout") == "continue":
            _end_wait(agg, ctx, step, wait.get("default"), SIGNAL_TIMED_OUT)
            continue
        _emit_wait_ended(agg, ctx, step, SIGNAL_TIMED_OUT)
        step.failure_class = FailureClass.PERMANENT
        agg.move_step(ctx, step, StepState.FAILED, "SignalTimedOut")
        fail_run(
            agg,
            ctx,
            FailureClass.PERMANENT,
            f"step {step.name!r} received no signal {wait.get('signal')!r} in time",
        )
    return fired


def _end_wait(agg: RunAggregate, ctx: CommandContext, step: Step, result: Any, cause: str) -> None:
    """The wait ends with ``result`` as the step's result (a signal's body, its default, or
    when a timer fired): its dependants receive it, and it is the run's if the step is last."""
    step.outcome_hash = canonical_hash({"step": step.name, "result": result})
    step.result_json = canonical_json(result).decode()
    _emit_wait_ended(agg, ctx, step, cause)
    step_succeeded(agg, ctx, step, "WaitEnded")


def _emit_wait_ended(agg: RunAggregate, ctx: CommandContext, step: Step, cause: str) -> None:
    agg.record(ctx, ev.StepWaitEnded, step, cause=cause)
