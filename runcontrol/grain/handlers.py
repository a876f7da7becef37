"""The grain's handlers, and the table from command type to handler (``HANDLERS``).

A handler decides on the aggregate through ``retry.decide`` (one statement with its answer,
deciding again on a lost race). Every command commits through the group commit; none needs a
path of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

from ..commands import (
    AcquireLease,
    CancelRun,
    ClaimToolCall,
    Command,
    CompleteToolCall,
    ConsumeRateLimit,
    ControlResult,
    DecideApproval,
    DispatchRun,
    OpenAttempts,
    RateConsumed,
    RenewLease,
    ReportOutcome,
    ReportProgress,
    RequestApproval,
    RerunRun,
    ResolveAttempt,
    ResumeRun,
    RetryStep,
    SendSignal,
    SettleRestoredLeases,
    SignalResult,
    StartRun,
    SubmitRun,
    SuspendRun,
    WakeResult,
    WakeRun,
)
from ..domain import (
    ApprovalRequest,
    Attempt,
    CommandContext,
    LeaseGrant,
    ProgressAck,
    RunAggregate,
    RunState,
    ToolCallClaim,
    errors,
)
from ..domain.rates import Draw
from ..domain.run import RESTORE_CHECK
from ..store import rates
from . import submission
from .env import Plan
from .retry import decide

if TYPE_CHECKING:
    from .grain import RunGrain

Handler = Callable[["RunGrain", Any], Awaitable[Any]]

# ---------------------------------------------------------------------- the run


async def dispatch(g: RunGrain, command: DispatchRun) -> Attempt | None:
    """RunDispatcher: dispatch the next due Pending step if capacity allows."""
    if (await g.load_cached()).run.state is RunState.ACCEPTED:
        await submission.start(g, StartRun(tenant_id=g.tenant_id, run_id=g.run_id))
        return None
    return await decide(g, Plan(g.dispatch_due, "run-dispatcher"), command)


async def cancel(g: RunGrain, c: CancelRun) -> str:
    """Record the intent; answer the state observed after it (not an assumed one)."""

    def decided(a: RunAggregate, x: CommandContext) -> str:
        a.cancel(x, c.requested_by, c.reason, g.env.options)
        return str(a.run.state)

    return await decide(g, Plan(decided, c.requested_by), c)


async def open_attempts(g: RunGrain, command: OpenAttempts) -> list[UUID]:
    """Ids of the run's non-terminal attempts (a read of the activation's cache)."""
    return [a.attempt_id for a in (await g.load_cached()).open_attempts()]


async def wake(g: RunGrain, command: WakeRun) -> WakeResult:
    """Do whatever is due (the reminder): expire leases and approvals, dispatch retries."""
    agg = await g.load_cached()
    if agg.run.state.terminal:
        return WakeResult()
    if agg.run.state is RunState.ACCEPTED:
        await submission.start(g, StartRun(tenant_id=g.tenant_id, run_id=g.run_id))
        return WakeResult(started=True)
    options = g.env.options
    now = g.env.clock.now()
    due = any(ap.expires_at <= now for ap in agg.pending_approvals())
    policy = await g.pinned_policy() if due else None  # for its expiry action

    def decided(a: RunAggregate, c: CommandContext) -> WakeResult:
        calls = a.expire_tool_calls(c)
        stopped = a.enforce_deadlines(c, options)
        if a.run.state.terminal:
            return WakeResult(stopped=stopped, tool_calls_expired=calls)
        leases = sum(1 for attempt_id in list(a.leases) if a.expire_lease(c, attempt_id, options))
        a.fire_due_waits(c, options)  # a wait step's timer, once
        approvals = 0
        if policy is not None:
            approvals = sum(
                1
                for ap in a.pending_approvals()
                if a.expire_approval(c, ap.approval_id, policy, options)
            )
        dispatched = g.dispatch_due(a, c) is not None
        return WakeResult(False, leases, approvals, dispatched, stopped, calls)

    return await decide(g, Plan(decided, "reminder"), command)


async def settle_restored(g: RunGrain, command: SettleRestoredLeases) -> list[str]:
    """restore-check: the run's open leases revoked, their attempts Uncertain."""
    options = g.env.options

    def decided(a: RunAggregate, c: CommandContext) -> list[str]:
        return [str(attempt) for attempt in a.settle_restored_leases(c, options)]

    return await decide(g, Plan(decided, RESTORE_CHECK), command)


