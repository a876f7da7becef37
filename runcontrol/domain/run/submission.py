"""Submission and dispatch: accepting a run (invariants 1 and 2), its budget reservation,
and dispatching its next step as an attempt (invariant 4)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from .. import conditions, errors, flow
from .. import events as ev
from ..hashing import is_hash
from ..machines import (
    RunCommand,
    allows,
    require,
)
from ..model import (
    Attempt,
    PolicyRef,
    ReleaseRef,
    Run,
    Step,
)
from ..rates import Admission, Draw, RatesNeeded, draws, held, rate_reservation, reserved
from ..states import (
    AttemptState,
    FailureClass,
    RunState,
    StepState,
)
from ..workflow import AGENT, MAX_CHILD_DEPTH, RUN, PolicyDocument, Release, StepSpec, dependencies
from .cancellation import cancel
from .children import start_child
from .core import RunAggregate
from .settlement import fail_run, skip_step
from .values import (
    RUN_CONTROL,
    CommandContext,
    FlowGate,
    Options,
    Submission,
)
from .waits import start_wait


def accept_run(
    submission: Submission,
    release: Release,
    policy: PolicyDocument,
    options: Options,
    ctx: CommandContext,
) -> RunAggregate:
    if not is_hash(submission.input_hash):
        raise errors.ValidationFailed("inputHash must be a sha256 canonical hash")
    if release.workflow_id != submission.workflow_id:
        raise errors.ValidationFailed("release does not belong to the submitted workflow")
    if submission.depth > MAX_CHILD_DEPTH:
        raise errors.ValidationFailed(
            f"a child run deeper than {MAX_CHILD_DEPTH} levels is refused", depth=submission.depth
        )
    limits = submission.limits
    definition = release.definition
    run_input = submission.input
    # The keys the run's input gives the release's limits, pinned with it (an input
    # without a field a key reads is refused here: nothing is stored).
    run_flow = flow.keys(
        definition.concurrency, definition.workflow_id, run_input, flow.RUN, "concurrency"
    )
    step_flow = [
        flow.keys(
            spec.concurrency,
            definition.workflow_id,
            run_input,
            flow.ATTEMPT,
            f"steps[{i}].concurrency",
        )
        for i, spec in enumerate(definition.steps)
    ]
    run = Run(
        run_id=submission.run_id,
        tenant_id=submission.tenant_id,
        project_id=submission.project_id,
        environment_id=submission.environment_id,
        idempotency_key=submission.idempotency_key,
        workflow_id=submission.workflow_id,
        release=ReleaseRef(release.release_id, release.content_hash),
        policy=PolicyRef(policy.policy_id, policy.revision),
        model_profile_id=submission.model_profile_id,
        state=RunState.ACCEPTED,
        input_hash=submission.input_hash,
        snapshot_id=submission.snapshot_id,
        requested_by=submission.requested_by,
        created_at=ctx.now,
        updated_at=ctx.now,
        limits=limits,  # limits.max_minutes runs from the first lease grant (deadline_at)
        correlation_id=submission.correlation_id,
        input=submission.input,
        priority=flow.check_priority(submission.priority),
        flow=run_flow,
        parent_run_id=submission.parent_run_id,
        parent_step_id=submission.parent_step_id,
        depth=submission.depth,
        template_id=submission.template_id,
        template_version=submission.template_version,
    )
    steps = [
        Step(
            step_id=ctx.new_id(),
            run_id=run.run_id,
            tenant_id=run.tenant_id,
            ordinal=i + 1,
            name=spec.name,
            agent_id=spec.agent_id,
            skill_id=spec.skill_id,
            state=StepState.PENDING,
            max_attempts=spec.max_attempts or options.default_max_attempts,
            gate=spec.gate,
            side_effect_class=spec.side_effect_class,
            depends_on=list(dependencies(release.definition.steps, spec.name)),
            kind=spec.kind,
            wait=spec.wait,
            condition=spec.when,
            flow=step_flow[i],
            rate_limits=_draws(policy, spec),
        )
        for i, spec in enumerate(release.definition.steps)
    ]
    agg = RunAggregate(run, steps, is_new=True)
    for step in steps:
        agg.changed(step)
    agg.journal(ctx, "Run", run.run_id, None, RunState.ACCEPTED, "SubmitRun")
    agg.record(ctx, ev.RunAccepted, run)
    return agg


def assert_same_submission(agg: RunAggregate, input_hash: str) -> None:
    """Invariant 1: same key + same canonical input -> same run; otherwise a conflict."""
    if input_hash != agg.run.input_hash:
        raise errors.IdempotencyConflict(
            "this Idempotency-Key was used with a different payload",
            run_id=str(agg.run.run_id),
        )


def record_budget_reservation(agg: RunAggregate, reservation_id: UUID) -> None:
    agg.run.budget_reservation_id = reservation_id
    agg.run_changed()


def deny_budget(agg: RunAggregate, ctx: CommandContext, reason: str) -> None:
    fail_run(agg, ctx, FailureClass.POLICY_DENIED, reason, cause="BudgetReservationDenied")


def dispatchable_steps(agg: RunAggregate, now: datetime) -> list[Step]:
    """The steps to dispatch now (a fan-out is several), if the run may dispatch at all:
    invariant 4 holds per run (no dispatch while WaitingForApproval or Cancelling) and
    per step (a ready step is Pending, so it has no open attempt)."""
    if not allows(RunCommand.DISPATCH, agg.run.state):
        return []
    if agg.run.suspended_at is not None:
        return []  # an operator suspended the run: nothing new starts
    return [s for s in agg.ready_steps() if s.not_before is None or s.not_before <= now]


def dispatchable_step(agg: RunAggregate, now: datetime) -> Step | None:
    """The first of ``dispatchable_steps`` (in the release's order), or None."""
    steps = dispatchable_steps(agg, now)
    return steps[0] if steps else None


def start_ready(
    agg: RunAggregate,
    ctx: CommandContext,
    gate: FlowGate | None = None,
    admits: Mapping[tuple[str, int], Admission] | None = None,
    options: Options | None = None,
) -> list[Attempt]:
    """Start every step due now, together: an agent step as a dispatched attempt, a wait
    step as its timer, a run step as its child (no attempt); a step whose condition is
    false is skipped. Answers the attempts, in the release's order.

    ``gate``: the tenant's cap and the keys the dispatching statement refused; a step
    needing a refused key is held instead (or, with ``cancel-newest``, the run is
    cancelled), and takes no rate-limit units meanwhile.

    A step that draws on rate limits dispatches only once its reservation admits it:
    ``admits`` holds the reservations made for this decision, by (step name, attempt
    number); one admitted later than now holds the step (``hold_for_rate``). A step with
    none yet raises ``RatesNeeded`` (the grain reserves and decides again)."""
    attempts: list[Attempt] = []
    started: set[UUID] = set()  # a held step stays Pending: started once per command
    ready = dispatchable_steps(agg, ctx.now)
    while ready:  # a wait that ends as it starts (a kept signal) readies the next ones
        ready = [s for s in ready if not skipped(agg, ctx, s)]  # a skip readies its dependants
        if agg.run.state.terminal:
            return attempts
        needed = [
            (s.name, n, [Draw.from_dict(d) for d in s.rate_limits or ()])
            for s in ready
            if s.kind == AGENT
            and s.rate_limits
            and not reserved(s.held, n := next_attempt_number(agg, s))
            and (s.name, n) not in (admits or {})
            and _refused(flow_slots(agg, s, gate), gate) is None
        ]
        if needed:
            raise RatesNeeded(needed)
        for step in ready:
            started.add(step.step_id)
            if step.kind == RUN:
                start_child(agg, ctx, step, options or Options())
                if not allows(RunCommand.DISPATCH, agg.run.state):
                    return attempts  # the child was refused: the run fails
                continue
            if step.kind != AGENT:
                start_wait(agg, ctx, step)
                continue
            wanted = flow_slots(agg, step, gate)
            refused = _refused(wanted, gate)
            number = next_attempt_number(agg, step)
            if refused is None and step.rate_limits and not reserved(step.held, number):
                admit = (admits or {}).get((step.name, number))
                assert admit is not None  # else RatesNeeded above
                if admit.at > ctx.now:
                    hold_for_rate(agg, step, admit)
                    continue
            if refused is None:
                attempt = dispatch(agg, ctx, step)
                _take_slots(agg, ctx, wanted, attempt)
                attempts.append(attempt)
            elif refused[1].get("strategy") == flow.CANCEL_NEWEST:
                _cancel_newest(agg, ctx, refused[0], refused[1])
                return attempts
            else:
                admit = (admits or {}).get((step.name, number))
                if admit is not None and not reserved(step.held, number):
                    # reserved before the key refused it: the hold keeps the units
                    step.held = held(admit.bucket, admit.at, number)
                _hold(agg, ctx, step, refused[0], refused[1])
        ready = [s for s in dispatchable_steps(agg, ctx.now) if s.step_id not in started]
    return attempts


def skipped(agg: RunAggregate, ctx: CommandContext, step: Step) -> bool:
    """Whether the ready ``step`` is skipped (and now Skipped): every dependency it has was
    skipped (the branch it is on did not run), or its condition is false of the run's input
    and the results of the dependencies that ran (docs/graphs.md, "Conditions")."""
    deps = agg.dependencies_of(step)
    if deps and all(d.state is StepState.SKIPPED for d in deps):
        skip_step(agg, ctx, step, "DependenciesSkipped")
        return True
    if step.condition is None:
        return False
    node = conditions.parse(step.condition)
    if conditions.holds(node, agg.run.input, agg.dependency_results(step)):
        return False
    skip_step(agg, ctx, step, "ConditionFalse")
    return True


def flow_slots(agg: RunAggregate, step: Step, gate: FlowGate | None) -> list[dict[str, Any]]:
    """The slots ``step``'s dispatch needs: the run's workflow-wide keys on its first
    dispatch (held until it ends), the step's own keys and the tenant's cap (per attempt),
    in the order their locks are taken. A replay (docs/replay.md) takes no concurrency key:
    it is not production, and never holds a production run back."""
    wanted: list[dict[str, Any]] = []
    if agg.run.flow and not agg.attempts and agg.run.replay_of is None:
        wanted.extend(agg.run.flow)
    if agg.run.replay_of is None:
        wanted.extend(step.flow or ())
    if gate is not None and gate.capacity is not None:
        wanted.append(
            {
                "name": flow.CAPACITY_NAME,
                "key": flow.CAPACITY_KEY,
                "limit": gate.capacity,
                "strategy": flow.QUEUE,
                "scope": flow.ATTEMPT,
                "kind": flow.CAPACITY,
            }
        )
    return sorted(wanted, key=flow.lock_order)


def _refused(
    wanted: list[dict[str, Any]], gate: FlowGate | None
) -> tuple[dict[str, Any], Any] | None:
    if gate is None or not gate.denied:
        return None
    for k in wanted:
        found = gate.denied.get((k["name"], k["key"]))
        if found is not None:
            return k, found
    return None


def _waiter(agg: RunAggregate, k: dict[str, Any], step: Step) -> str:
    return str(agg.run.run_id) if k["scope"] == flow.RUN else str(step.step_id)


def _take_slots(
    agg: RunAggregate, ctx: CommandContext, wanted: list[dict[str, Any]], a: Attempt
) -> None:
    step = agg.step(a.step_id)
    for k in wanted:
        per_run = k["scope"] == flow.RUN
        agg.want_slot(
            {
                "name": k["name"],
                "key": k["key"],
                "limit": k["limit"],
                "kind": k.get("kind", flow.CONCURRENCY),
                "strategy": k["strategy"],
                "holder": str(agg.run.run_id if per_run else a.attempt_id),
                "waiter": _waiter(agg, k, step),
                "run_id": str(agg.run.run_id),
                "attempt_id": None if per_run else str(a.attempt_id),
                "priority": agg.run.priority,
                "at": ctx.now.isoformat(),
            }
        )
    if step.held is not None:
        step.held = None  # admitted: its changed row is written with the dispatch


def _hold(
    agg: RunAggregate, ctx: CommandContext, step: Step, k: dict[str, Any], found: Any
) -> None:
    """The step waits for a slot of ``k``: Pending, not due, queued in the key's order
    (the transaction that frees a slot makes it due)."""
    held = step.held
    same = held is not None and (held.get("name"), held.get("key")) == (k["name"], k["key"])
    step.held = {
        "kind": k.get("kind", flow.CONCURRENCY),
        "name": k["name"],
        "key": k["key"],
        "limit": k["limit"],
        "holders": int(found.get("holders", k["limit"])),
        "strategy": k["strategy"],
        "since": held["since"] if same and held is not None else ctx.now.isoformat(),
    }
    reservation = rate_reservation(held)
    if reservation is not None:  # its units stay reserved for the dispatch once admitted
        step.held["reservation"] = reservation
    agg.changed(step)
    agg.queue_for_slot(
        {
            "name": k["name"],
            "key": k["key"],
            "limit": k["limit"],
            "kind": k.get("kind", flow.CONCURRENCY),
            "waiter": _waiter(agg, k, step),
            "run_id": str(agg.run.run_id),
            "step_id": None if k["scope"] == flow.RUN else str(step.step_id),
            "priority": agg.run.priority,
            "at": ctx.now.isoformat(),
        }
    )
    if k["strategy"] == flow.CANCEL_OLDEST and not same:
        _cancel_oldest(agg, ctx, k, found)
    if agg.run.state is RunState.ACCEPTED:
        # spec BC-26: a denied slot leaves the step Pending and the run Running
        agg.move_run(ctx, RunState.RUNNING, "ConcurrencyHeld")
    agg.touch(ctx)  # the run's reminder is written again: a held step is not due


def _cancel_oldest(agg: RunAggregate, ctx: CommandContext, k: dict[str, Any], found: Any) -> None:
    """``cancel-oldest``: this run waits, and the key's holders are cancelled (by the host
    after the commit, through the normal cancellation path); it is promoted when they
    settle."""
    holders = [UUID(str(r)) for r in found.get("holderRuns", ()) if str(r) != str(agg.run.run_id)]
    reason = (
        f"concurrency key {k['key']} is wanted by run {agg.run.run_id} ({k['name']}: cancel-oldest)"
    )
    _audit_cancelling(agg, ctx, flow.CANCEL_OLDEST, k, holders)
    agg.cancel_holders(holders, reason)


def _cancel_newest(agg: RunAggregate, ctx: CommandContext, k: dict[str, Any], found: Any) -> None:
    """``cancel-newest``: the run that finds the key busy is cancelled, not held."""
    reason = f"concurrency key {k['key']} is busy ({k['name']}: cancel-newest)"
    _audit_cancelling(agg, ctx, flow.CANCEL_NEWEST, k, found.get("holderRuns", ()))
    cancel(agg, ctx, RUN_CONTROL, reason)


def _audit_cancelling(
    agg: RunAggregate,
    ctx: CommandContext,
    strategy: str,
    k: dict[str, Any],
    holder_runs: Iterable[Any],
) -> None:
    """The audit of a busy concurrency key whose ``strategy`` cancels runs (``flow.<strategy>``),
    naming the key and the runs holding it."""
    agg.audit(
        ctx,
        f"flow.{strategy}",
        name=k["name"],
        key=k["key"],
        limit=k["limit"],
        holder_runs=",".join(str(r) for r in holder_runs),
    )


def next_attempt_number(agg: RunAggregate, step: Step) -> int:
    return len(agg.attempts_of(step)) + 1


def hold_for_rate(agg: RunAggregate, step: Step, admit: Admission) -> None:
    """The step stays Pending until its reservation's instant, the run's reminder then
    (``next_due``), with a visible reason; nothing else changes."""
    step.not_before = admit.at
    step.held = held(admit.bucket, admit.at, next_attempt_number(agg, step))
    agg.changed(step)
    agg.run_changed()  # the run's reminder moves to the instant


def dispatch(agg: RunAggregate, ctx: CommandContext, step: Step) -> Attempt:
    require(RunCommand.DISPATCH, agg.run.state)
    if step.kind != AGENT:
        raise errors.IllegalTransition(
            f"a {step.kind} step has no attempt: no worker executes it",
            step_id=str(step.step_id),
        )
    if any(not a.state.terminal for a in agg.attempts_of(step)):
        raise errors.IllegalTransition(
            "a step may have only one non-terminal attempt", step_id=str(step.step_id)
        )
    previous = agg.attempts_of(step)
    attempt = agg.new(
        Attempt,
        attempt_id=ctx.new_id(),
        step_id=step.step_id,
        number=len(previous) + 1,
        state=AttemptState.DISPATCHED,
        dispatched_at=ctx.now,
    )
    agg.move_step(ctx, step, StepState.RUNNING, "AttemptDispatched")
    step.not_before = None
    step.held = None
    agg.journal(ctx, "Attempt", attempt.attempt_id, None, AttemptState.DISPATCHED, "RunDispatcher")
    # Dispatch is pull-based: the lease and its fencing token are granted when a worker
    # claims the attempt (LeaseGranted), so they are null here.
    agg.record(ctx, ev.AttemptDispatched, attempt, step, attempt_number=attempt.number)
    if agg.run.state is RunState.ACCEPTED:
        agg.move_run(ctx, RunState.RUNNING)
    return attempt


def _draws(policy: PolicyDocument, spec: StepSpec) -> list[dict[str, Any]] | None:
    """The buckets an agent step's dispatch draws on under the pinned revision (None: none,
    so its dispatch makes no reservation at all)."""
    if spec.kind != AGENT:
        return None
    found = draws(policy.rate_limits, spec.agent_id, spec.rate_limits)
    return [d.to_dict() for d in found] or None
