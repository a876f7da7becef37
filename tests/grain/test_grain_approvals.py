"""Invariant 7: a decision authorises exactly its proposalHash; a regenerated proposal makes the
pending request Stale; one valid decision (or quorum) per request, a second is a conflict;
expired or stale is gone (410); wrong tenant is not found (404); the requester may never decide
(403); break-glass by a PlatformAdmin needs a reason and is audited."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from grain_harness import REQUESTER, SHARED, Harness
from support import WORKER, decide, decide_command, proposal, race_async, request_approval

from runcontrol.commands import DecideApproval, DispatchRun, RequestApproval, WakeResult
from runcontrol.domain import (
    ApprovalState,
    AttemptState,
    Decision,
    ExpiryAction,
    FailureClass,
    PolicyDocument,
    Principal,
    Role,
    RunState,
    StepSpec,
    errors,
)
from runcontrol.store.tables import approval_decisions

APPROVE = Decision.APPROVE


def waiting(h: Harness, proposal_n: int = 1):
    """A run WaitingForApproval on its shared-write step (the built-in policy gates it)."""
    grain, grant = h.start_run(StepSpec("write", "agent-a", side_effect_class=SHARED))
    approval = request_approval(grain, grant, proposal_n)
    assert approval is not None and approval.state is ApprovalState.PENDING
    assert h.load(grain.run_id).run.state is RunState.WAITING_FOR_APPROVAL
    return grain, grant, approval


def decisions(h: Harness, run_id) -> list:
    return h.rows(approval_decisions, run_id)


def test_decision_authorises_exactly_its_proposal_hash(h: Harness):
    grain, grant, approval = waiting(h)
    with pytest.raises(errors.ProposalHashMismatch):
        decide(grain, approval, h.reviewer(), proposal_hash=proposal(2))
    with pytest.raises(errors.ApprovalVersionMismatch):
        decide(grain, approval, h.reviewer(), version=approval.version + 1)
    assert decisions(h, grain.run_id) == []
    assert h.load(grain.run_id).run.state is RunState.WAITING_FOR_APPROVAL

    decided = decide(grain, approval, h.reviewer())
    assert decided.state is ApprovalState.APPROVED
    assert [(d.decided_by, d.proposal_hash) for d in decisions(h, grain.run_id)] == [
        ("rita", proposal())
    ]
    assert h.load(grain.run_id).run.state is RunState.RUNNING
    # The approval parked the attempt: a new claim resumes it with the approved hash.
    resumed = h.lease(grain, "worker-2")
    assert resumed.fencing_token > grant.fencing_token
    assert resumed.approved_proposal_hash == proposal()
    with pytest.raises(errors.StaleFencingToken):  # the holder before the park
        h.succeed(grain, grant)
    h.succeed(grain, resumed)
    assert h.load(grain.run_id).run.state is RunState.COMPLETED


def test_a_resent_request_gets_its_answer_and_a_new_one_is_refused(h: Harness):
    """The request parked the attempt and released its lease: the same command resent (its
    answer was lost) gets the stored answer; a new request from the old holder is stale."""
    grain, grant = h.start_run(StepSpec("write", "agent-a", side_effect_class=SHARED))
    command = RequestApproval(
        tenant_id=grain.tenant_id,
        run_id=grain.run_id,
        attempt_id=grant.attempt_id,
        holder=WORKER,
        fencing_token=grant.fencing_token,
        proposal_hash=proposal(),
    )
    first = grain.execute(command)
    assert first.state is ApprovalState.PENDING
    assert grain.execute(command).approval_id == first.approval_id
    with pytest.raises(errors.StaleFencingToken):
        grain.execute(dataclasses.replace(command, command_id="another"))
    assert len(h.load(grain.run_id).approvals) == 1


def test_changes_requested_then_a_regenerated_proposal(h: Harness):
    """Request-changes makes the request Stale and resumes the attempt; its next holder
    regenerates the proposal, which opens a new request; only that one can be decided."""
    grain, grant, first = waiting(h)
    decide(
        grain,
        first,
        h.principal("sam", Role.REVIEWER),
        Decision.REQUEST_CHANGES,
        reason="smaller change please",
    )
    regrant = h.lease(grain, "worker-2")
    assert regrant.approved_proposal_hash is None
    second = request_approval(grain, regrant, 2)
    assert second.approval_id != first.approval_id
    approvals = h.load(grain.run_id).approvals
    assert approvals[first.approval_id].state is ApprovalState.STALE
    assert approvals[second.approval_id].state is ApprovalState.PENDING

    stale_version = approvals[first.approval_id].version
    with pytest.raises(errors.ApprovalGone):
        decide(grain, first, h.reviewer(), version=stale_version)
    decide(grain, second, h.reviewer(), proposal_hash=proposal(2))
    assert h.load(grain.run_id).run.state is RunState.RUNNING
    assert [(d.decided_by, d.proposal_hash) for d in decisions(h, grain.run_id)] == [
        ("sam", proposal()),
        ("rita", proposal(2)),
    ]


def test_requester_may_never_decide(h: Harness):
    grain, _, approval = waiting(h)
    for roles in (
        (Role.REVIEWER,),
        (Role.WORKSPACE_ADMIN,),
        (Role.PLATFORM_ADMIN,),
    ):
        with pytest.raises(errors.SeparationOfDuties):
            decide(grain, approval, h.principal(REQUESTER, *roles), reason="it is fine, trust me")
    assert decisions(h, grain.run_id) == []
    assert h.load(grain.run_id).approvals[approval.approval_id].state is ApprovalState.PENDING


def test_only_approver_roles_decide(h: Harness):
    grain, _, approval = waiting(h)
    for roles in ((Role.OBSERVER,), (Role.OPERATOR,), (Role.REQUESTER,)):
        with pytest.raises(errors.Forbidden):
            decide(grain, approval, h.principal("bob", *roles), version=1)
    assert decisions(h, grain.run_id) == []


def test_second_decision_is_a_conflict(h: Harness):
    grain, _, approval = waiting(h)
    decide(grain, approval, h.reviewer(), Decision.REJECT)
    current = h.load(grain.run_id).approvals[approval.approval_id]
    assert current.state is ApprovalState.REJECTED
    for who in (h.reviewer("rita"), h.reviewer("bob")):
        with pytest.raises(errors.ApprovalAlreadyDecided):
            decide(grain, approval, who, version=current.version)
    assert len(decisions(h, grain.run_id)) == 1
    assert h.load(grain.run_id).run.state is RunState.FAILED


def test_concurrent_decisions_record_exactly_one(h: Harness):
    grain, _, approval = waiting(h)
    a, b = h.grain(grain.run_id), h.grain(grain.run_id)
    for g in (a, b):
        g.execute(
            DispatchRun(tenant_id=g.tenant_id, run_id=g.run_id)
        )  # warm both activations on the same version

    results = race_async(
        a.grain.execute(
            decide_command(a, approval, h.reviewer("rita"), version=1, proposal_hash=proposal())
        ),
        b.grain.execute(
            decide_command(
                b, approval, h.reviewer("bob"), Decision.REJECT, version=1, proposal_hash=proposal()
            )
        ),
    )

    assert sorted(kind for kind, _ in results) == ["err", "ok"], results
    (loser,) = [v for kind, v in results if kind == "err"]
    assert isinstance(loser, errors.Conflict), loser
    (recorded,) = decisions(h, grain.run_id)
    state = h.load(grain.run_id).approvals[approval.approval_id].state
    assert state is (
        ApprovalState.APPROVED if recorded.decision == "approve" else ApprovalState.REJECTED
    )


def test_expired_request_is_gone_and_the_reminder_fails_the_run(h: Harness):
    grain, _, approval = waiting(h)
    h.clock.advance(72 * 3600)  # RunControl:Approvals:DefaultExpiryHours
    with pytest.raises(errors.ApprovalGone):
        decide(grain, approval, h.reviewer())
    assert h.wake(grain) == WakeResult(approvals_expired=1)
    agg = h.load(grain.run_id)
    assert agg.approvals[approval.approval_id].state is ApprovalState.EXPIRED
    assert agg.run.state is RunState.FAILED
    with pytest.raises(errors.ApprovalGone):
        decide(grain, approval, h.reviewer(), version=agg.approvals[approval.approval_id].version)
    assert decisions(h, grain.run_id) == []


def test_wrong_tenant_is_not_found(h: Harness, make_harness, tenant):
    grain, _, approval = waiting(h)
    outsider = Principal("rita", f"{tenant}-other", "proj-1", frozenset({Role.REVIEWER}))
    with pytest.raises(errors.NotFound):
        decide(grain, approval, outsider)
    other = make_harness(tenant_id=f"{tenant}-other")
    with pytest.raises(errors.NotFound):  # the run itself is invisible to the other tenant
        other.grain(grain.run_id).execute(
            DecideApproval(
                tenant_id=other.tenant,
                run_id=grain.run_id,
                approval_id=approval.approval_id,
                principal=outsider,
                decision=APPROVE,
                version=approval.version,
                proposal_hash=proposal(),
            )
        )
    assert decisions(h, grain.run_id) == []


def test_break_glass_needs_a_reason_and_is_audited(h: Harness):
    grain, _, approval = waiting(h)
    admin = h.principal("pat", Role.PLATFORM_ADMIN)
    for reason in (None, "   "):
        with pytest.raises(errors.BreakGlassReasonRequired):
            decide(grain, approval, admin, reason=reason)
    # Each refusal is audited (the trail a bulk decision's refused items leave too).
    refusals = h.audits(grain.run_id)
    assert [(a.kind, a.detail["code"]) for a in refusals] == [
        ("approval-decision-refused", "break-glass-reason-required")
    ] * 2
    assert {a.detail["decided_by"] for a in refusals} == {"pat"}

    decide(grain, approval, admin, reason="incident 42")
    (vote,) = decisions(h, grain.run_id)
    assert (vote.decided_by, vote.break_glass, vote.reason) == ("pat", True, "incident 42")
    (audit,) = [a for a in h.audits(grain.run_id) if a.kind != "approval-decision-refused"]
    assert (audit.kind, audit.actor) == ("break-glass-decision", "pat")
    assert audit.detail["reason"] == "incident 42"
    assert audit.detail["approval_id"] == str(approval.approval_id)
    assert h.load(grain.run_id).run.state is RunState.RUNNING


def test_quorum_needs_distinct_approvers(h: Harness):
    h.c.policies.publish(
        h.tenant,
        PolicyDocument("default", "", frozenset({SHARED}), required_approvals=2),
        h.clock.now(),
    )
    grain, _, approval = waiting(h)
    first = decide(grain, approval, h.reviewer("rita"), version=1)
    assert first.state is ApprovalState.PENDING and first.version == 2
    with pytest.raises(errors.ApprovalAlreadyDecided):
        decide(grain, approval, h.reviewer("rita"), version=2)
    done = decide(grain, approval, h.reviewer("bob"), version=2)
    assert done.state is ApprovalState.APPROVED
    assert len(decisions(h, grain.run_id)) == 2
    assert h.load(grain.run_id).run.state is RunState.RUNNING


def decide_current(h: Harness, grain, approval, principal: Principal):
    """An approval of ``approval`` at its current version."""
    version = h.load(grain.run_id).approvals[approval.approval_id].version
    return decide(grain, approval, principal, version=version)


def test_assignees_decide_and_reach_the_quorum(h: Harness):
    """With assignees, a reviewer who is not one is refused; two distinct assignees approve."""
    h.c.policies.publish(
        h.tenant,
        PolicyDocument(
            "default",
            "",
            frozenset({SHARED}),
            required_approvals=2,
            assignees=frozenset({"ann", "bob"}),
        ),
        h.clock.now(),
    )
    grain, _, approval = waiting(h)
    assert approval.approver_rule.endswith(";assignees:ann,bob")
    with pytest.raises(errors.Forbidden, match="assignees:ann,bob"):
        decide_current(h, grain, approval, h.reviewer("rita"))
    assert decide_current(h, grain, approval, h.reviewer("ann")).state is ApprovalState.PENDING
    with pytest.raises(errors.ApprovalAlreadyDecided):
        decide_current(h, grain, approval, h.reviewer("ann"))
    assert decide_current(h, grain, approval, h.reviewer("bob")).state is ApprovalState.APPROVED
    assert [d.decided_by for d in decisions(h, grain.run_id)] == ["ann", "bob"]
    assert h.load(grain.run_id).run.state is RunState.RUNNING


def expiring(h: Harness, action: ExpiryAction, **kw) -> tuple:
    h.c.policies.publish(
        h.tenant,
        PolicyDocument(
            "default", "", frozenset({SHARED}), expiry_hours=1, expiry_action=action, **kw
        ),
        h.clock.now(),
    )
    grain, grant, approval = waiting(h)
    h.clock.advance(3600)
    return grain, grant, approval


def test_expiry_action_fail(h: Harness):
    grain, _, approval = expiring(h, ExpiryAction.FAIL)
    assert h.wake(grain).approvals_expired == 1
    agg = h.load(grain.run_id)
    assert agg.approvals[approval.approval_id].state is ApprovalState.EXPIRED
    assert agg.run.state is RunState.FAILED
    assert {a.state for a in agg.attempts.values()} == {AttemptState.CANCELLED}
    (audit,) = h.audits(grain.run_id, "approval-expired")
    assert audit.detail["action"] == "fail"


def test_expiry_action_reject(h: Harness):
    grain, _, approval = expiring(h, ExpiryAction.REJECT)
    assert h.wake(grain).approvals_expired == 1
    agg = h.load(grain.run_id)
    expired = agg.approvals[approval.approval_id]
    assert expired.state is ApprovalState.REJECTED
    assert expired.decided_by == "approval-expiry-reconciler"
    assert agg.run.state is RunState.FAILED
    assert agg.run.failure_class is FailureClass.POLICY_DENIED


def test_expiry_action_auto_approve_resumes_the_attempt(h: Harness):
    grain, grant, approval = expiring(h, ExpiryAction.AUTO_APPROVE)
    assert h.wake(grain).approvals_expired == 1
    agg = h.load(grain.run_id)
    approved = agg.approvals[approval.approval_id]
    assert approved.state is ApprovalState.APPROVED
    assert approved.decided_by == "approval-expiry-reconciler"
    assert decisions(h, grain.run_id) == []  # nobody voted: the policy approved
    assert agg.run.state is RunState.RUNNING
    resumed = h.lease(grain, "worker-2")
    assert resumed.approved_proposal_hash == approval.proposal_hash
    h.succeed(grain, resumed)
    assert h.load(grain.run_id).run.state is RunState.COMPLETED


def test_expiry_action_re_request_asks_again_up_to_the_limit(h: Harness):
    grain, _, first = expiring(h, ExpiryAction.RE_REQUEST, max_re_requests=2)
    assert h.wake(grain).approvals_expired == 1
    agg = h.load(grain.run_id)
    assert agg.approvals[first.approval_id].state is ApprovalState.EXPIRED
    (second,) = agg.pending_approvals()
    assert second.proposal_hash == first.proposal_hash
    assert second.attempt_id == first.attempt_id
    assert second.expires_at == h.clock.now() + timedelta(hours=1)
    assert agg.run.state is RunState.WAITING_FOR_APPROVAL
    # The second request can be decided as usual; here it expires too, and so does a third.
    h.clock.advance(3600)
    h.wake(grain)
    (third,) = h.load(grain.run_id).pending_approvals()
    h.clock.advance(3600)
    h.wake(grain)
    agg = h.load(grain.run_id)
    assert agg.approvals[third.approval_id].state is ApprovalState.EXPIRED
    assert agg.pending_approvals() == []
    assert agg.run.state is RunState.FAILED  # two re-requests were the limit
    actions = [a.detail["action"] for a in h.audits(grain.run_id, "approval-expired")]
    assert actions == ["re-request", "re-request", "fail"]