# ---------------------------------------------------------------------- a lease holder's


async def acquire_lease(g: RunGrain, c: AcquireLease) -> LeaseGrant:
    options = g.env.options
    return await decide(
        g, Plan(lambda a, x: a.acquire_lease(x, c.attempt_id, c.holder, options), c.holder), c
    )


async def renew_lease(g: RunGrain, c: RenewLease) -> LeaseGrant:
    options = g.env.options
    return await decide(
        g,
        Plan(
            lambda a, x: a.renew_lease(
                x, c.attempt_id, c.holder, c.fencing_token, options, lease_id=c.lease_id
            ),
            c.holder,
        ),
        c,
    )


async def report_outcome(g: RunGrain, c: ReportOutcome) -> Attempt:
    def decided(a: RunAggregate, x: CommandContext) -> Attempt:
        attempt = a.report_outcome(
            x,
            c.attempt_id,
            c.holder,
            c.fencing_token,
            c.outcome,
            g.env.options,
            failure_class=c.failure_class,
            outcome_hash=c.outcome_hash,
            lease_id=c.lease_id,
            result=c.result,
            result_ref=c.result_ref,
        )
        g.dispatch_due(a, x)
        return attempt

    return await decide(g, Plan(decided, c.holder), c)


async def request_approval(g: RunGrain, c: RequestApproval) -> ApprovalRequest | None:
    policy = await g.pinned_policy()
    plan = Plan(
        lambda a, x: a.request_approval(
            x,
            c.attempt_id,
            c.holder,
            c.fencing_token,
            c.proposal_hash,
            policy,
            g.env.options,
            action_class=c.action_class,
            lease_id=c.lease_id,
        ),
        c.holder,
    )
    return await decide(g, plan, c)


async def report_progress(g: RunGrain, c: ReportProgress) -> ProgressAck:
    """Commit the messages up to a gap, then refuse the gap (a resend of this command id
    gets the same ack and the same refusal)."""
    options = g.env.options
    ack = await decide(
        g,
        Plan(
            lambda a, x: a.report_progress(
                x, c.attempt_id, c.holder, c.fencing_token, c.messages, options, lease_id=c.lease_id
            ),
            c.holder,
        ),
        c,
    )
    if ack.gap_at is not None:
        raise errors.ProgressGap(
            f"progress message {ack.gap_at} follows {ack.acked_seq}: resend from "
            f"{ack.acked_seq + 1}",
            attempt_id=str(c.attempt_id),
            acked_seq=ack.acked_seq,
            gap_at=ack.gap_at,
        )
    return ack


async def claim_tool_call(g: RunGrain, c: ClaimToolCall) -> ToolCallClaim:
    options = g.env.options
    return await decide(
        g,
        Plan(
            lambda a, x: a.claim_tool_call(
                x,
                c.attempt_id,
                c.holder,
                c.fencing_token,
                c.call_id,
                c.request_hash,
                options,
                lease_id=c.lease_id,
            ),
            c.holder,
        ),
        c,
    )


async def complete_tool_call(g: RunGrain, c: CompleteToolCall) -> ToolCallClaim:
    options = g.env.options
    return await decide(
        g,
        Plan(
            lambda a, x: a.complete_tool_call(
                x,
                c.attempt_id,
                c.holder,
                c.fencing_token,
                c.call_id,
                c.result_hash,
                options,
                lease_id=c.lease_id,
            ),
            c.holder,
        ),
        c,
    )


async def consume_rate_limit(g: RunGrain, c: ConsumeRateLimit) -> RateConsumed:
    """Commit the report (its event, its answer), then move the bucket by its units: a resend
    gets the stored answer and takes nothing again; a crash between the two loses the units
    (a consumption is counted at most once, docs/flow-control.md)."""
    policy = await g.pinned_policy()
    options = g.env.options
    made: list[tuple[Draw, RateConsumed]] = []

    def decided(a: RunAggregate, x: CommandContext) -> RateConsumed:
        draw = a.consume_rate(
            x,
            c.attempt_id,
            c.holder,
            c.fencing_token,
            c.name,
            c.units,
            policy.rate_limits,
            options,
            lease_id=c.lease_id,
        )
        made[:] = [(draw, RateConsumed(c.name, draw.bucket, draw.units, x.now))]
        return made[-1][1]

    answer = await decide(g, Plan(decided, c.holder), c)
    # Committed by this call only if the answer is the one its last decision made (a stored
    # answer, this command committed before or by another activation, is a copy).
    if made and answer is made[-1][1]:
        await rates.consume(g.env.store, g.tenant_id, made[-1][0], answer.at)
    return answer


