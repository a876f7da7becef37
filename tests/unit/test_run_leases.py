"""RunAggregate rules, driven purely in memory with a fixed clock and deterministic ids.

Leases: a worker's fenced claim of an attempt, its renewal, and its expiry.
"""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import pytest
from domain_harness import (
    GATED_READ_STEP,
    GRACE,
    LEASE,
    LOCAL_STEP,
    NO_APPROVALS,
    READ_STEP,
    T0,
    WRITE_STEP,
    Harness,
    assert_refused_cleanly,
    proposal,
)

from runcontrol.domain import (
    AttemptOutcome,
    AttemptState,
    FailureClass,
    Options,
    RunState,
    StepState,
    errors,
)
from runcontrol.domain.run.leases import acquire_lease, renew_lease
from runcontrol.domain.run.outcomes import expire_lease, hand_back

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
        again = acquire_lease(h.agg, h.ctx(), attempt.attempt_id, "worker-1", h.options)
        assert again == grant
        assert h.agg.take_changes().empty

    def test_another_worker_cannot_take_a_held_lease(self):
        h = Harness()
        attempt, _ = h.start(0)
        with pytest.raises(errors.LeaseHeld):
            acquire_lease(h.agg, h.ctx(), attempt.attempt_id, "worker-2", h.options)
        assert_refused_cleanly(h)

    def test_a_lease_needs_a_holder(self):
        h = Harness()
        attempt = h.dispatch(0)
        with pytest.raises(errors.ValidationFailed):
            acquire_lease(h.agg, h.ctx(), attempt.attempt_id, "", h.options)

    def test_no_lease_on_a_settled_attempt(self):
        h = Harness()
        attempt, grant = h.start(0)
        h.report(grant)
        with pytest.raises(errors.LeaseRejected, match="settled"):
            acquire_lease(h.agg, h.ctx(), attempt.attempt_id, "worker-2", h.options)

    def test_unknown_attempt(self):
        h = Harness()
        with pytest.raises(errors.AttemptNotFound):
            acquire_lease(h.agg, h.ctx(), UUID(int=999_999), "worker-1", h.options)

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
        renewed = renew_lease(h.agg, h.ctx(), attempt.attempt_id, "worker-1", 1, h.options)
        assert renewed.expires_at == h.now + timedelta(seconds=LEASE)
        assert renewed.fencing_token == grant.fencing_token  # renewal is not a new lease
        batch = h.commit()
        assert grant.lease_id in batch.leases
        assert h.agg.leases[attempt.attempt_id].expires_at == renewed.expires_at

    def test_renewal_within_grace_is_allowed_and_after_grace_refused_and_audited(self):
        h = Harness()
        attempt, _ = h.start(0)
        h.advance(LEASE + GRACE)  # exactly at the deadline: still the holder's
        renew_lease(h.agg, h.ctx(), attempt.attempt_id, "worker-1", 1, h.options)
        h.commit()
        h.advance(LEASE + GRACE + 0.001)
        with pytest.raises(errors.LeaseExpired):
            renew_lease(h.agg, h.ctx("worker-1"), attempt.attempt_id, "worker-1", 1, h.options)
        (audit,) = assert_refused_cleanly(h, "lease-expired")
        assert audit.actor == "worker-1"
        assert audit.detail["attempt_id"] == str(attempt.attempt_id)

    def test_renewal_with_a_stale_token_is_refused_and_audited(self):
        h = Harness()
        attempt, _ = h.start(0)
        with pytest.raises(errors.StaleFencingToken):
            renew_lease(h.agg, h.ctx(), attempt.attempt_id, "worker-1", 0, h.options)
        (audit,) = assert_refused_cleanly(h, "stale-fencing-token")
        assert audit.detail["fencing_token"] == 0 and audit.detail["current_token"] == 1

    def test_renewal_by_a_non_holder_is_refused_and_audited(self):
        h = Harness()
        attempt, _ = h.start(0)
        with pytest.raises(errors.LeaseNotHeld):
            renew_lease(h.agg, h.ctx(), attempt.attempt_id, "worker-2", 1, h.options)
        assert_refused_cleanly(h, "lease-not-held")


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
        assert h.last_event_types() == [
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
        renew_lease(h.agg, h.ctx(), attempt.attempt_id, "worker-1", 1, h.options)
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
            renew_lease(h.agg, h.ctx(), attempt.attempt_id, "worker-1", 1, h.options)
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
        assert not expire_lease(h.agg, h.ctx(), UUID(int=424242), h.options)


# ============================================================================ hand-back


class TestHandBack:
    """``HandBackAttempt``: the holder gives its attempt back before the lease ends; it settles
    at once as an expired lease's would."""

    def hand_back(self, h: Harness, grant, reason: str = "GPU busy", **overrides):
        fields = {"holder": grant.holder, "fencing_token": grant.fencing_token, **overrides}
        attempt = hand_back(
            h.agg,
            h.ctx(fields["holder"]),
            grant.attempt_id,
            fields["holder"],
            fields["fencing_token"],
            reason,
            h.options,
            lease_id=grant.lease_id,
        )
        h.commit()
        return attempt

    def test_a_read_step_times_out_now_and_is_retried(self):
        h = Harness()
        attempt, grant = h.start(0)
        self.hand_back(h, grant)  # long before LEASE + GRACE
        assert attempt.state is AttemptState.TIMED_OUT
        assert attempt.failure_class is FailureClass.TRANSIENT
        assert attempt.settled_by == "worker-1"
        assert attempt.attempt_id not in h.agg.leases
        assert h.last_event_types() == [
            "LeaseHandedBack",
            "AttemptOutcomeRecorded",
            "StepRetryScheduled",
        ]
        assert h.batches[-1].events[0].payload == {
            "attemptId": str(attempt.attempt_id),
            "leaseId": str(grant.lease_id),
            "holder": "worker-1",
            "fencingToken": 1,
            "reason": "GPU busy",
        }
        assert h.step(0).state is StepState.PENDING
        assert h.run.state is RunState.RUNNING
        assert not h.expire_lease(attempt)  # nothing left for the reconciler

    def test_a_shared_write_step_settles_uncertain_and_is_not_retried(self):
        h = Harness([WRITE_STEP], policy=NO_APPROVALS)
        attempt, grant = h.start(0)
        self.hand_back(h, grant)
        assert attempt.state is AttemptState.UNCERTAIN  # invariant 6: the holder's word
        assert h.jitter.calls == []
        assert h.run.state is RunState.FAILED

    @pytest.mark.parametrize(
        "overrides, refusal, audit",
        [
            ({"fencing_token": 7}, errors.StaleFencingToken, "stale-fencing-token"),
            ({"holder": "worker-2"}, errors.LeaseNotHeld, "lease-not-held"),
        ],
    )
    def test_only_the_current_holder_may_hand_back_and_others_are_audited(
        self, overrides, refusal, audit
    ):
        h = Harness()
        attempt, grant = h.start(0)
        with pytest.raises(refusal):
            self.hand_back(h, grant, **overrides)
        assert attempt.state is AttemptState.LEASED
        assert [a.kind for a in h.agg.take_audits()] == [audit]

    def test_a_settled_attempt_cannot_be_handed_back(self):
        h = Harness()
        attempt, grant = h.start(0)
        self.hand_back(h, grant)
        with pytest.raises(errors.StaleFencingToken):
            self.hand_back(h, grant)
        assert attempt.state is AttemptState.TIMED_OUT

    def test_a_hand_back_names_its_reason(self):
        h = Harness()
        _, grant = h.start(0)
        with pytest.raises(errors.ValidationFailed):
            self.hand_back(h, grant, reason="  ")
        assert_refused_cleanly(h)
