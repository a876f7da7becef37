"""Child runs across grains (issue 32, docs/child-runs.md): what a parent's commit asks of
its children, and what a child's terminal commit tells its parent. Each run decides only in
its own grain; these effects follow the commits (``bus.Committed`` subscribers) as commands
sent through ``GrainEnv.send``, every one idempotent, and the parent's reminder sends them
again until the child's end is recorded (``domain.run.children.redrive_children``).

The sends are not awaited by the committing command: a child accepted and ended in its
first statement tells its parent at once, while the parent's command may still hold its
mailbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from ..commands import (
    CancelRun,
    ChildRunEnded,
    ParentRef,
    ReportToParent,
    SubmitRequest,
    SubmitRun,
)
from ..domain import Principal, RunAggregate, RunState, errors
from ..domain.run.changes import ChildAction, ChildCall
from ..domain.run.children import CHILD_RUN, REFUSED, child_key
from .bus import Committed, subscribe
from .env import log
from .grain import RunGrain

_SENDING: set[asyncio.Task[Any]] = set()  # the sends in flight (a task needs a reference)


def _spawn(what: str, call: Awaitable[Any]) -> None:
    task = asyncio.ensure_future(call)
    _SENDING.add(task)

    def done(t: asyncio.Task[Any]) -> None:
        _SENDING.discard(t)
        if not t.cancelled() and t.exception() is not None:
            # the reminder sends it again (child_check_seconds)
            log.warning("%s failed: %r", what, t.exception())

    task.add_done_callback(done)


@subscribe
def call_children(grain: RunGrain, notice: Committed) -> None:
    """The parent's commit started, checks or cancels child runs: send each its command."""
    if grain.env.send is None:
        return
    for call in notice.changes.child_calls:
        _spawn(f"{call.action} of child run {call.child_run_id}", _call(grain, notice.run, call))


async def _call(grain: RunGrain, parent: RunAggregate, call: ChildCall) -> None:
    send = grain.env.send
    assert send is not None
    tenant = grain.tenant_id
    try:
        if call.action is ChildAction.SUBMIT:
            await _submit(grain, parent, call)
            return
        if call.action is ChildAction.CANCEL:
            await send(
                CancelRun(
                    tenant_id=tenant,
                    run_id=call.child_run_id,
                    command_id=f"parent-cancel:{call.child_run_id}",
                    requested_by=CHILD_RUN,
                    reason=call.reason or "the parent run is cancelled",
                )
            )
        # a child that has ended tells its parent (again)
        await send(ReportToParent(tenant_id=tenant, run_id=call.child_run_id))
    except errors.RunNotFound:  # not submitted yet (its host died first): submit it now
        await _submit(grain, parent, call)
        if call.action is ChildAction.CANCEL:  # then cancel it at once (its key keeps a
            await _call(grain, parent, call)  # late submission from starting another)


async def _submit(grain: RunGrain, parent: RunAggregate, call: ChildCall) -> None:
    send = grain.env.send
    assert send is not None
    try:
        await send(_submission(parent, call))
    except errors.RunControlError as refused:
        if refused.retryable:
            raise  # the reminder submits it again
        # Refused for good (no such workflow or alias, an input its keys cannot read, too
        # deep): the step's child failed; the parent's grain records it (once: its id).
        await send(
            ChildRunEnded(
                tenant_id=grain.tenant_id,
                run_id=parent.run.run_id,
                command_id=f"{REFUSED}{call.child_run_id}",
                step_id=call.step_id,
                child_run_id=call.child_run_id,
                state=str(RunState.FAILED),
                failure_class="validation",
                reason=f"the child run was refused: {refused}",
            )
        )


def _submission(parent: RunAggregate, call: ChildCall) -> SubmitRun:
    """The child's submission: the parent's requester and project, a key and an id that
    derive from (parent, step, number); the alias resolved when the child is accepted."""
    run = parent.run
    request = SubmitRequest(
        project_id=run.project_id,
        idempotency_key=child_key(run.run_id, call.step_id, call.number),
        workflow_id=call.workflow_id,
        model_profile_id=run.model_profile_id,
        input=dict(call.input or {}),
        release_alias=call.release_alias,
        correlation_id=run.correlation_id or str(run.run_id),
        priority=run.priority,
        parent=ParentRef(run.run_id, call.step_id, run.child_depth),
    )
    return SubmitRun(
        tenant_id=run.tenant_id,
        run_id=call.child_run_id,
        command_id=f"child-submit:{call.child_run_id}",
        principal=Principal(run.requested_by, run.tenant_id, run.project_id),
        request=request,
    )


@subscribe
def tell_parent(grain: RunGrain, notice: Committed) -> None:
    """A child run's terminal commit: its end goes to its parent."""
    run = notice.run.run
    if run.parent_run_id is None or not run.state.terminal or grain.env.send is None:
        return
    if not any(e.event_type == "RunStateChanged" for e in notice.changes.events):
        return  # ended before this commit: told then
    _spawn(f"the end of child run {run.run_id}", grain.env.send(child_end(notice.run)))


def child_end(agg: RunAggregate) -> ChildRunEnded:
    """What a terminal child tells its parent (the same every time: its id names the child)."""
    run = agg.run
    assert run.parent_run_id is not None and run.parent_step_id is not None
    completed = run.state is RunState.COMPLETED
    result = agg.run_result() if completed else None
    return ChildRunEnded(
        tenant_id=run.tenant_id,
        run_id=run.parent_run_id,
        command_id=f"child-ended:{run.run_id}",
        step_id=run.parent_step_id,
        child_run_id=run.run_id,
        state=str(run.state),
        result=None if result is None else result.value,
        failure_class=None if run.failure_class is None else str(run.failure_class),
        reason=run.failure_reason,
    )


async def report_to_parent(grain: RunGrain, command: ReportToParent) -> bool:
    """The parent asks: if this run has ended, send its end again (idempotent at the parent)."""
    agg = await grain.load_cached()
    run = agg.run
    if run.parent_run_id is None or not run.state.terminal:
        return False
    send = grain.env.send
    if send is not None:
        _spawn(f"the end of child run {run.run_id}", send(child_end(agg)))
    return True
