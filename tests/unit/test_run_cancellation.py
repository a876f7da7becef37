"""RunAggregate rules, driven purely in memory with a fixed clock and deterministic ids.

Cancellation: the intent, the holders' settlement, the deadlines and the stop timeout.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from domain_harness import (
    GRACE,
    LEASE,
    LOCAL_STEP,
    NO_APPROVALS,
    READ_STEP,
    REQUESTER,
    T0,
    WRITE_STEP,
    Harness,
    approval_harness,
    assert_refused_cleanly,
    legacy_holder_waiting,
    outcome_hash,
)

from runcontrol.domain import (
    ApprovalState,
    AttemptOutcome,
    AttemptState,
    FailureClass,
    Limits,
    Options,
    RunState,
    StepState,
    errors,
)
from runcontrol.domain.run.cancellation import cancel
from runcontrol.domain.run.leases import acquire_lease, renew_lease

# ============================================================================ cancellation


class TestCancel:
    @pytest.mark.parametrize("reason", ["", "   "])
    def test_needs_a_reason(self, reason):
        h = Harness()
        with pytest.raises(errors.ValidationFailed):
            cancel(h.agg, h.ctx(), REQUESTER, reason)
        assert h.agg.take_changes().empty

    def test_accepted_is_cancelled_directly(self):
        h = Harness([READ_STEP, WRITE_STEP])
        assert h.cancel(REQUESTER, "changed my mind")
        assert h.run.state is RunState.CANCELLED
        assert all(s.state is StepState.CANCELLED for s in h.agg.steps)
        batch = h.batches[-1]
        (intent,) = batch.intents
        assert (intent.requested_by, intent.reason) == (REQUESTER, "changed my mind")
        assert h.last_event_types() == ["CancellationRequested", "RunStateChanged", "RunCancelled"]
        assert batch.events[1].payload["fromState"] == "Accepted"
        assert batch.events[1].payload["cause"] == "CancelRequestedBeforeDispatch"
        assert batch.events[2].payload["reason"] == "changed my mind"
        assert batch.events[2].payload["requestedBy"] == REQUESTER
        # Intent is journalled before the run moves.
        run_entries = [j for j in batch.journal if j.entity == "Run"]
        assert [(j.from_state, j.to_state) for j in run_entries] == [
            (RunState.ACCEPTED, RunState.CANCELLED)
        ]
        assert not h.cancel()  # already terminal
        assert h.batches[-1].empty

    def test_running_with_only_a_dispatched_attempt_settles_at_once(self):
        h = Harness([READ_STEP, LOCAL_STEP])
        attempt = h.dispatch(0)
        assert h.cancel()
        assert attempt.state is AttemptState.CANCELLED
        assert attempt.failure_class is FailureClass.CANCELLATION
        assert [s.state for s in h.agg.steps] == [StepState.CANCELLED, StepState.CANCELLED]
        assert h.run.state is RunState.CANCELLED
        moves = [
            (e.payload["fromState"], e.payload["toState"])
            for e in h.batches[-1].events
            if e.event_type == "RunStateChanged"
        ]
        assert moves == [("Running", "Cancelling"), ("Cancelling", "Cancelled")]

    def test_running_with_a_leased_attempt_waits_for_settlement(self):
        h = Harness([READ_STEP, LOCAL_STEP])
        attempt, grant = h.start(0)
        assert h.cancel(REQUESTER, "stop")
        assert h.run.state is RunState.CANCELLING
        assert attempt.state is AttemptState.LEASED
        assert h.last_event_types() == ["CancellationRequested", "RunStateChanged"]
        assert not h.cancel()  # intent already recorded
        assert h.batches[-1].empty
        # The holder learns about the cancellation when it renews.
        renewed = renew_lease(h.agg, h.ctx(), attempt.attempt_id, "worker-1", 1, h.options)
        h.commit()
        assert renewed.cancel_requested
        # No new lease for anyone while cancelling.
        with pytest.raises(errors.LeaseHeld):
            acquire_lease(h.agg, h.ctx(), attempt.attempt_id, "worker-2", h.options)
        h.report(grant, AttemptOutcome.CANCELLED)
        assert attempt.state is AttemptState.CANCELLED
        assert [s.state for s in h.agg.steps] == [StepState.CANCELLED, StepState.CANCELLED]
        assert h.run.state is RunState.CANCELLED
        assert h.events[-1].event_type == "RunCancelled"
        assert h.events[-1].payload["requestedBy"] == REQUESTER
        assert h.events[-1].payload["reason"] == "stop"

    def test_a_success_during_cancelling_stays_visible(self):
        h = Harness([READ_STEP, LOCAL_STEP])
        attempt, grant = h.start(0)
        h.cancel()
        h.report(grant, AttemptOutcome.SUCCEEDED, receipt=outcome_hash(5))
        assert attempt.state is AttemptState.SUCCEEDED
        assert h.step(0).state is StepState.SUCCEEDED
        assert h.step(0).outcome_hash == outcome_hash(5)
        assert h.step(1).state is StepState.CANCELLED
        assert h.run.state is RunState.CANCELLED
        assert h.last_event_types() == ["AttemptOutcomeRecorded", "RunStateChanged", "RunCancelled"]

    def test_a_failure_during_cancelling_is_not_retried(self):
        h = Harness()
        _, grant = h.start(0)
        h.cancel()
        h.report(grant, AttemptOutcome.FAILED)
        assert h.jitter.calls == []
        assert h.step(0).state is StepState.CANCELLED
        assert h.run.state is RunState.CANCELLED

    def test_stop_timeout_settles_a_side_effecting_attempt_uncertain(self):
        h = Harness([WRITE_STEP], policy=NO_APPROVALS)
        attempt, _ = h.start(0)
        h.cancel()
        h.advance(LEASE + GRACE + 1)
        assert h.expire_lease(attempt)
        assert attempt.state is AttemptState.UNCERTAIN
        assert h.run.state is RunState.CANCELLED

    def test_waiting_for_approval_is_cancelled_at_once(self):
        """Nobody holds a parked attempt: the cancel settles it and the run in one command."""
        h, attempt, grant, approval = approval_harness()
        h.advance(6 * 3600)
        assert h.cancel(REQUESTER, "abort")
        assert h.run.state is RunState.CANCELLED
        assert approval.state is ApprovalState.CANCELLED
        assert attempt.state is AttemptState.CANCELLED
        assert attempt.settled_by == "run-control"
        decided = [e for e in h.batches[-1].events if e.event_type == "ApprovalDecided"]
        assert [e.payload["state"] for e in decided] == ["Cancelled"]
        journal = [j for j in h.batches[-1].journal if j.entity == "Attempt"]
        assert [j.cause for j in journal] == ["CancelledWhileParked"]
        with pytest.raises(errors.ApprovalAlreadyDecided):
            h.decide(approval)
        assert_refused_cleanly(h, "approval-decision-refused")
        # The holder before the park reports late: refused and audited.
        with pytest.raises(errors.StaleFencingToken):
            h.report(grant, AttemptOutcome.CANCELLED)
        assert_refused_cleanly(h, "stale-fencing-token")

    def test_a_holder_that_kept_its_lease_settles_a_cancel_itself(self):
        h, attempt, grant, _ = approval_harness()
        legacy_holder_waiting(h, attempt)
        h.advance(6 * 3600)  # far past the original lease term, but the lease was suspended
        h.cancel()
        assert h.run.state is RunState.CANCELLING
        h.report(grant, AttemptOutcome.CANCELLED)
        assert attempt.state is AttemptState.CANCELLED
        assert h.run.state is RunState.CANCELLED


class TestDeadlinesAndStopTimeout:
    """Cancellation with teeth: deadlines become cancellation intents, and a holder that does
    not stop is settled at the stop timeout (issue 11, items 1 and 3)."""

    OPTIONS = Options(
        lease_seconds=3600,
        cancel_stop_timeout_seconds=120,
        cancel_grace_seconds=30,
        max_run_lifetime_seconds=3600,
    )

    def test_past_the_wall_clock_budget_the_run_is_cancelled_then_settled(self):
        h = Harness(limits=Limits(max_minutes=10), options=self.OPTIONS)
        _, grant = h.start()
        assert h.agg.next_due(h.options) == T0 + timedelta(minutes=10)  # the durable reminder
        h.advance(599)
        assert h.remind() is None
        h.advance(1)
        assert h.remind() == "wall-clock-exceeded"
        assert h.run.state is RunState.CANCELLING
        assert h.agg.intents[-1].reason == "wall-clock-exceeded"
        assert h.renew(grant).cancel_requested  # the holder is told on its next renewal
        # the stop-timeout path applies after cancelGrace, and is the run's next reminder
        assert h.agg.next_due(h.options) == h.now + timedelta(seconds=30)
        h.advance(30)
        assert h.remind() == "stop-timeout"
        (attempt,) = h.agg.attempts.values()
        assert attempt.state is AttemptState.UNCERTAIN
        assert h.run.state is RunState.CANCELLED
        assert any(j.cause == "StopTimeout" for j in h.journal)
        assert h.agg.next_due(h.options) is None

    def test_a_late_report_after_the_stop_timeout_is_refused_and_audited(self):
        h = Harness(options=self.OPTIONS)
        _, grant = h.start()
        h.cancel()
        h.advance(119)
        assert h.remind() is None and h.renew(grant).cancel_requested
        h.advance(1)
        assert h.remind() == "stop-timeout"
        with pytest.raises(errors.StaleFencingToken):
            h.report(grant)
        assert h.run.state is RunState.CANCELLED
        assert [a.kind for a in h.agg.take_audits()] == ["stale-fencing-token"]

    def test_renewals_are_refused_once_the_stop_timeout_has_passed(self):
        h = Harness(options=self.OPTIONS)
        _, grant = h.start()
        h.cancel()
        h.advance(121)  # the reminder has not run yet
        with pytest.raises(errors.LeaseRejected):
            h.renew(grant)
        assert [a.kind for a in h.agg.take_audits()] == ["renewal-after-stop-timeout"]

    def test_a_holder_that_stops_in_time_settles_the_run_cancelled(self):
        h = Harness(options=self.OPTIONS)
        _, grant = h.start()
        h.cancel()
        h.advance(5)
        h.report(grant, AttemptOutcome.CANCELLED)
        assert h.run.state is RunState.CANCELLED
        (attempt,) = h.agg.attempts.values()
        assert attempt.state is AttemptState.CANCELLED

    def test_every_run_is_cancelled_at_its_maximum_lifetime(self):
        h = Harness(options=self.OPTIONS)
        h.dispatch()  # never leased: nothing can have run
        assert h.agg.next_due(h.options) == T0 + timedelta(hours=1)  # the lifetime reminder
        h.advance(3600)
        assert h.remind() == "lifetime-exceeded"
        assert h.run.state is RunState.CANCELLED
        assert h.agg.intents[-1].reason == "lifetime-exceeded"
