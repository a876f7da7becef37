"""Submission: accept a run (idempotent on tenant + project + key), reserve its budget and
dispatch its first step in one statement; a duplicate submission answers the run its key
names; a rerun submits a finished run's input again as a new run, linked to it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime
from typing import Any
from uuid import UUID

from ..commands import (
    ReplayRun,
    RerunRelease,
    RerunRun,
    StartRun,
    SubmitRequest,
    SubmitResult,
    SubmitRun,
    fingerprint,
)
from ..declaration import OPERATOR
from ..domain import (
    CommandContext,
    RunAggregate,
    RunState,
    Submission,
    canonical_hash,
    errors,
)
from ..domain.access import may_set_priority, scopes_of
from ..domain.model import Run
from ..domain.rates import RatesNeeded
from ..domain.replay import ReplayOptions
from ..domain.run.controls import record_replay, record_rerun
from ..domain.run.submission import (
    accept_run,
    assert_same_submission,
    deny_budget,
    record_budget_reservation,
)
from ..store.commit import DuplicateSubmission, Reservation, StoredAnswer, prepare
from .bus import Committed, publish
from .decision import commit, decide
from .env import Plan
from .grain import RunGrain

Also = Callable[[RunAggregate, CommandContext], None]


async def submit(grain: RunGrain, command: SubmitRun) -> SubmitResult:
    """Accept the run, reserve its budget and dispatch its first step: one statement."""
    return await accept(grain, command)


async def accept(grain: RunGrain, command: SubmitRun, also: Also | None = None) -> SubmitResult:
    """``submit``'s statement; ``also`` records more on the new run before it commits."""
    env = grain.env
    principal, request = command.principal, command.request
    if principal.tenant_id != grain.tenant_id:
        raise errors.Forbidden("the grain's tenant differs from the caller's")
    if not request.idempotency_key:
        raise errors.ValidationFailed("an Idempotency-Key is required")
    # The edge checks the token's scopes too; this holds for every caller of the grain.
    priority = request.priority  # the roles' scopes are computed only for a raised one
    if priority > 3 and not may_set_priority(principal.roles, scopes_of(principal.roles), priority):
        raise errors.Forbidden("a priority above 3 needs a role that operates runs")
    input_hash = canonical_hash(request.canonical_payload())
    try:
        release = await env.releases.resolve(
            grain.tenant_id,
            request.workflow_id,
            alias=request.release_alias,
            release_id=request.release_id,
        )
    except errors.NotFound:
        # A key already used with another payload is a conflict, whatever this one names.
        found = await existing(grain, principal.project_id, request.idempotency_key, input_hash)
        if found is None:
            raise
        return found
    policy = await env.policies.current(grain.tenant_id)
    ctx = env.context(principal.subject, command.command_id, grain.run_id)
    submission = Submission(
        run_id=grain.run_id,
        tenant_id=grain.tenant_id,
        project_id=principal.project_id,
        idempotency_key=request.idempotency_key,
        workflow_id=request.workflow_id,
        model_profile_id=request.model_profile_id,
        input_hash=input_hash,
        snapshot_id=env.new_id(grain.run_id, ctx.now),
        requested_by=principal.subject,
        environment_id=request.environment_id,
        limits=request.limits,
        correlation_id=request.correlation_id,
        input=request.input,
        priority=request.priority,
        parent_run_id=None if request.parent is None else request.parent.run_id,
        parent_step_id=None if request.parent is None else request.parent.step_id,
        depth=0 if request.parent is None else request.parent.depth,
        template_id=None if request.template is None else request.template.template_id,
        template_version=None if request.template is None else request.template.version,
    )
    grain.flow_denied = {}
    try:
        return await _accept_loop(
            grain, command, submission, release, policy, ctx, input_hash, also
        )
    finally:
        grain.fused_dropped()  # a first grant not committed gives its credit back


async def _accept_loop(
    grain: RunGrain,
    command: SubmitRun,
    submission: Submission,
    release: Any,
    policy: Any,
    ctx: CommandContext,
    input_hash: str,
    also: Callable[[RunAggregate, CommandContext], None] | None,
) -> SubmitResult:
    env = grain.env
    denied: str | None = None
    while True:
        grain.fused_dropped()
        agg = accept_run(submission, release, policy, env.options, ctx)
        if also is not None:
            also(agg, ctx)
        reserve: Reservation | None = None
        if denied is None:
            reserve = grain.reservation(agg, ctx.now)
            record_budget_reservation(agg, reserve.reservation_id)
            try:
                grain.dispatch_due(agg, ctx)
            except RatesNeeded as needed:  # the first steps draw on rate limits
                # A resend whose first commit landed takes no units: look before reserving
                # (a read that only rate-limited submissions pay).
                key = (submission.project_id, submission.idempotency_key)
                if await env.store.run_id_for_key(grain.tenant_id, *key) is not None:
                    return await resubmitted(grain, command, input_hash, ctx.now)
                await grain.reserve_rates(needed.wanted, ctx.now)
                continue
        else:
            deny_budget(agg, ctx, denied)
        run = agg.run
        result = SubmitResult(
            run.run_id,
            str(run.state),
            run.release_id,
            run.policy_revision,
            run.snapshot_id,
            True,
        )
        answer = StoredAnswer(
            command.command_id, type(command).__name__, result, ctx.now, fingerprint(command)
        )
        pending = prepare(
            grain.tenant_id,
            agg,
            env.options,
            answer=answer,
            also_answers=grain.fused_answers(),
            reserve=reserve,
        )
        assert pending is not None  # a new run always has rows to write
        try:
            await commit(grain, pending)
        except errors.BudgetReservationDenied as refused:
            if denied is not None:
                raise
            denied = str(refused)  # the run is accepted as failed: PolicyDenied
            continue
        except errors.FlowDenied as busy:
            grain.refused_flow(busy)  # accepted; its first step is held for the slot
            continue
        except DuplicateSubmission:
            return await resubmitted(grain, command, input_hash, ctx.now)
        break
    grain.agg = agg
    grain.memo.loaded(set())
    await publish(grain, Committed(command, agg, pending.changes, answer))
    return result


