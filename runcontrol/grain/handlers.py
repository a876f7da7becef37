"""The grain's handlers, registered in ``bus.HANDLERS``, and the after-commit effects.

Every declared command (``commands.declare``) is handled by ``handle``: its rule decides on
the run through ``decision.decide`` (one statement with its answer, deciding again on a lost
race). A few commands are the grain's own business (``SPECIAL``: submission, start, rerun,
the dispatcher, the reminder, a read of the activation). Every command commits through the
group commit; none needs a path of its own. A command's declared effect outside its statement
(``AfterCommit``) subscribes to the commit's notice (``after_commit``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from uuid import UUID

from ..commands import (
    DECLARATIONS,
    AppendOutput,
    Command,
    ConsumeRateLimit,
    DispatchRun,
    OpenAttempts,
    ReplayRun,
    ReportToParent,
    RerunRun,
    StartRun,
    SubmitRun,
    WakeResult,
    WakeRun,
)
from ..declaration import AfterCommit
from ..domain import Attempt, CommandContext, RateConsumed, RunAggregate, RunState, errors
from ..domain.output import OutputAck
from ..domain.run.approvals import expire_approval
from ..domain.run.cancellation import enforce_deadlines
from ..domain.run.children import redrive_children
from ..domain.run.outcomes import expire_lease
from ..domain.run.tool_calls import expire_tool_calls
from ..domain.run.usage import rate_draw
from ..domain.run.waits import fire_due_waits
from ..store import rates
from ..store.commit import StoredAnswer
from . import submission
from .bus import HANDLERS, Committed, Handler, subscribe
from .children import report_to_parent
from .decision import decide
from .env import Plan
from .grain import RunGrain

# ---------------------------------------------------------------------- the run


async def dispatch(g: RunGrain, command: DispatchRun) -> Attempt | None:
    """RunDispatcher: dispatch the next due Pending step if capacity allows."""
    if (await g.load_cached()).run.state is RunState.ACCEPTED:
        await submission.start(g, StartRun(tenant_id=g.tenant_id, run_id=g.run_id))
        return None
    return await decide(g, Plan(g.dispatch_due, "run-dispatcher"), command)


async def open_attempts(g: RunGrain, command: OpenAttempts) -> list[UUID]:
    """Ids of the run's non-terminal attempts (a read of the activation's cache)."""
    return [a.attempt_id for a in (await g.load_cached()).open_attempts()]


async def append_output(g: RunGrain, command: AppendOutput) -> OutputAck:
    """Streamed output: its own fenced insert (``store.output``), grouped with the other
    writes ready on the host; nothing of the run is read, decided or committed."""
    return await g.env.output.append(command)


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
        calls = expire_tool_calls(a, c)
        stopped = enforce_deadlines(a, c, options)
        if a.run.state.terminal:
            return WakeResult(stopped=stopped, tool_calls_expired=calls)
        leases = sum(1 for attempt_id in list(a.leases) if expire_lease(a, c, attempt_id, options))
        fire_due_waits(a, c, options)  # a wait step's timer, once
        redrive_children(a, c, options)  # an open child's check
        approvals = 0
        if policy is not None:
            approvals = sum(
                1
                for ap in a.pending_approvals()
                if expire_approval(a, c, ap.approval_id, policy, options)
            )
        dispatched = g.dispatch_due(a, c) is not None
        return WakeResult(False, leases, approvals, dispatched, stopped, calls)

    return await decide(g, Plan(decided, "reminder"), command)


# ---------------------------------------------------------------------- every other command


async def handle(g: RunGrain, c: Command[Any]) -> Any:
    """A declared command (``commands.declare``): its rule decides on the run (with the
    run's pinned policy if it takes one), in one statement with its answer."""
    declared = DECLARATIONS[type(c)]
    declared.sender.admit(c, g.tenant_id)
    given: dict[str, Any] = {}
    if "options" in declared.given:
        given["options"] = g.env.options
    if declared.policy:
        given["policy"] = await g.pinned_policy()
    if "template" in declared.given:
        given["template"] = await g.pinned_template()
    if "replay" in declared.given:
        given["replay"] = await g.replay_source()

    def decided(a: RunAggregate, x: CommandContext) -> Any:
        return declared.decided(a, x, c, given, g.dispatch_due)

    plan = Plan(decided, declared.sender.actor_of(c))
    try:
        answer = await decide(g, plan, c)
    except errors.PreApprovalUsedUp:
        # Another run's statement used the template's pre-approval after this one read its
        # uses: decide again on fresh uses (the request then waits for a human).
        given["template"] = await g.pinned_template()
        answer = await decide(g, plan, c)
    if declared.refuse is not None:
        refused = declared.refuse(answer)
        if refused is not None:
            raise refused
    return answer


@subscribe
async def after_commit(g: RunGrain, notice: Committed) -> None:
    """Each committed command's declared effect outside its statement, if any (never for a
    resend answered from the store: that commits nothing)."""
    for command, answer in notice.each:
        effect = DECLARATIONS[type(command)].after_commit
        if effect is not None:
            await AFTER_COMMIT[effect](g, command, answer)


async def move_rate_bucket(g: RunGrain, command: Command[Any], answer: StoredAnswer) -> None:
    """The tenant's bucket of the named limit moves by the units: a resend gets the stored
    answer and takes nothing again; a crash between the commit and this loses the units (a
    consumption is counted at most once, docs/flow-control.md)."""
    assert isinstance(command, ConsumeRateLimit)
    consumed: RateConsumed = answer.value
    policy = await g.pinned_policy()
    draw = rate_draw(policy.rate_limits, command.name, consumed.units)
    await rates.consume(g.env.store, g.tenant_id, draw, consumed.at)


AFTER_COMMIT: Mapping[
    AfterCommit, Callable[[RunGrain, Command[Any], StoredAnswer], Awaitable[None]]
] = {AfterCommit.MOVE_RATE_BUCKET: move_rate_bucket}

# Commands a host may run beside the run's mailbox rather than in it: they read, decide and
# commit nothing of the run (the database fences them), so a run's renewals and reports never
# queue behind them (streamed output writes a few times a second per attempt).
UNSERIALISED: frozenset[type[Command[Any]]] = frozenset({AppendOutput})

# The commands the grain handles itself (no rule of the run decides them alone).
SPECIAL: Mapping[type[Command[Any]], Handler] = {
    SubmitRun: submission.submit,
    StartRun: submission.start,
    RerunRun: submission.rerun,
    ReplayRun: submission.replay,
    DispatchRun: dispatch,
    OpenAttempts: open_attempts,
    WakeRun: wake,
    AppendOutput: append_output,
    ReportToParent: report_to_parent,
}


def _handlers() -> dict[type[Command[Any]], Handler]:
    """Every declared command has a rule (``handle``) or a special handler."""
    if set(AFTER_COMMIT) != set(AfterCommit):
        raise TypeError(f"AFTER_COMMIT lacks {sorted(set(AfterCommit) - set(AFTER_COMMIT))}")
    table: dict[type[Command[Any]], Handler] = {}
    for command, declared in DECLARATIONS.items():
        special = SPECIAL.get(command)
        if (special is None) == (declared.decide is None):
            raise TypeError(f"{command.__name__}: declare its rule or a special handler (one)")
        table[command] = special or handle
    return table


HANDLERS.update(_handlers())
