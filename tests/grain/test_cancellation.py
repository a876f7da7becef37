"""Invariant 8: cancellation records intent first; completed effects stay visible; the run is
Cancelled only when every attempt has settled (or the stop timeout settled it as Uncertain)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from grain_harness import SHARED, Harness, outcome_hash
from support import acquire, cancel, decide, renew, report, request_approval

from runcontrol import reconcilers
from runcontrol.commands import (
    RenewLease,
    WakeResult,
)
from runcontrol.domain import (
    WALL_CLOCK_EXCEEDED,
    ApprovalState,
    AttemptOutcome,
    AttemptState,
    Decision,
    Limits,
    RunState,
    StepSpec,
    StepState,
    errors,
)
from runcontrol.store.tables import cancellation_intents


def intents(h: Harness, run_id) -> list:
    return h.rows(cancellation_intents, run_id)


def test_cancel_records_intent_and_waits_for_the_leased_attempt_to_settle(h: Harness):
    grain, grant = h.start_run(StepSpec("first", "agent-a"), StepSpec("second", "agent-b"))
    assert cancel(grain, "no longer needed") == "Cancelling"

    # The intent is committed (and announced) before anything has settled.
    (intent,) = intents(h, grain.run_id)
    assert (intent.requested_by, intent.reason) == ("ops", "no longer needed")
    events = h.outbox(grain.run_id)
    requested = next(e for e in events if e.event_type == "CancellationRequested")
    moved = events[-1]
    assert (moved.event_type, moved.payload["toState"]) == ("RunStateChanged", "Cancelling")
    assert requested.seq < moved.seq
    agg = h.load(grain.run_id)
    assert agg.run.state is RunState.CANCELLING
    assert agg.attempts[grant.attempt_id].state is AttemptState.LEASED

    # The holder learns of it on renewal; asking again records no second intent.
    assert renew(grain, grant).cancel_requested
    assert cancel(grain, "again") == "Cancelling"
    assert len(intents(h, grain.run_id)) == 1

    # The attempt finished its work anyway: the effect stays visible, then the run is Cancelled.
    h.succeed(grain, grant)
    agg = h.load(grain.run_id)
    first, second = agg.steps
    assert (first.state, first.outcome_hash) == (StepState.SUCCEEDED, outcome_hash())
    assert second.state is StepState.CANCELLED
    assert len(agg.attempts) == 1  # step two was never dispatched
    assert agg.run.state is RunState.CANCELLED
    cancelled = h.outbox(grain.run_id)[-1]
    assert cancelled.event_type == "RunCancelled"
    assert (cancelled.payload["reason"], cancelled.payload["requestedBy"]) == (
        "no longer needed",
        "ops",
    )
    run_moves = [(j.from_state, j.to_state) for j in h.journal(grain.run_id) if j.entity == "Run"]
    assert run_moves[-2:] == [("Running", "Cancelling"), ("Cancelling", "Cancelled")]


def test_stop_timeout_settles_an_unreported_shared_write_attempt_as_uncertain(h: Harness):
    grain, grant = h.start_run(StepSpec("write", "agent-a", side_effect_class=SHARED))
    assert cancel(grain) == "Cancelling"
    h.clock.advance(60)
    assert h.wake(grain) == WakeResult()
    assert h.load(grain.run_id).run.state is RunState.CANCELLING  # not assumed settled

    h.clock.advance(60)  # past the stop timeout (120 s after the intent): the reminder settles
    assert h.wake(grain) == WakeResult(stopped="stop-timeout")
    agg = h.load(grain.run_id)
    assert agg.attempts[grant.attempt_id].state is AttemptState.UNCERTAIN
    assert agg.run.state is RunState.CANCELLED


def test_cancel_while_waiting_for_approval(h: Harness):
    grain, grant = h.start_run(StepSpec("write", "agent-a", side_effect_class=SHARED))
    approval = request_approval(grain, grant)
    assert (
        cancel(grain)
        == "Cancelled"  # nobody holds the parked attempt: it settles with the run at once
    )
    agg = h.load(grain.run_id)
    assert agg.approvals[approval.approval_id].state is ApprovalState.CANCELLED
    assert agg.attempts[grant.attempt_id].state is AttemptState.CANCELLED
    with pytest.raises(errors.ApprovalAlreadyDecided):
        decide(
            grain,
            approval,
            h.reviewer(),
            Decision.APPROVE,
            version=agg.approvals[approval.approval_id].version,
        )
    # The holder before the park reports late: refused (and audited).
    with pytest.raises(errors.StaleFencingToken):
        report(grain, grant, AttemptOutcome.CANCELLED)
    assert h.load(grain.run_id).run.state is RunState.CANCELLED


def test_an_attempt_never_leased_settles_at_once(h: Harness):
    h.publish(StepSpec("s", "agent-a"))
    grain, _ = h.submit()
    (attempt,) = h.load(grain.run_id).attempts.values()
    assert cancel(grain) == "Cancelled"
    agg = h.load(grain.run_id)
    assert agg.attempts[attempt.attempt_id].state is AttemptState.CANCELLED
    assert len(intents(h, grain.run_id)) == 1
    with pytest.raises(errors.LeaseRejected):
        acquire(grain, attempt.attempt_id)


def test_a_cancellation_needs_a_reason(h: Harness):
    grain, _ = h.start_run()
    with pytest.raises(errors.ValidationFailed):
        cancel(grain, "  ")
    assert intents(h, grain.run_id) == []
    assert h.load(grain.run_id).run.state is RunState.RUNNING


# ------------------------------------------------------------------ deadlines (issue 11)


def fenced(h: Harness, grain, grant) -> dict:
    return {
        "tenant_id": h.tenant,
        "run_id": grain.run_id,
        "attempt_id": grant.attempt_id,
        "holder": grant.holder,
        "fencing_token": grant.fencing_token,
    }


def test_a_run_over_its_wall_clock_budget_is_cancelled_by_its_durable_reminder(h: Harness):
    """``limits.maxMinutes`` runs from the first lease grant. The deadline is the run's stored
    reminder (``next_due_at``), so it survives every activation (a restart of every actor):
    the sweep finds the run, a fresh activation wakes it, and the cancellation is recorded with
    reason ``wall-clock-exceeded``; after ``cancelGrace`` the silent holder's attempt is settled
    Uncertain and the run ends Cancelled."""
    h.publish(StepSpec("work", "agent-a"))
    grain, _ = h.submit(h.request(limits=Limits(max_minutes=10)))
    h.clock.advance(30)
    grant = h.lease(grain)
    deadline = h.clock.now() + timedelta(minutes=10)
    assert h.load(grain.run_id).run.deadline_at == deadline

    for _ in range(5):  # the holder keeps its lease, as a working holder does
        h.clock.advance(118)
        grain.execute(RenewLease(**fenced(h, grain, grant)))
    h.clock.advance(10)
    assert h.clock.now() == deadline
    assert (h.tenant, grain.run_id) in reconcilers.due_dispatches(h.db, deadline).keys
    restarted = h.grain(grain.run_id)  # nothing of the first activation survives
    assert h.wake(restarted).stopped == WALL_CLOCK_EXCEEDED
    agg = h.load(grain.run_id)
    assert agg.run.state is RunState.CANCELLING
    assert [i.reason for i in agg.intents] == [WALL_CLOCK_EXCEEDED]

    h.clock.advance(30)  # cancelGrace (default 30 s): the holder never reported
    assert h.wake(h.grain(grain.run_id)).stopped == "stop-timeout"
    agg = h.load(grain.run_id)
    assert agg.run.state is RunState.CANCELLED
    assert agg.attempts[grant.attempt_id].state is AttemptState.UNCERTAIN
    with pytest.raises(errors.StaleFencingToken):
        h.succeed(grain, grant)  # the late report is refused ...
    assert h.audits(grain.run_id, "stale-fencing-token")  # ... and audited