async def resubmitted(
    grain: RunGrain, command: SubmitRun, input_hash: str, now: datetime
) -> SubmitResult:
    """The key already names a run: this very command, resent after it committed (its
    stored answer), or another submission that won the insert (answer with that run)."""
    found, stored = await grain.memo.recall(command, now, look_up=True)
    if found:
        return stored  # type: ignore[no-any-return]
    request = command.request
    winner = await existing(
        grain, command.principal.project_id, request.idempotency_key, input_hash
    )
    if winner is None:
        raise errors.ConcurrencyConflict("the winning submission is not visible") from None
    return winner


async def existing(
    grain: RunGrain, project_id: str, key: str, input_hash: str
) -> SubmitResult | None:
    """The run ``key`` names (invariant 1: with this very input, else ``IdempotencyConflict``)."""
    store = grain.env.store
    run_id = await store.run_id_for_key(grain.tenant_id, project_id, key)
    if run_id is None:
        return None
    agg, _ = await store.load(grain.tenant_id, run_id, grain.env.clock.now())
    assert_same_submission(agg, input_hash)
    run = agg.run
    return SubmitResult(
        run.run_id, str(run.state), run.release_id, run.policy_revision, run.snapshot_id, False
    )


async def start(grain: RunGrain, command: StartRun) -> None:
    """Reserve the budget of an Accepted run and dispatch its first step, in one statement.

    Safe to repeat: the reservation is idempotent per run, and the reminder sweep starts
    again a run left Accepted (a run accepted before migration 0007, or a lost command).
    """
    agg = await grain.load_cached()
    if agg.run.state is not RunState.ACCEPTED:
        return
    if agg.run.budget_reservation_id is not None:
        await decide(grain, Plan(grain.dispatch_due, "run-dispatcher"), command)
        return
    reserve = grain.reservation(agg, grain.env.clock.now())

    def reserve_and_dispatch(a: RunAggregate, c: CommandContext) -> None:
        if a.run.budget_reservation_id is None:
            record_budget_reservation(a, reserve.reservation_id)
        grain.dispatch_due(a, c)

    try:
        await decide(grain, Plan(reserve_and_dispatch, "run-dispatcher"), command, reserve=reserve)
    except errors.BudgetReservationDenied as denied:
        reason = str(denied)
        await decide(grain, Plan(lambda a, c: deny_budget(a, c, reason), "budget"), command)


async def rerun(grain: RunGrain, c: RerunRun) -> SubmitResult:
    """Accept the new run (this grain's) with the finished run's input, linked to it: the
    SubmitRun of the old run's project, keyed by this command's id (a resend answers the
    same run). The old run is read, never written."""
    run = await _finished(grain, c, c.rerun_of, "rerun")
    pinned = c.release is RerunRelease.PINNED
    return await _again(
        grain,
        c,
        run,
        "rerun",
        None if pinned else c.release_alias,
        run.release_id if pinned else None,
        lambda a, x: record_rerun(a, x, run.run_id, str(c.release), c.reason),
    )


async def replay(grain: RunGrain, c: ReplayRun) -> SubmitResult:
    """A rerun's sibling: the new run replays the finished one on the release
    ``release_alias`` names now, marked ``replay_of`` with its options (docs/replay.md)."""
    run = await _finished(grain, c, c.replay_of, "replayed")
    options = ReplayOptions(c.live_calls, c.approvals)
    return await _again(
        grain,
        c,
        run,
        "replay",
        c.release_alias,
        None,
        lambda a, x: record_replay(a, x, run.run_id, options, c.reason),
    )


async def _finished(grain: RunGrain, c: RerunRun | ReplayRun, old_id: UUID, verb: str) -> Run:
    """The finished run ``old_id`` (read, never written), for an operator's ``c``."""
    OPERATOR.admit(c, grain.tenant_id)
    if not c.reason or not c.reason.strip():
        raise errors.ValidationFailed("an operator control needs a reason")
    old, _ = await grain.env.store.load(grain.tenant_id, old_id, grain.env.clock.now())
    run = old.run
    if not run.state.terminal:
        raise errors.RunNotFinished(
            f"run {run.run_id} is {run.state}: only a finished run can be {verb}",
            run_state=str(run.state),
        )
    return run


async def _again(
    grain: RunGrain,
    c: RerunRun | ReplayRun,
    run: Run,
    kind: str,
    release_alias: str | None,
    release_id: str | None,
    also: Also,
) -> SubmitResult:
    """Accept this grain's new run with ``run``'s input, as the SubmitRun of its project keyed
    by ``c``'s id (a resend answers the same run); ``also`` records what links them."""
    request = SubmitRequest(
        project_id=run.project_id,
        idempotency_key=f"{kind}:{run.run_id}:{c.command_id}",
        workflow_id=run.workflow_id,
        model_profile_id=run.model_profile_id,
        input=dict(run.input or {}),
        release_alias=release_alias,
        release_id=release_id,
        limits=run.limits,
        environment_id=run.environment_id,
        correlation_id=run.correlation_id,
        priority=run.priority,
    )
    principal = dataclasses.replace(c.principal, project_id=run.project_id)
    command = SubmitRun(
        tenant_id=grain.tenant_id,
        run_id=grain.run_id,
        command_id=c.command_id,
        principal=principal,
        request=request,
    )
    return await accept(grain, command, also)
