"""RunAggregate rules, driven purely in memory with a fixed clock and deterministic ids."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from domain_harness import (
    INPUT,
    READ_STEP,
    REQUESTER,
    RUN_ID,
    SNAPSHOT_ID,
    T0,
    TENANT,
    WRITE_STEP,
    Harness,
    make_release,
    make_submission,
    outcome_hash,
    proposal,
)

from runcontrol.domain import (
    ApprovalState,
    AttemptOutcome,
    AttemptState,
    Decision,
    FailureClass,
    Limits,
    Options,
    PolicyDocument,
    Principal,
    Role,
    RunAggregate,
    RunState,
    StepState,
    canonical_hash,
    errors,
)
from runcontrol.domain.events import TOPICS
from runcontrol.domain.machines import (
    APPROVAL_TRANSITIONS,
    ATTEMPT_TRANSITIONS,
    RUN_TRANSITIONS,
    STEP_TRANSITIONS,
)

LOCAL_STEP = {"name": "local", "agentId": "editor", "sideEffectClass": "local-write"}
IRREVERSIBLE_STEP = {
    "name": "deploy",
    "agentId": "deployer",
    "sideEffectClass": "external-irreversible",
}
GATED_READ_STEP = {"name": "gated", "agentId": "reader", "gate": "approval"}
NO_APPROVALS = PolicyDocument(policy_id="pol-1", revision="7", approval_required_for=frozenset())

LEASE = Options().lease_seconds
GRACE = Options().renewal_grace_seconds


def assert_refused_cleanly(h: Harness, *audit_kinds: str) -> list:
    """A refused command leaves only the audit records it was asked to keep."""
    audits = h.agg.take_audits()
    assert [a.kind for a in audits] == list(audit_kinds)
    version = h.run.version
    leftover = h.agg.take_changes()
    assert leftover.empty, leftover
    assert not leftover.events and not leftover.journal and not leftover.audits
    assert h.run.version == version
    return audits


# ============================================================================ SubmitRun


class TestAccept:
    def test_pins_release_policy_snapshot_and_creates_pending_steps(self):
        h = Harness([READ_STEP, {**WRITE_STEP, "maxAttempts": 5}])
        run = h.run
        assert run.state is RunState.ACCEPTED
        assert run.run_id == RUN_ID and run.snapshot_id == SNAPSHOT_ID
        assert run.release_id == "rel-0001"
        assert run.release.hash == h.release.content_hash
        assert run.policy.policy_id == "pol-1" and run.policy_revision == "7"
        assert run.input_hash == canonical_hash(INPUT)
        assert run.requested_by == REQUESTER
        assert [s.state for s in h.agg.steps] == [StepState.PENDING, StepState.PENDING]
        assert [s.ordinal for s in h.agg.steps] == [1, 2]
        assert [s.max_attempts for s in h.agg.steps] == [3, 5]  # default, then release override

    def test_first_batch_is_an_insert_with_run_accepted(self):
        h = Harness()
        first = h.batches[0]
        assert first.expected_version is None  # a new row, not an UPDATE
        assert first.run_dirty
        assert set(first.steps) == {s.step_id for s in h.agg.steps}
        assert [e.event_type for e in first.events] == ["RunAccepted"]
        accepted = first.events[0]
        assert accepted.seq == 1
        assert accepted.topic == TOPICS["RunAccepted"]
        assert accepted.payload == {
            "runId": str(RUN_ID),
            "tenantId": TENANT,
            "projectId": "project-a",
            "workflowId": "wf-assess",
            "releaseId": "rel-0001",
            "policyRevision": "7",
            "modelProfileId": "code-agent",
            "requestedBy": REQUESTER,
        }
        assert [(j.sequence, j.from_state, j.to_state) for j in first.journal] == [
            (1, None, RunState.ACCEPTED)
        ]
        assert h.run.version == 1

    def test_the_wall_clock_budget_starts_at_the_first_lease_grant(self):
        h = Harness(limits=Limits(max_cost_usd=12, max_minutes=45))
        assert h.run.deadline_at is None  # accepted, nothing has run yet
        h.advance(90)
        attempt, grant = h.start()
        assert h.run.deadline_at == T0 + timedelta(seconds=90, minutes=45)
        h.advance(10)
        h.report(grant, AttemptOutcome.FAILED, failure_class=FailureClass.TRANSIENT)
        h.advance(60)
        h.lease(h.dispatch())  # a retry's lease does not move it
        assert h.run.deadline_at == T0 + timedelta(seconds=90, minutes=45)

    def test_rejects_a_non_canonical_input_hash(self):
        h = Harness()
        with pytest.raises(errors.ValidationFailed, match="inputHash"):
            RunAggregate.accept(
                make_submission(input_hash="abc"), h.release, h.policy, h.options, h.ctx()
            )

    def test_rejects_a_release_of_another_workflow(self):
        h = Harness()
        other = make_release([READ_STEP], workflow_id="other-workflow")
        with pytest.raises(errors.ValidationFailed, match="release"):
            RunAggregate.accept(make_submission(), other, h.policy, h.options, h.ctx())

    def test_idempotency_same_input_is_the_same_run_different_input_conflicts(self):
        h = Harness()
        h.agg.assert_same_submission(canonical_hash(dict(reversed(list(INPUT.items())))))
        with pytest.raises(errors.IdempotencyConflict) as info:
            h.agg.assert_same_submission(canonical_hash({**INPUT, "revision": "ffff"}))
        assert info.value.details == {"run_id": str(RUN_ID)}
        assert h.agg.take_changes().empty

    def test_pinned_fields_never_change_through_a_whole_run(self):
        h = Harness([READ_STEP, WRITE_STEP])
        pinned = (h.run.release, h.run.policy, h.run.snapshot_id, h.run.model_profile_id)
        _, g = h.start(0)
        h.report(g)
        attempt, g = h.start(1)
        approval = h.request_approval(g, proposal(1))
        h.decide(approval)
        h.report(h.lease(attempt, "worker-2"))
        assert h.run.state is RunState.COMPLETED
        assert (h.run.release, h.run.policy, h.run.snapshot_id, h.run.model_profile_id) == pinned

    def test_budget_denial_fails_an_accepted_run_policy_denied(self):
        h = Harness([READ_STEP, READ_STEP | {"name": "two"}])
        h.agg.deny_budget(h.ctx("budget"), "over the tenant limit")
        h.commit()
        assert h.run.state is RunState.FAILED
        assert h.run.failure_class is FailureClass.POLICY_DENIED
        assert all(s.state is StepState.CANCELLED for s in h.agg.steps)
        changed = [e for e in h.events if e.event_type == "RunStateChanged"][-1]
        assert changed.payload["cause"] == "BudgetReservationDenied"
        assert h.events[-1].event_type == "RunFailed"
        assert h.events[-1].payload["failureClass"] == "policy-denied"


# ============================================================================ dispatch


class TestDispatch:
    def test_first_dispatch_moves_the_run_to_running(self):
        h = Harness([READ_STEP, WRITE_STEP])
        assert h.agg.dispatchable_step(h.now) is h.step(0)
        attempt = h.dispatch(0)
        assert attempt.number == 1 and attempt.state is AttemptState.DISPATCHED
        assert attempt.dispatched_at == T0 and attempt.fencing_token is None
        assert h.step(0).state is StepState.RUNNING
        assert h.run.state is RunState.RUNNING
        batch = h.batches[-1]
        assert [e.event_type for e in batch.events] == ["AttemptDispatched", "RunStateChanged"]
        assert batch.events[0].payload["attemptNumber"] == 1
        assert batch.events[1].payload["cause"] == "FirstAttemptDispatched"
        assert [(j.entity, j.from_state, j.to_state) for j in batch.journal] == [
            ("Step", StepState.PENDING, StepState.RUNNING),
            ("Attempt", None, AttemptState.DISPATCHED),
            ("Run", RunState.ACCEPTED, RunState.RUNNING),
        ]
        assert batch.expected_version == 1 and h.run.version == 2

    def test_steps_run_in_order(self):
        h = Harness([READ_STEP, WRITE_STEP])
        _, grant = h.start(0)
        assert h.agg.dispatchable_step(h.now) is None  # step 1 in flight
        h.report(grant)
        assert h.agg.dispatchable_step(h.now) is h.step(1)

    def test_at_most_one_open_attempt_per_step(self):
        h = Harness()
        attempt = h.dispatch(0)
        with pytest.raises(errors.IllegalTransition):
            h.agg.dispatch(h.ctx(), h.step(0))
        assert_refused_cleanly(h)
        h.lease(attempt)
        with pytest.raises(errors.IllegalTransition):
            h.agg.dispatch(h.ctx(), h.step(0))
        assert_refused_cleanly(h)
        assert len(h.agg.attempts_of(h.step(0))) == 1

    def test_open_attempt_guard_holds_even_if_the_step_looks_pending(self):
        # E.g. a step row reloaded inconsistently: the attempt guard is the invariant.
        h = Harness()
        h.dispatch(0)
        h.step(0).state = StepState.PENDING
        with pytest.raises(errors.IllegalTransition, match="one non-terminal attempt") as info:
            h.agg.dispatch(h.ctx(), h.step(0))
        assert info.value.details == {"step_id": str(h.step(0).step_id)}
        assert len(h.agg.attempts) == 1

    def test_no_dispatch_while_waiting_for_approval(self):
        h = Harness([WRITE_STEP, READ_STEP])
        _, grant = h.start(0)
        h.request_approval(grant, proposal(1))
        assert h.run.state is RunState.WAITING_FOR_APPROVAL
        assert h.agg.dispatchable_step(h.now) is None
        for index in (0, 1):
            with pytest.raises(errors.IllegalTransition, match="WaitingForApproval") as info:
                h.agg.dispatch(h.ctx(), h.step(index))
            assert info.value.details == {"run_state": "WaitingForApproval"}
            assert_refused_cleanly(h)

    def test_no_dispatch_while_cancelling(self):
        h = Harness([READ_STEP, READ_STEP | {"name": "two"}])
        _, _grant = h.start(0)
        h.cancel()
        assert h.run.state is RunState.CANCELLING
        assert h.agg.dispatchable_step(h.now) is None
        with pytest.raises(errors.IllegalTransition, match="Cancelling"):
            h.agg.dispatch(h.ctx(), h.step(1))
        assert_refused_cleanly(h)

    @pytest.mark.parametrize("end", ["completed", "cancelled", "failed"])
    def test_no_dispatch_on_a_terminal_run(self, end):
        h = Harness()
        if end == "completed":
            _, g = h.start(0)
            h.report(g)
        elif end == "cancelled":
            h.cancel()
        else:
            h.agg.deny_budget(h.ctx(), "denied")
            h.commit()
        assert h.run.state.terminal
        assert h.agg.dispatchable_step(h.now) is None
        with pytest.raises(errors.IllegalTransition):
            h.agg.dispatch(h.ctx(), h.step(0))


# ============================================================================ leases


class TestLeases:
    def test_grant_carries_token_expiry_and_step_binding(self):
        h = Harness([{**READ_STEP, "skillId": "scan"}])
        attempt, grant = h.start(0, holder="worker-1")
        assert grant.fencing_token == 1
        assert grant.holder == "worker-1"
        assert grant.expires_at == T0 + timedelta(seconds=LEASE)
        assert (grant.agent_id, grant.skill_id, grant.attempt_number) == ("reader", "scan", 1)
        assert not grant.cancel_requested
        assert attempt.state is AttemptState.LEASED
        assert attempt.lease_id == grant.lease_id and attempt.fencing_token == 1
        granted = h.batches[-1].events
        assert [e.event_type for e in granted] == ["LeaseGranted"]
        assert granted[0].payload["fencingToken"] == 1

    def test_a_retried_claim_by_the_holder_returns_the_same_lease(self):
        h = Harness()
        attempt, grant = h.start(0)
        again = h.agg.acquire_lease(h.ctx(), attempt.attempt_id, "worker-1", h.options)
        assert again == grant
        assert h.agg.take_changes().empty

    def test_another_worker_cannot_take_a_held_lease(self):
        h = Harness()
        attempt, _ = h.start(0)
        with pytest.raises(errors.LeaseHeld):
            h.agg.acquire_lease(h.ctx(), attempt.attempt_id, "worker-2", h.options)
        assert_refused_cleanly(h)

    def test_a_lease_needs_a_holder(self):
        h = Harness()
        attempt = h.dispatch(0)
        with pytest.raises(errors.ValidationFailed):
            h.agg.acquire_lease(h.ctx(), attempt.attempt_id, "", h.options)

    def test_no_lease_on_a_settled_attempt(self):
        h = Harness()
        attempt, grant = h.start(0)
        h.report(grant)
        with pytest.raises(errors.LeaseRejected, match="settled"):
            h.agg.acquire_lease(h.ctx(), attempt.attempt_id, "worker-2", h.options)

    def test_unknown_attempt(self):
        h = Harness()
        with pytest.raises(errors.AttemptNotFound):
            h.agg.acquire_lease(h.ctx(), UUID(int=999_999), "worker-1", h.options)

    def test_fencing_tokens_strictly_increase_across_leases(self):
        h = Harness([READ_STEP, LOCAL_STEP], options=Options(default_max_attempts=4))
        tokens = []
        for _ in range(3):  # three attempts of step 1 lost to lease expiry
            attempt, grant = h.start(0, holder=f"worker-{len(tokens)}")
            tokens.append(grant.fencing_token)
            h.advance(LEASE + GRACE + 1)
            assert h.expire_lease(attempt)
            h.now = h.step(0).not_before
        attempt, grant = h.start(0)
        tokens.append(grant.fencing_token)
        h.report(grant)
        _, grant = h.start(1)
        tokens.append(grant.fencing_token)
        assert tokens == [1, 2, 3, 4, 5]
        numbers = [a.number for a in h.agg.attempts_of(h.step(0))]
        assert numbers == [1, 2, 3, 4]

    def test_renewal_extends_the_lease(self):
        h = Harness()
        attempt, grant = h.start(0)
        h.advance(100)
        renewed = h.agg.renew_lease(h.ctx(), attempt.attempt_id, "worker-1", 1, h.options)
        assert renewed.expires_at == h.now + timedelta(seconds=LEASE)
        assert renewed.fencing_token == grant.fencing_token  # renewal is not a new lease
        batch = h.commit()
        assert grant.lease_id in batch.leases
        assert h.agg.leases[attempt.attempt_id].expires_at == renewed.expires_at

    def test_renewal_within_grace_is_allowed_and_after_grace_refused_and_audited(self):
        h = Harness()
        attempt, _ = h.start(0)
        h.advance(LEASE + GRACE)  # exactly at the deadline: still the holder's
        h.agg.renew_lease(h.ctx(), attempt.attempt_id, "worker-1", 1, h.options)
        h.commit()
        h.advance(LEASE + GRACE + 0.001)
        with pytest.raises(errors.LeaseExpired):
            h.agg.renew_lease(h.ctx("worker-1"), attempt.attempt_id, "worker-1", 1, h.options)
        (audit,) = assert_refused_cleanly(h, "lease-expired")
        assert audit.actor == "worker-1"
        assert audit.detail["attempt_id"] == str(attempt.attempt_id)

    def test_renewal_with_a_stale_token_is_refused_and_audited(self):
        h = Harness()
        attempt, _ = h.start(0)
        with pytest.raises(errors.StaleFencingToken):
            h.agg.renew_lease(h.ctx(), attempt.attempt_id, "worker-1", 0, h.options)
        (audit,) = assert_refused_cleanly(h, "stale-fencing-token")
        assert audit.detail["fencing_token"] == 0 and audit.detail["current_token"] == 1

    def test_renewal_by_a_non_holder_is_refused_and_audited(self):
        h = Harness()
        attempt, _ = h.start(0)
        with pytest.raises(errors.LeaseNotHeld):
            h.agg.renew_lease(h.ctx(), attempt.attempt_id, "worker-2", 1, h.options)
        assert_refused_cleanly(h, "lease-not-held")


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
        assert [e.event_type for e in h.batches[-1].events] == [
            "AttemptOutcomeRecorded",
            "RunStateChanged",
            "RunCompleted",
        ]
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
            h.agg.report_outcome(
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
        again = h.agg.report_outcome(
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
        assert h.agg.dispatchable_step(h.now) is None
        assert h.agg.dispatchable_step(step.not_before - timedelta(microseconds=1)) is None
        h.now = step.not_before
        assert h.agg.dispatchable_step(h.now) is step

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


# ============================================================================ lease expiry


class TestLeaseExpiry:
    def test_not_before_expiry_plus_grace(self):
        h = Harness()
        attempt, _ = h.start(0)
        h.advance(LEASE)
        assert not h.expire_lease(attempt)
        h.advance(GRACE)  # exactly expires_at + grace: still not
        assert not h.expire_lease(attempt)
        assert attempt.state is AttemptState.LEASED
        assert h.batches[-1].empty

    def test_read_step_times_out_and_is_retried(self):
        h = Harness()
        attempt, grant = h.start(0)
        h.advance(LEASE + GRACE + 0.5)
        assert h.expire_lease(attempt)
        assert attempt.state is AttemptState.TIMED_OUT
        assert attempt.outcome is AttemptOutcome.TIMED_OUT
        assert attempt.failure_class is FailureClass.TRANSIENT
        assert attempt.settled_by == "lease-expiry-reconciler"
        assert attempt.attempt_id not in h.agg.leases
        batch = h.batches[-1]
        assert [e.event_type for e in batch.events] == [
            "LeaseExpired",
            "AttemptOutcomeRecorded",
            "StepRetryScheduled",
        ]
        assert batch.events[0].payload == {
            "attemptId": str(attempt.attempt_id),
            "leaseId": str(grant.lease_id),
            "holder": "worker-1",
            "fencingToken": 1,
        }
        assert batch.leases[grant.lease_id].release_cause == "LeaseExpired"
        assert h.step(0).state is StepState.PENDING
        assert h.run.state is RunState.RUNNING
        assert not h.expire_lease(attempt)  # reconciling twice does nothing

    def test_shared_write_step_settles_uncertain_and_is_not_retried(self):
        h = Harness([WRITE_STEP], policy=NO_APPROVALS)
        attempt, _ = h.start(0)
        h.advance(LEASE + GRACE + 1)
        assert h.expire_lease(attempt)
        assert attempt.state is AttemptState.UNCERTAIN
        assert attempt.failure_class is FailureClass.UNCERTAIN
        assert h.jitter.calls == []
        assert h.run.state is RunState.FAILED
        assert h.run.failure_class is FailureClass.UNCERTAIN

    def test_a_renewed_lease_does_not_expire(self):
        h = Harness()
        attempt, _ = h.start(0)
        h.advance(LEASE)
        h.agg.renew_lease(h.ctx(), attempt.attempt_id, "worker-1", 1, h.options)
        h.commit()
        h.advance(LEASE + GRACE)
        assert not h.expire_lease(attempt)
        h.advance(1)
        assert h.expire_lease(attempt)

    def test_a_parked_attempt_has_no_lease_to_expire(self):
        h = Harness([GATED_READ_STEP])
        attempt, grant = h.start(0)
        approval = h.request_approval(grant, proposal(1))
        h.advance(24 * 3600)
        assert not h.expire_lease(attempt)
        assert attempt.state is AttemptState.PARKED
        assert attempt.attempt_id not in h.agg.leases
        # The old holder holds nothing: its renewal is refused and audited.
        with pytest.raises(errors.StaleFencingToken):
            h.agg.renew_lease(h.ctx(), attempt.attempt_id, "worker-1", 1, h.options)
        assert_refused_cleanly(h, "lease-rejected")
        h.decide(approval)
        # After the decision a claim gets a full term from the claim's time.
        grant = h.lease(attempt, "worker-2")
        assert grant.expires_at == h.now + timedelta(seconds=LEASE)
        h.advance(LEASE + GRACE)
        assert not h.expire_lease(attempt)
        h.report(grant)
        assert h.run.state is RunState.COMPLETED

    def test_unknown_or_unleased_attempts_are_ignored(self):
        h = Harness()
        attempt = h.dispatch(0)
        h.advance(10 * LEASE)
        assert not h.expire_lease(attempt)
        assert not h.agg.expire_lease(h.ctx(), UUID(int=424242), h.options)


# ============================================================================ approvals


def legacy_holder_waiting(h: Harness, attempt: Any) -> None:
    """Put back the state a run written before parking (migration 0011) loads with: the holder
    kept its lease while a human decided."""
    lease = next(
        x
        for b in reversed(h.batches)
        for x in b.leases.values()
        if x.attempt_id == attempt.attempt_id
    )
    lease.released_at = lease.release_cause = None
    attempt.state = AttemptState.LEASED
    h.agg.leases[attempt.attempt_id] = lease


def approval_harness(**kwargs) -> tuple[Harness, object, object, object]:
    h = Harness([WRITE_STEP], **kwargs)
    attempt, grant = h.start(0)
    approval = h.request_approval(grant, proposal(1))
    return h, attempt, grant, approval


class TestApprovals:
    def test_request_pauses_the_run(self):
        h, attempt, _grant, approval = approval_harness()
        assert approval.state is ApprovalState.PENDING and approval.version == 1
        assert approval.proposal_hash == proposal(1)
        assert approval.attempt_id == attempt.attempt_id
        assert approval.requested_by == REQUESTER
        assert approval.policy_revision == "7"
        assert approval.approver_rule == h.policy.approver_rule
        assert approval.expires_at == T0 + timedelta(hours=72)
        assert h.run.state is RunState.WAITING_FOR_APPROVAL
        batch = h.batches[-1]
        assert [e.event_type for e in batch.events] == [
            "ApprovalRequested",
            "RunStateChanged",
            "AttemptParked",
        ]
        assert batch.events[0].payload["proposalHash"] == proposal(1)
        # The wait holds no worker: the lease is released and the attempt is parked.
        assert attempt.state is AttemptState.PARKED
        assert attempt.attempt_id not in h.agg.leases
        (released,) = batch.leases.values()
        assert released.released_at == h.now and released.release_cause == "ParkedForApproval"
        parked = batch.events[2].payload
        assert parked["approvalId"] == str(approval.approval_id)
        assert parked["fencingToken"] == 1 and parked["holder"] == "worker-1"
        # Parked is not claimable until the decision.
        with pytest.raises(errors.LeaseRejected, match="approval"):
            h.lease(attempt, "worker-2")
        assert_refused_cleanly(h)

    def test_policy_expiry_overrides_the_default(self):
        h, _, _, approval = approval_harness(
            policy=PolicyDocument(policy_id="p", revision="8", expiry_hours=2)
        )
        assert approval.expires_at == T0 + timedelta(hours=2)

    def test_no_request_when_policy_needs_none(self):
        h = Harness([READ_STEP])
        _, grant = h.start(0)
        assert h.request_approval(grant, proposal(1)) is None
        assert h.run.state is RunState.RUNNING
        assert h.batches[-1].empty

    def test_request_needs_the_current_lease(self):
        h = Harness([WRITE_STEP])
        attempt, grant = h.start(0)
        with pytest.raises(errors.StaleFencingToken):
            h.agg.request_approval(
                h.ctx(), attempt.attempt_id, "worker-1", 0, proposal(1), h.policy, h.options
            )
        assert_refused_cleanly(h, "stale-fencing-token")
        with pytest.raises(errors.LeaseNotHeld):
            h.agg.request_approval(
                h.ctx(), attempt.attempt_id, "worker-2", 1, proposal(1), h.policy, h.options
            )
        assert_refused_cleanly(h, "lease-not-held")
        with pytest.raises(errors.ValidationFailed, match="proposalHash"):
            h.agg.request_approval(
                h.ctx(), attempt.attempt_id, "worker-1", 1, "deadbeef", h.policy, h.options
            )
        assert_refused_cleanly(h)

    def test_the_parked_holder_cannot_ask_again(self):
        """Its lease was released when it parked: a second request with the same or another
        proposal is refused and audited (a resend of the same command gets the stored answer
        from the grain instead, tests/grain)."""
        h, _, grant, approval = approval_harness()
        for hashed in (proposal(1), proposal(2)):
            with pytest.raises(errors.StaleFencingToken):
                h.request_approval(grant, hashed)
            assert_refused_cleanly(h, "lease-rejected")
        assert list(h.agg.approvals.values()) == [approval]

    def test_a_holder_that_kept_its_lease_asks_the_same_proposal_again(self):
        """A run written before parking (migration 0011) may have a holder that kept its lease
        while a human decided: the same proposal asked again is the same request, and parks."""
        h, attempt, grant, approval = approval_harness()
        legacy_holder_waiting(h, attempt)
        assert h.request_approval(grant, proposal(1)) is approval
        assert [e.event_type for e in h.batches[-1].events] == ["AttemptParked"]
        assert attempt.state is AttemptState.PARKED
        assert len(h.agg.approvals) == 1

    def test_a_regenerated_proposal_makes_the_pending_request_stale(self):
        h, attempt, grant, old = approval_harness()
        legacy_holder_waiting(h, attempt)
        new = h.request_approval(grant, proposal(2))
        assert new is not old
        assert old.state is ApprovalState.STALE and old.version == 2
        assert old.reason == "proposal regenerated"
        assert new.state is ApprovalState.PENDING and new.proposal_hash == proposal(2)
        assert h.run.state is RunState.WAITING_FOR_APPROVAL
        batch = h.batches[-1]
        assert [e.event_type for e in batch.events] == [
            "ApprovalDecided",
            "ApprovalRequested",
            "AttemptParked",
        ]
        assert batch.events[0].payload["state"] == "Stale"
        # A decision on the old proposal can never apply.
        with pytest.raises(errors.ApprovalGone):
            h.decide(old)
        assert_refused_cleanly(h)
        h.decide(new)
        assert new.state is ApprovalState.APPROVED
        assert h.lease(attempt, "worker-2").approved_proposal_hash == proposal(2)

    def test_approve_resumes_the_run_and_the_worker_completes(self):
        h, attempt, grant, approval = approval_harness()
        h.advance(3600)
        h.decide(approval, "rita", reason="looks right")
        assert approval.state is ApprovalState.APPROVED
        assert approval.decided_by == "rita" and approval.decided_at == h.now
        assert approval.reason == "looks right" and approval.version == 2
        assert h.run.state is RunState.RUNNING
        batch = h.batches[-1]
        assert [e.event_type for e in batch.events] == [
            "ApprovalDecided",
            "RunStateChanged",
            "AttemptResumed",
        ]
        assert batch.events[1].payload["cause"] == "ApprovalGranted"
        resumed = batch.events[2].payload
        assert resumed["approvalState"] == "Approved" and resumed["agentId"] == "writer"
        (vote,) = batch.decisions
        assert vote.decision is Decision.APPROVE and not vote.break_glass
        assert vote.proposal_hash == proposal(1)
        # The attempt is claimable again, by any worker, with a new lease and fencing token.
        assert attempt.state is AttemptState.DISPATCHED and attempt.dispatched_at == h.now
        resumed_grant = h.lease(attempt, "worker-2")
        assert resumed_grant.fencing_token == grant.fencing_token + 1
        assert resumed_grant.approved_proposal_hash == proposal(1)
        assert resumed_grant.attempt_number == grant.attempt_number
        # Asking again for the approved proposal returns the approved request, changing nothing.
        assert h.request_approval(resumed_grant, proposal(1)) is approval
        assert h.batches[-1].empty
        # The holder before the park is refused, and audited.
        with pytest.raises(errors.StaleFencingToken):
            h.report(grant)
        assert_refused_cleanly(h, "stale-fencing-token")
        h.report(resumed_grant)
        assert h.run.state is RunState.COMPLETED

    def test_the_worker_cannot_report_while_its_approval_is_pending(self):
        h, attempt, grant, _ = approval_harness()
        with pytest.raises(errors.StaleFencingToken):
            h.report(grant)
        assert_refused_cleanly(h, "lease-rejected")
        assert attempt.state is AttemptState.PARKED

    def test_decision_bound_to_the_proposal_hash(self):
        h, _, _, approval = approval_harness()
        with pytest.raises(errors.ProposalHashMismatch):
            h.decide(approval, proposal_hash=proposal(2))
        assert_refused_cleanly(h)
        assert approval.state is ApprovalState.PENDING and approval.version == 1
        assert h.run.state is RunState.WAITING_FOR_APPROVAL

    @pytest.mark.parametrize(
        ("roles", "reason"),
        [
            ({Role.REVIEWER}, None),
            ({Role.WORKSPACE_ADMIN}, "mine"),
            ({Role.PLATFORM_ADMIN}, "break glass"),
            ({Role.PLATFORM_ADMIN, Role.REVIEWER}, "break glass"),
            ({Role.REQUESTER}, None),
        ],
    )
    @pytest.mark.parametrize("decision", list(Decision))
    def test_the_requester_can_never_decide(self, roles, reason, decision):
        h, _, _, approval = approval_harness()
        with pytest.raises(errors.SeparationOfDuties):
            h.decide(approval, REQUESTER, decision, roles=roles, reason=reason)
        assert_refused_cleanly(h)
        assert approval.state is ApprovalState.PENDING
        assert h.agg.decisions.get(approval.approval_id, []) == []

    @pytest.mark.parametrize("roles", [set(), {Role.OBSERVER}, {Role.REQUESTER}, {Role.OPERATOR}])
    def test_only_approver_roles_decide(self, roles):
        h, _, _, approval = approval_harness()
        with pytest.raises(errors.Forbidden) as info:
            h.decide(approval, "sam", roles=roles, reason="because")
        assert type(info.value) is errors.Forbidden
        assert_refused_cleanly(h)

    def test_wrong_tenant_sees_not_found(self):
        h, _, _, approval = approval_harness()
        with pytest.raises(errors.ApprovalNotFound):
            h.decide(approval, tenant="tenant-b")
        assert_refused_cleanly(h)

    def test_unknown_approval(self):
        h, _, _, _ = approval_harness()
        with pytest.raises(errors.ApprovalNotFound):
            h.agg.decide_approval(
                h.ctx(),
                UUID(int=31337),
                Principal("rita", TENANT, "project-a", frozenset({Role.REVIEWER})),
                Decision.APPROVE,
                1,
                proposal(1),
                None,
                h.policy,
                h.options,
            )

    def test_version_mismatch(self):
        h, _, _, approval = approval_harness()
        with pytest.raises(errors.ApprovalVersionMismatch) as info:
            h.decide(approval, version=approval.version + 1)
        assert info.value.details == {"current_version": 1}
        assert_refused_cleanly(h)
        with pytest.raises(errors.ApprovalVersionMismatch):
            h.decide(approval, version=0)

    @pytest.mark.parametrize("first", [Decision.APPROVE, Decision.REJECT])
    def test_a_second_decision_is_a_conflict(self, first):
        h, _, _, approval = approval_harness()
        h.decide(approval, "rita", first, reason="first")
        state = approval.state
        with pytest.raises(errors.ApprovalAlreadyDecided):
            h.decide(approval, "sam", Decision.APPROVE)
        assert_refused_cleanly(h)
        with pytest.raises(errors.ApprovalAlreadyDecided):
            h.decide(approval, "rita", Decision.REJECT)
        assert approval.state is state

    def test_expired_request_is_gone_even_before_the_reconciler_runs(self):
        h, _, _, approval = approval_harness()
        h.now = approval.expires_at - timedelta(seconds=1)
        assert not h.expire_approval(approval)
        h.now = approval.expires_at
        with pytest.raises(errors.ApprovalGone, match="expired"):
            h.decide(approval)
        assert_refused_cleanly(h)

    def test_expiry_reconciler_fails_the_run(self):
        h, attempt, grant, approval = approval_harness()
        h.now = approval.expires_at
        assert h.expire_approval(approval)
        assert approval.state is ApprovalState.EXPIRED
        assert approval.reason == "expired without a decision"
        assert h.run.state is RunState.FAILED
        assert h.run.failure_class is FailureClass.CANCELLATION
        assert attempt.state is AttemptState.CANCELLED
        assert attempt.attempt_id not in h.agg.leases
        assert h.step(0).state is StepState.CANCELLED
        assert h.events[-1].event_type == "RunFailed"
        assert not h.expire_approval(approval)
        with pytest.raises(errors.ApprovalGone):
            h.decide(approval)
        with pytest.raises(errors.StaleFencingToken):
            h.report(grant)

    def test_quorum_of_two(self):
        policy = PolicyDocument(policy_id="p", revision="9", required_approvals=2)
        h, attempt, grant, approval = approval_harness(policy=policy)
        assert approval.required_approvals == 2
        h.decide(approval, "rita")
        assert approval.state is ApprovalState.PENDING
        assert approval.version == 2
        assert h.run.state is RunState.WAITING_FOR_APPROVAL
        assert h.batches[-1].approvals == {approval.approval_id: approval}
        assert h.batches[-1].events == []
        # The same approver cannot count twice.
        with pytest.raises(errors.ApprovalAlreadyDecided):
            h.decide(approval, "rita")
        # A concurrent second vote against the old version loses.
        with pytest.raises(errors.ApprovalVersionMismatch):
            h.decide(approval, "sam", version=1)
        h.decide(approval, "sam", roles={Role.WORKSPACE_ADMIN})
        assert approval.state is ApprovalState.APPROVED
        assert approval.decided_by == "sam"
        assert [v.decided_by for v in h.agg.decisions[approval.approval_id]] == ["rita", "sam"]
        assert h.run.state is RunState.RUNNING
        h.report(h.lease(attempt))
        assert h.run.state is RunState.COMPLETED

    def test_one_reject_settles_a_quorum_request(self):
        policy = PolicyDocument(policy_id="p", revision="9", required_approvals=2)
        h, _, _, approval = approval_harness(policy=policy)
        h.decide(approval, "rita")
        h.decide(approval, "sam", Decision.REJECT, reason="no")
        assert approval.state is ApprovalState.REJECTED
        assert h.run.state is RunState.FAILED

    @pytest.mark.parametrize("reason", [None, "", "   "])
    def test_break_glass_needs_a_reason(self, reason):
        h, _, _, approval = approval_harness()
        with pytest.raises(errors.BreakGlassReasonRequired):
            h.decide(approval, "root", roles={Role.PLATFORM_ADMIN}, reason=reason)
        assert_refused_cleanly(h)
        assert approval.state is ApprovalState.PENDING

    def test_break_glass_by_platform_admin_is_audited_and_overrides_quorum(self):
        policy = PolicyDocument(policy_id="p", revision="9", required_approvals=2)
        h, _, _, approval = approval_harness(policy=policy)
        h.decide(approval, "root", roles={Role.PLATFORM_ADMIN}, reason="prod is down")
        assert approval.state is ApprovalState.APPROVED
        assert approval.decided_by == "root" and approval.reason == "prod is down"
        assert h.run.state is RunState.RUNNING
        batch = h.batches[-1]
        (vote,) = batch.decisions
        assert vote.break_glass
        (audit,) = batch.audits
        assert audit.kind == "break-glass-decision"
        assert audit.actor == "root" and audit.tenant_id == TENANT
        assert audit.detail == {
            "approval_id": str(approval.approval_id),
            "decision": "approve",
            "reason": "prod is down",
        }

    def test_break_glass_reject_is_audited_too(self):
        h, _, _, approval = approval_harness()
        h.decide(approval, "root", Decision.REJECT, roles={Role.PLATFORM_ADMIN}, reason="unsafe")
        assert [a.kind for a in h.batches[-1].audits] == ["break-glass-decision"]
        assert h.run.state is RunState.FAILED

    def test_an_approver_role_is_not_break_glass(self):
        h, _, _, approval = approval_harness()
        h.decide(approval, "wanda", roles={Role.WORKSPACE_ADMIN, Role.PLATFORM_ADMIN})
        assert h.batches[-1].audits == []
        assert not h.batches[-1].decisions[0].break_glass

    def test_reject_fails_the_run_policy_denied(self):
        h, attempt, grant, approval = approval_harness()
        h.decide(approval, "rita", Decision.REJECT, reason="too risky")
        assert approval.state is ApprovalState.REJECTED and approval.reason == "too risky"
        assert h.run.state is RunState.FAILED
        assert h.run.failure_class is FailureClass.POLICY_DENIED
        assert "too risky" in h.run.failure_reason
        assert attempt.state is AttemptState.CANCELLED
        assert attempt.settled_by == "run-control"
        assert attempt.attempt_id not in h.agg.leases
        assert h.step(0).state is StepState.CANCELLED
        types = [e.event_type for e in h.batches[-1].events]
        assert types[:2] == ["ApprovalDecided", "RunStateChanged"]
        assert types[-1] == "RunFailed"
        assert h.events[-1].payload["failureClass"] == "policy-denied"
        with pytest.raises(errors.StaleFencingToken):
            h.report(grant)

    def test_request_changes_makes_it_stale_and_resumes_running(self):
        h, attempt, grant, approval = approval_harness()
        h.advance(7200)
        h.decide(approval, "rita", Decision.REQUEST_CHANGES, reason="rename the branch")
        assert approval.state is ApprovalState.STALE
        assert approval.reason == "rename the branch"
        assert h.run.state is RunState.RUNNING
        changed = h.batches[-1].events[-2]
        assert changed.event_type == "RunStateChanged"
        assert changed.payload["cause"] == "ChangesRequested"
        # The attempt is claimable again; its next holder regenerates the proposal.
        assert attempt.state is AttemptState.DISPATCHED
        with pytest.raises(errors.ApprovalGone):
            h.decide(approval, "sam")
        assert_refused_cleanly(h)
        grant = h.lease(attempt, "worker-2")
        assert grant.approved_proposal_hash is None  # changes were requested, nothing approved
        new = h.request_approval(grant, proposal(2))
        assert new.state is ApprovalState.PENDING
        assert h.run.state is RunState.WAITING_FOR_APPROVAL
        h.decide(new, "sam")
        h.report(h.lease(attempt, "worker-3"))
        assert h.run.state is RunState.COMPLETED


# ============================================================================ cancellation


class TestCancel:
    @pytest.mark.parametrize("reason", ["", "   "])
    def test_needs_a_reason(self, reason):
        h = Harness()
        with pytest.raises(errors.ValidationFailed):
            h.agg.cancel(h.ctx(), REQUESTER, reason)
        assert h.agg.take_changes().empty

    def test_accepted_is_cancelled_directly(self):
        h = Harness([READ_STEP, WRITE_STEP])
        assert h.cancel(REQUESTER, "changed my mind")
        assert h.run.state is RunState.CANCELLED
        assert all(s.state is StepState.CANCELLED for s in h.agg.steps)
        batch = h.batches[-1]
        (intent,) = batch.intents
        assert (intent.requested_by, intent.reason) == (REQUESTER, "changed my mind")
        assert [e.event_type for e in batch.events] == [
            "CancellationRequested",
            "RunStateChanged",
            "RunCancelled",
        ]
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
        assert [e.event_type for e in h.batches[-1].events] == [
            "CancellationRequested",
            "RunStateChanged",
        ]
        assert not h.cancel()  # intent already recorded
        assert h.batches[-1].empty
        # The holder learns about the cancellation when it renews.
        renewed = h.agg.renew_lease(h.ctx(), attempt.attempt_id, "worker-1", 1, h.options)
        h.commit()
        assert renewed.cancel_requested
        # No new lease for anyone while cancelling.
        with pytest.raises(errors.LeaseHeld):
            h.agg.acquire_lease(h.ctx(), attempt.attempt_id, "worker-2", h.options)
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
        assert [e.event_type for e in h.batches[-1].events] == [
            "AttemptOutcomeRecorded",
            "RunStateChanged",
            "RunCancelled",
        ]

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
        assert_refused_cleanly(h)
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


# ============================================================================ sequences


def _assert_gap_free(h: Harness) -> None:
    assert [e.seq for e in h.events] == list(range(1, len(h.events) + 1))
    assert [j.sequence for j in h.journal] == list(range(1, len(h.journal) + 1))
    assert h.run.event_seq == len(h.events)
    assert h.run.journal_seq == len(h.journal)


def _assert_journal_legal(h: Harness) -> None:
    tables = {
        "Run": RUN_TRANSITIONS,
        "Step": STEP_TRANSITIONS,
        "Attempt": ATTEMPT_TRANSITIONS,
        "ApprovalRequest": APPROVAL_TRANSITIONS,
    }
    for entry in h.journal:
        if entry.from_state is not None:
            assert (entry.from_state, entry.to_state) in tables[entry.entity], entry


class TestSequences:
    def test_event_and_journal_sequences_are_gap_free_through_a_busy_run(self):
        h = Harness([READ_STEP, WRITE_STEP, LOCAL_STEP])
        attempt, grant = h.start(0)
        # Refused commands in between consume no sequence numbers.
        with pytest.raises(errors.StaleFencingToken):
            h.report(grant, token=7)
        h.agg.take_audits()
        h.advance(LEASE + GRACE + 1)
        assert h.expire_lease(attempt)
        h.now = h.step(0).not_before
        _, grant = h.start(0)
        h.report(grant)
        gated, grant = h.start(1)
        first = h.request_approval(grant, proposal(1))
        h.decide(first, "rita", Decision.REQUEST_CHANGES)
        with pytest.raises(errors.ApprovalGone):
            h.decide(first)
        grant = h.lease(gated, "worker-2")
        second = h.request_approval(grant, proposal(2))
        h.decide(second)
        grant = h.lease(gated, "worker-3")
        h.report(grant)
        _, grant = h.start(2)
        h.cancel()
        h.report(grant, AttemptOutcome.SUCCEEDED)
        assert h.run.state is RunState.CANCELLED
        _assert_gap_free(h)
        _assert_journal_legal(h)
        assert all(e.run_id == RUN_ID and e.tenant_id == TENANT for e in h.events)
        assert all(e.topic == TOPICS[e.event_type] for e in h.events)
        assert all(e.correlation_id == str(RUN_ID) for e in h.events)
        assert len({e.event_id for e in h.events}) == len(h.events)

    def test_each_batch_continues_where_the_last_one_ended(self):
        h = Harness([READ_STEP, LOCAL_STEP])
        _, grant = h.start(0)
        h.report(grant)
        _, grant = h.start(1)
        h.report(grant)
        last = 0
        for batch in h.batches:
            if batch.events:
                assert batch.events[0].seq == last + 1
                last = batch.events[-1].seq
        assert last == len(h.events)

    def test_version_increments_once_per_non_empty_batch(self):
        h = Harness([READ_STEP])
        versions = [h.run.version]
        attempt, grant = h.start(0)
        for batch in h.batches[1:]:
            assert batch.expected_version == versions[-1]
            versions.append(versions[-1] + 1)
        assert h.run.version == versions[-1]
        h.agg.acquire_lease(h.ctx(), attempt.attempt_id, "worker-1", h.options)  # no-op
        assert h.commit().empty and h.run.version == versions[-1]
        h.report(grant)
        assert h.batches[-1].expected_version == versions[-1]
        assert h.run.version == versions[-1] + 1

    def test_journal_records_actor_time_and_cause(self):
        h = Harness()
        h.advance(60)
        attempt, grant = h.start(0)
        lease_entries = [j for j in h.batches[-1].journal if j.entity == "Attempt"]
        assert [(j.cause, j.actor, j.occurred_at) for j in lease_entries] == [
            ("LeaseGranted", "worker-1", h.now)
        ]
        assert lease_entries[0].entity_id == attempt.attempt_id
        h.report(grant)
        causes = [(j.entity, j.cause) for j in h.batches[-1].journal]
        assert causes == [
            ("Attempt", "OutcomeReported"),
            ("Step", "AttemptSucceeded"),
            ("Run", "LastStepSucceeded"),
        ]


# ============================================================================ reminders


class TestNextDue:
    def test_terminal_runs_need_nothing(self):
        h = Harness()
        h.cancel()
        assert h.agg.next_due(h.options) is None

    def test_a_leased_attempt_is_due_after_expiry_and_grace(self):
        h = Harness()
        _, grant = h.start(0)
        due = h.agg.next_due(h.options)
        assert due == grant.expires_at + timedelta(seconds=GRACE)
        assert h.agg.expire_lease(h.ctx(at=due), grant.attempt_id, h.options) is False
        later = due + timedelta(microseconds=1)
        assert h.agg.expire_lease(h.ctx(at=later), grant.attempt_id, h.options) is True

    def test_a_backoff_is_due_at_not_before(self):
        h = Harness()
        _, grant = h.start(0)
        h.report(grant, AttemptOutcome.FAILED)
        assert h.agg.next_due(h.options) == h.step(0).not_before

    def test_waiting_for_approval_is_due_at_approval_expiry_not_lease_expiry(self):
        h, _, _, approval = approval_harness()
        assert h.agg.next_due(h.options) == approval.expires_at


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