async def send_signal(g: RunGrain, c: SendSignal) -> SignalResult:
    """Keep the signal on its step; if the step waits, it succeeds and what it readied is
    dispatched in the same statement."""

    def decided(a: RunAggregate, x: CommandContext) -> SignalResult:
        step = a.receive_signal(x, c.name, c.body, c.sent_by)
        g.dispatch_due(a, x)
        return SignalResult(
            run_id=a.run.run_id,
            step_id=step.step_id,
            name=c.name,
            delivered=step.state.terminal,
            state=str(a.run.state),
        )

    return await decide(g, Plan(decided, c.sent_by), c)


# ---------------------------------------------------------------------- a reviewer's


async def decide_approval(g: RunGrain, c: DecideApproval) -> ApprovalRequest:
    """Decide, and dispatch in the same statement what became ready while the run waited (a
    sibling of the parked step that succeeded meanwhile readies its dependents)."""
    if c.principal.tenant_id != g.tenant_id:
        raise errors.ApprovalNotFound("approval not found")
    policy = await g.pinned_policy()

    def decided(a: RunAggregate, x: CommandContext) -> ApprovalRequest:
        approval = a.decide_approval(
            x,
            c.approval_id,
            c.principal,
            c.decision,
            c.version,
            c.proposal_hash,
            c.reason,
            policy,
            g.env.options,
        )
        g.dispatch_due(a, x)
        return approval

    return await decide(g, Plan(decided, c.principal.subject), c)


# ---------------------------------------------------------------------- an operator's


async def suspend(g: RunGrain, c: SuspendRun) -> ControlResult:
    g.operator(c.principal.tenant_id)

    def decided(a: RunAggregate, x: CommandContext) -> ControlResult:
        a.suspend(x, c.reason)
        return g.control_result(a)

    return await decide(g, Plan(decided, c.principal.subject), c)


async def resume(g: RunGrain, c: ResumeRun) -> ControlResult:
    """Lift the suspension and dispatch what is due, in one statement."""
    g.operator(c.principal.tenant_id)

    def decided(a: RunAggregate, x: CommandContext) -> ControlResult:
        a.resume(x, c.reason)
        g.dispatch_due(a, x)
        return g.control_result(a)

    return await decide(g, Plan(decided, c.principal.subject), c)


async def retry_step(g: RunGrain, c: RetryStep) -> ControlResult:
    """Skip the step's backoff and dispatch its new attempt, in one statement (past the
    tenant's capacity cap the step stays Pending, due now, for the dispatcher)."""
    g.operator(c.principal.tenant_id)

    def decided(a: RunAggregate, x: CommandContext) -> ControlResult:
        step = a.retry_step(x, c.step_id, c.reason)
        attempt = g.dispatch_due(a, x)
        return g.control_result(a, attempt, step.step_id)

    return await decide(g, Plan(decided, c.principal.subject), c)


async def resolve_attempt(g: RunGrain, c: ResolveAttempt) -> ControlResult:
    g.operator(c.principal.tenant_id)
    options = g.env.options

    def decided(a: RunAggregate, x: CommandContext) -> ControlResult:
        attempt = a.resolve_attempt(x, c.attempt_id, c.outcome, c.reason, options)
        g.dispatch_due(a, x)
        return g.control_result(a, attempt)

    return await decide(g, Plan(decided, c.principal.subject), c)


# The registry: command type -> the grain's handler.
HANDLERS: Mapping[type[Command[Any]], Handler] = {
    SubmitRun: submission.submit,
    StartRun: submission.start,
    RerunRun: submission.rerun,
    DispatchRun: dispatch,
    CancelRun: cancel,
    OpenAttempts: open_attempts,
    WakeRun: wake,
    SettleRestoredLeases: settle_restored,
    AcquireLease: acquire_lease,
    RenewLease: renew_lease,
    ReportOutcome: report_outcome,
    RequestApproval: request_approval,
    ReportProgress: report_progress,
    ClaimToolCall: claim_tool_call,
    CompleteToolCall: complete_tool_call,
    DecideApproval: decide_approval,
    SendSignal: send_signal,
    ConsumeRateLimit: consume_rate_limit,
    SuspendRun: suspend,
    ResumeRun: resume,
    RetryStep: retry_step,
    ResolveAttempt: resolve_attempt,
}
