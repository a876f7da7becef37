"""Invariant 4: at most one non-terminal attempt per step; no dispatch while the run is
WaitingForApproval or Cancelling."""

from __future__ import annotations

import pytest
from grain_harness import SHARED, CeilingRandom, Harness
from support import cancel, race_async, report, request_approval

from runcontrol.commands import (
    DispatchRun,
    WakeResult,
    WakeRun,
)
from runcontrol.config import Settings
from runcontrol.domain import (
    AttemptOutcome,
    FailureClass,
    RunState,
    StepSpec,
    errors,
)
from runcontrol.domain.run.submission import dispatch, dispatchable_step


def test_repeated_dispatch_and_wake_never_open_a_second_attempt(h: Harness):
    h.publish(StepSpec("s", "agent-a", max_attempts=3))
    grain, _ = h.submit()
    (attempt,) = h.load(grain.run_id).attempts.values()
    h.clock.advance(60)
    for leased in (False, True):
        if leased:
            h.lease(grain)
        for g in (grain, h.grain(grain.run_id)):  # the same activation and a second one
            assert g.execute(DispatchRun(tenant_id=g.tenant_id, run_id=g.run_id)) is None
            assert h.wake(g) == WakeResult()
    agg = h.load(grain.run_id)
    assert list(agg.attempts) == [attempt.attempt_id]
    assert h.event_types(grain.run_id).count("AttemptDispatched") == 1


def test_two_activations_dispatching_a_due_retry_open_one_attempt(h: Harness):
    h.env.rng = CeilingRandom()  # retry 1 is due exactly retry_base_seconds (1 s) later
    grain, grant = h.start_run(StepSpec("s", "agent-a", max_attempts=3))
    report(grain, grant, AttemptOutcome.FAILED, failure_class=FailureClass.TRANSIENT)
    a, b = h.grain(grain.run_id), h.grain(grain.run_id)
    assert (
        a.execute(DispatchRun(tenant_id=a.tenant_id, run_id=a.run_id)) is None
        and b.execute(DispatchRun(tenant_id=b.tenant_id, run_id=b.run_id)) is None
    )  # not due yet; both now cache it
    h.clock.advance(1)

    results = race_async(
        a.grain.execute(DispatchRun(tenant_id=h.tenant, run_id=a.run_id)),
        b.grain.execute(DispatchRun(tenant_id=h.tenant, run_id=b.run_id)),
    )

    dispatched = [v for kind, v in results if kind == "ok" and v is not None]
    assert len(dispatched) == 1, results
    for kind, value in results:
        assert (kind == "ok") or isinstance(value, errors.ConcurrencyConflict), results
    agg = h.load(grain.run_id)
    assert sorted(a.number for a in agg.attempts.values()) == [1, 2]
    assert [a.attempt_id for a in agg.open_attempts()] == [dispatched[0].attempt_id]
    assert h.event_types(grain.run_id).count("AttemptDispatched") == 2


def _assert_no_dispatch(h: Harness, run_id, state: RunState) -> None:
    h.clock.advance(10)  # anything time-gated is due by now (but no lease expires)
    for g in (h.grain(run_id), h.grain(run_id)):
        assert g.execute(DispatchRun(tenant_id=g.tenant_id, run_id=g.run_id)) is None
        assert not h.wake(g).dispatched
    agg = h.load(run_id)
    assert agg.run.state is state
    assert len(agg.attempts) == 1
    # The rule itself: even handed the next Pending step explicitly, the run refuses.
    pending = next(s for s in agg.steps if s.state.value == "Pending")
    assert dispatchable_step(agg, h.clock.now()) is None
    with pytest.raises(errors.IllegalTransition):
        dispatch(agg, h.env.context("run-dispatcher"), pending)


def test_no_dispatch_while_waiting_for_approval(h: Harness):
    grain, grant = h.start_run(
        StepSpec("write", "agent-a", side_effect_class=SHARED), StepSpec("next", "agent-b")
    )
    request_approval(grain, grant)
    _assert_no_dispatch(h, grain.run_id, RunState.WAITING_FOR_APPROVAL)


def test_no_dispatch_while_cancelling(h: Harness):
    grain, _ = h.start_run(StepSpec("first", "agent-a"), StepSpec("next", "agent-b"))
    assert cancel(grain) == "Cancelling"
    _assert_no_dispatch(h, grain.run_id, RunState.CANCELLING)


# ------------------------------------------------------------------ tenant capacity


def capped(make_harness, cap: int) -> Harness:
    settings = Settings.model_validate({"capacity": {"max_open_attempts_per_tenant": cap}})
    return make_harness(settings)


def test_the_capacity_cap_holds_back_a_dispatch_until_an_attempt_ends(make_harness):
    """The cap is a key of the tenant's, taken by the statement that dispatches (migration
    0017): the run past it is Running with its step Pending and held (not due), and its
    dispatch is admitted once an open attempt has ended and freed the slot."""
    h = capped(make_harness, 1)
    first, grant = h.start_run()
    second, result = h.submit()
    assert result.state == "Running"  # BC-26: the step Pending, the run Running
    agg = h.load(second.run_id)
    assert agg.attempts == {}
    (step,) = agg.steps
    assert step.held is not None and step.held["kind"] == "capacity"
    assert agg.next_due(h.env.options) == agg.deadline(h.env.options)  # held: not due now
    assert h.wake(second) == WakeResult()  # still full: nothing dispatched
    assert h.load(second.run_id).attempts == {}

    h.succeed(first, grant)
    h.wake(second)
    (attempt,) = h.load(second.run_id).attempts.values()
    assert str(attempt.state) == "Dispatched"
    assert h.load(second.run_id).steps[0].held is None


def test_runs_racing_for_the_last_slot_dispatch_one(make_harness):
    """Four runs waiting for the one slot of their tenant are woken at once, through two
    processes' stores (two group statements racing, each with several dispatches): exactly
    one attempt is open afterwards, and the other runs wait with their steps Pending."""
    h = capped(make_harness, 1)
    there = make_harness(h.c.settings, h.tenant)  # another process's container, same tenant
    first, grant = h.start_run()
    waiting = [h.submit()[0] for _ in range(4)]
    assert all(h.load(g.run_id).attempts == {} for g in waiting)
    h.succeed(first, grant)  # the slot frees

    wakes = [
        (h if i % 2 else there)
        .grain(g.run_id)
        .grain.execute(WakeRun(tenant_id=h.tenant, run_id=g.run_id))
        for i, g in enumerate(waiting)
    ]
    results = race_async(*wakes)
    assert all(kind == "ok" for kind, _ in results), results
    opened = [g for g in waiting if h.load(g.run_id).attempts]
    assert opened == waiting[:1]  # the slot went to the first in the queue
    for g in waiting:
        agg = h.load(g.run_id)
        assert len(agg.attempts) == (1 if g in opened else 0)
