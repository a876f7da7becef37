"""RunAggregate rules, driven purely in memory with a fixed clock and deterministic ids.

Approvals: a human decides a proposal while its attempt is parked.
"""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import pytest
from domain_harness import (
    READ_STEP,
    REQUESTER,
    T0,
    TENANT,
    WRITE_STEP,
    Harness,
    approval_harness,
    assert_refused_cleanly,
    legacy_holder_waiting,
    proposal,
)

from runcontrol.domain import (
    ApprovalState,
    AttemptState,
    Decision,
    FailureClass,
    PolicyDocument,
    Principal,
    Role,
    RunState,
    StepState,
    errors,
)
from runcontrol.domain.run.approvals import decide_approval, request_approval

# ============================================================================ approvals


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
        assert h.last_event_types() == ["ApprovalRequested", "RunStateChanged", "AttemptParked"]
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
            request_approval(
                h.agg, h.ctx(), attempt.attempt_id, "worker-1", 0, proposal(1), h.policy, h.options
            )
        assert_refused_cleanly(h, "stale-fencing-token")
        with pytest.raises(errors.LeaseNotHeld):
            request_approval(
                h.agg, h.ctx(), attempt.attempt_id, "worker-2", 1, proposal(1), h.policy, h.options
            )
        assert_refused_cleanly(h, "lease-not-held")
        with pytest.raises(errors.ValidationFailed, match="proposalHash"):
            request_approval(
                h.agg, h.ctx(), attempt.attempt_id, "worker-1", 1, "deadbeef", h.policy, h.options
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
        assert h.last_event_types() == ["AttemptParked"]
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
        assert h.last_event_types() == ["ApprovalDecided", "ApprovalRequested", "AttemptParked"]
        assert batch.events[0].payload["state"] == "Stale"
        # A decision on the old proposal can never apply.
        with pytest.raises(errors.ApprovalGone):
            h.decide(old)
        assert_refused_cleanly(h, "approval-decision-refused")
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
        assert h.last_event_types() == ["ApprovalDecided", "RunStateChanged", "AttemptResumed"]
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
        assert_refused_cleanly(h, "approval-decision-refused")
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
        assert_refused_cleanly(h, "approval-decision-refused")
        assert approval.state is ApprovalState.PENDING
        assert h.agg.decisions.get(approval.approval_id, []) == []

    @pytest.mark.parametrize("roles", [set(), {Role.OBSERVER}, {Role.REQUESTER}, {Role.OPERATOR}])
    def test_only_approver_roles_decide(self, roles):
        h, _, _, approval = approval_harness()
        with pytest.raises(errors.Forbidden) as info:
            h.decide(approval, "sam", roles=roles, reason="because")
        assert type(info.value) is errors.Forbidden
        assert_refused_cleanly(h, "approval-decision-refused")

    def test_wrong_tenant_sees_not_found(self):
        h, _, _, approval = approval_harness()
        with pytest.raises(errors.ApprovalNotFound):
            h.decide(approval, tenant="tenant-b")
        assert_refused_cleanly(h)  # another tenant: nothing of it written here

    def test_unknown_approval(self):
        h, _, _, _ = approval_harness()
        with pytest.raises(errors.ApprovalNotFound):
            decide_approval(
                h.agg,
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
        assert_refused_cleanly(h, "approval-decision-refused")
        with pytest.raises(errors.ApprovalVersionMismatch):
            h.decide(approval, version=0)

    @pytest.mark.parametrize("first", [Decision.APPROVE, Decision.REJECT])
    def test_a_second_decision_is_a_conflict(self, first):
        h, _, _, approval = approval_harness()
        h.decide(approval, "rita", first, reason="first")
        state = approval.state
        with pytest.raises(errors.ApprovalAlreadyDecided):
            h.decide(approval, "sam", Decision.APPROVE)
        assert_refused_cleanly(h, "approval-decision-refused")
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
        assert_refused_cleanly(h, "approval-decision-refused")

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
        assert_refused_cleanly(h, "approval-decision-refused")
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
        types = h.last_event_types()
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
        assert_refused_cleanly(h, "approval-decision-refused")
        grant = h.lease(attempt, "worker-2")
        assert grant.approved_proposal_hash is None  # changes were requested, nothing approved
        new = h.request_approval(grant, proposal(2))
        assert new.state is ApprovalState.PENDING
        assert h.run.state is RunState.WAITING_FOR_APPROVAL
        h.decide(new, "sam")
        h.report(h.lease(attempt, "worker-3"))
        assert h.run.state is RunState.COMPLETED
