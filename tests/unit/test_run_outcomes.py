"""RunAggregate rules, driven purely in memory with a fixed clock and deterministic ids.

Outcomes: an attempt's one outcome settles it and its step, and schedules a retry.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from domain_harness import (
    GRACE,
    IRREVERSIBLE_STEP,
    LEASE,
    LOCAL_STEP,
    NO_APPROVALS,
    READ_STEP,
    RUN_ID,
    TENANT,
    WRITE_STEP,
    Harness,
    assert_refused_cleanly,
    outcome_hash,
)

from runcontrol.domain import (
    AttemptOutcome,
    AttemptState,
    FailureClass,
    Options,
    RunState,
    StepState,
    canonical_hash,
    errors,
)
from runcontrol.domain.run.outcomes import report_outcome
from runcontrol.domain.run.submission import dispatchable_step

# ============================================================================ outcomes


class TestOutcomes:
    def test_success_of_the_last_step_completes_the_run(self):
        h = Harness()
        attempt, grant = h.start(0)
        h.advance(5)
        h.report(grant, receipt=outcome_hash(42))
        assert attempt.state is AttemptState.SUCCEEDED
        assert attempt.outcome is AttemptOutcome.SUCCEEDED
        assert attempt.settled_at == h.now and attempt.settled_by == "worker-1"
        assert attempt.failure_class is None
        assert h.step(0).state is StepState.SUCCEEDED
        assert h.step(0).outcome_hash == outcome_hash(42)
        assert h.run.state is RunState.COMPLETED
        assert h.run.outcome_hash == canonical_hash([outcome_hash(42)])
        assert attempt.attempt_id not in h.agg.leases  # lease released
        lease = h.batches[-1].leases[grant.lease_id]
        assert lease.released_at == h.now and not lease.current
        assert h.last_event_types() == ["AttemptOutcomeRecorded", "RunStateChanged", "RunCompleted"]
        assert h.events[-1].payload["outcomeHash"] == h.run.outcome_hash

    def test_success_of_an_earlier_step_keeps_the_run_running(self):
        h = Harness([READ_STEP, LOCAL_STEP])
        _, grant = h.start(0)
        h.report(grant)
        assert h.run.state is RunState.RUNNING
        assert [s.state for s in h.agg.steps] == [StepState.SUCCEEDED, StepState.PENDING]

    def test_a_stale_token_is_rejected_and_audited(self):
        h = Harness()
        attempt, grant = h.start(0)
        with pytest.raises(errors.StaleFencingToken):
            h.report(grant, token=grant.fencing_token - 1)
        (audit,) = assert_refused_cleanly(h, "stale-fencing-token")
        assert audit.tenant_id == TENANT and audit.run_id == RUN_ID
        assert audit.occurred_at == h.now
        assert audit.detail == {
            "attempt_id": str(attempt.attempt_id),
            "holder": "worker-1",
            "fencing_token": 0,
            "current_token": 1,
        }
        assert attempt.state is AttemptState.LEASED  # untouched
        h.report(grant)  # the real holder is still served
        assert h.run.state is RunState.COMPLETED

    def test_a_future_token_is_also_stale(self):
        h = Harness()
        _, grant = h.start(0)
        with pytest.raises(errors.StaleFencingToken):
            h.report(grant, token=99)
        assert_refused_cleanly(h, "stale-fencing-token")

    def test_a_non_holder_is_rejected_and_audited(self):
        h = Harness()
        attempt, grant = h.start(0)
        with pytest.raises(errors.LeaseNotHeld):
            h.report(grant, holder="intruder")
        (audit,) = assert_refused_cleanly(h, "lease-not-held")
        assert audit.actor == "intruder" and audit.detail["holder"] == "intruder"
        assert attempt.state is AttemptState.LEASED

    def test_a_report_on_an_expired_lease_is_rejected_and_audited(self):
        h = Harness()
        attempt, grant = h.start(0)
        h.advance(LEASE + GRACE + 1)
        with pytest.raises(errors.LeaseExpired):
            h.report(grant)
        assert_refused_cleanly(h, "lease-expired")
        assert attempt.state is AttemptState.LEASED  # left for the reconciler

    def test_a_report_without_any_lease_is_rejected_and_audited(self):
        h = Harness()
        attempt = h.dispatch(0)
        with pytest.raises(errors.StaleFencingToken):
            report_outcome(
                h.agg,
                h.ctx("worker-1"),
                attempt.attempt_id,
                "worker-1",
                1,
                AttemptOutcome.SUCCEEDED,
                h.options,
            )
        (audit,) = assert_refused_cleanly(h, "lease-rejected")
        assert audit.detail["reason"] == "no current lease"

    def test_a_report_from_a_holder_whose_attempt_was_reconciled_is_stale_and_audited(self):
        h = Harness()
        attempt, old = h.start(0, holder="worker-1")
        h.advance(LEASE + GRACE + 1)
        assert h.expire_lease(attempt)
        h.now = h.step(0).not_before
        _, new = h.start(0, holder="worker-2")
        assert new.fencing_token > old.fencing_token
        with pytest.raises(errors.StaleFencingToken, match="settled as TimedOut"):
            h.report(old)
        assert_refused_cleanly(h, "stale-fencing-token")
        # And the old token is useless against the new attempt too.
        with pytest.raises(errors.StaleFencingToken):
            h.report(new, token=old.fencing_token)
        assert_refused_cleanly(h, "stale-fencing-token")
        with pytest.raises(errors.LeaseNotHeld):
            h.report(new, holder="worker-1")
        assert_refused_cleanly(h, "lease-not-held")
        h.report(new)
        assert h.run.state is RunState.COMPLETED

    def test_a_second_different_outcome_is_rejected_and_audited(self):
        h = Harness()
        attempt, grant = h.start(0)
        h.report(grant, AttemptOutcome.SUCCEEDED)
        with pytest.raises(errors.OutcomeAlreadyRecorded):
            h.report(grant, AttemptOutcome.FAILED)
        assert_refused_cleanly(h, "duplicate-outcome")
        with pytest.raises(errors.OutcomeAlreadyRecorded):
            h.report(grant, AttemptOutcome.SUCCEEDED, receipt=outcome_hash(777))
        assert_refused_cleanly(h, "duplicate-outcome")
        assert attempt.outcome is AttemptOutcome.SUCCEEDED
        assert h.run.state is RunState.COMPLETED

    def test_an_identical_retried_outcome_is_a_no_op(self):
        h = Harness()
        attempt, grant = h.start(0)
        h.report(grant, receipt=outcome_hash(1))
        events, journal, version = len(h.events), len(h.journal), h.run.version
        again = report_outcome(
            h.agg,
            h.ctx("worker-1"),
            attempt.attempt_id,
            "worker-1",
            grant.fencing_token,
            AttemptOutcome.SUCCEEDED,
            h.options,
            outcome_hash=outcome_hash(1),
        )
        assert again is attempt
        assert h.agg.take_audits() == []
        batch = h.commit()
        assert batch.empty
        assert (len(h.events), len(h.journal), h.run.version) == (events, journal, version)

    def test_an_identical_retried_failure_does_not_schedule_a_second_retry(self):
        h = Harness()
        _, grant = h.start(0)
        h.report(grant, AttemptOutcome.FAILED, receipt=None)
        not_before = h.step(0).not_before
        h.report(grant, AttemptOutcome.FAILED, receipt=None)
        assert h.batches[-1].empty
        assert h.step(0).not_before == not_before
        assert len(h.jitter.calls) == 1

    @pytest.mark.parametrize("outcome", [AttemptOutcome.TIMED_OUT])
    def test_workers_cannot_report_reconciler_outcomes(self, outcome):
        h = Harness()
        _, grant = h.start(0)
        with pytest.raises(errors.ValidationFailed):
            h.report(grant, outcome)

    def test_outcome_hash_must_be_canonical(self):
        h = Harness()
        _, grant = h.start(0)
        with pytest.raises(errors.ValidationFailed, match="outcomeHash"):
            h.report(grant, receipt="not-a-hash")
        assert_refused_cleanly(h)


# ============================================================================ retries


class TestRetries:
    def test_transient_failures_retry_with_backoff_up_to_max_attempts(self):
        h = Harness([{**READ_STEP, "maxAttempts": 3}])
        step = h.step(0)
        _, grant = h.start(0)
        h.advance(10)
        h.report(grant, AttemptOutcome.FAILED, failure_class=FailureClass.TRANSIENT)
        # Attempt 1 failed: delay = uniform(0, min(cap, base * 2**0)) = 0.5 * 1.0 s.
        assert h.jitter.calls == [(0.0, 1.0)]
        assert step.state is StepState.PENDING
        assert step.not_before == h.now + timedelta(seconds=0.5)
        assert h.run.state is RunState.RUNNING
        retry = h.batches[-1].events[-1]
        assert retry.event_type == "StepRetryScheduled"
        assert retry.payload["nextAttemptNumber"] == 2
        assert retry.payload["notBefore"] == step.not_before.isoformat()
        # Not before the backoff has passed.
        assert dispatchable_step(h.agg, h.now) is None
        assert dispatchable_step(h.agg, step.not_before - timedelta(microseconds=1)) is None
        h.now = step.not_before
        assert dispatchable_step(h.agg, h.now) is step

        attempt2, grant = h.start(0)
        assert attempt2.number == 2 and step.not_before is None
        h.report(grant, AttemptOutcome.FAILED)  # failure class defaults to transient
        assert h.jitter.calls == [(0.0, 1.0), (0.0, 2.0)]
        assert step.not_before == h.now + timedelta(seconds=1.0)

        h.now = step.not_before
        attempt3, grant = h.start(0)
        assert attempt3.number == 3
        h.report(grant, AttemptOutcome.FAILED)
        assert len(h.jitter.calls) == 2  # no retry after the last attempt
        assert step.state is StepState.FAILED
        assert step.failure_class is FailureClass.TRANSIENT
        assert h.run.state is RunState.FAILED
        assert h.run.failure_class is FailureClass.TRANSIENT
        assert "3 attempt(s)" in h.run.failure_reason
        assert h.events[-1].event_type == "RunFailed"

    def test_backoff_is_capped(self):
        options = Options(retry_base_seconds=10, retry_cap_seconds=15, default_max_attempts=5)
        h = Harness(options=options, jitter=1.0)
        ceilings = []
        for _ in range(4):
            _, grant = h.start(0)
            h.report(grant, AttemptOutcome.FAILED)
            ceilings.append(h.jitter.calls[-1][1])
            h.now = h.step(0).not_before
        assert ceilings == [10, 15, 15, 15]

    @pytest.mark.parametrize(
        "failure", [FailureClass.PERMANENT, FailureClass.VALIDATION, FailureClass.POLICY_DENIED]
    )
    def test_non_transient_failures_are_not_retried(self, failure):
        h = Harness()
        _, grant = h.start(0)
        h.report(grant, AttemptOutcome.FAILED, failure_class=failure)
        assert h.jitter.calls == []
        assert h.step(0).state is StepState.FAILED
        assert h.run.state is RunState.FAILED and h.run.failure_class is failure

    @pytest.mark.parametrize("step", [WRITE_STEP, IRREVERSIBLE_STEP], ids=["shared", "external"])
    def test_uncertain_on_a_side_effecting_step_is_never_retried(self, step):
        h = Harness([step, READ_STEP], policy=NO_APPROVALS)
        attempt, grant = h.start(0)
        h.report(grant, AttemptOutcome.UNCERTAIN)
        assert attempt.state is AttemptState.UNCERTAIN
        assert attempt.failure_class is FailureClass.UNCERTAIN
        assert h.jitter.calls == []
        assert h.step(0).state is StepState.FAILED
        assert h.step(0).failure_class is FailureClass.UNCERTAIN
        assert h.step(1).state is StepState.CANCELLED
        assert h.run.state is RunState.FAILED
        assert h.run.failure_class is FailureClass.UNCERTAIN
        assert "operator" in h.run.failure_reason
        assert len(h.agg.attempts_of(h.step(0))) == 1
        assert h.events[-1].payload["failureClass"] == "uncertain"

    def test_uncertain_overrides_a_worker_supplied_failure_class(self):
        h = Harness([WRITE_STEP], policy=NO_APPROVALS)
        attempt, grant = h.start(0)
        h.report(grant, AttemptOutcome.UNCERTAIN, failure_class=FailureClass.TRANSIENT)
        assert attempt.failure_class is FailureClass.UNCERTAIN
        assert h.run.state is RunState.FAILED

    @pytest.mark.parametrize("step", [READ_STEP, LOCAL_STEP], ids=["read", "local-write"])
    def test_uncertain_on_a_harmless_step_is_retried(self, step):
        h = Harness([step])
        _, grant = h.start(0)
        h.report(grant, AttemptOutcome.UNCERTAIN)
        assert h.step(0).state is StepState.PENDING
        assert h.step(0).not_before is not None
        assert h.run.state is RunState.RUNNING
        h.now = h.step(0).not_before
        attempt2, grant2 = h.start(0)
        assert attempt2.number == 2 and grant2.fencing_token == 2
