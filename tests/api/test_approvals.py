"""DecideApproval and ListApprovals over HTTP, with a worker driving the run through the hosts."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from api_harness import (
    REQUESTER,
    REVIEWER,
    SECOND_REVIEWER,
    TenantView,
    assert_problem,
    decision,
    new_tenant,
    proposal,
)
from sqlalchemy import select

from runcontrol.api.auth import APPROVALS_DECIDE, APPROVALS_READ, RUNS_READ
from runcontrol.domain import Role
from runcontrol.store import Database
from runcontrol.store.tables import audit_log


def decide(
    t: TenantView,
    approval: dict[str, Any],
    body: dict[str, Any],
    who: httpx.Client | None = None,
) -> httpx.Response:
    http = who or t.reviewer()
    return http.post(f"/factory/approvals/{approval['approvalId']}/decision", json=body)


def test_approve_resumes_the_run_and_a_second_decision_is_409(t: TenantView) -> None:
    run_id, claim, approval = t.waiting_for_approval()
    assert approval["state"] == "Pending"
    assert approval["proposalHash"] == proposal(1)
    assert approval["requestedBy"] == REQUESTER

    response = decide(t, approval, decision(approval))
    assert response.status_code == 200, response.text
    decided = response.json()
    assert decided["approvalId"] == approval["approvalId"]
    assert decided["state"] == "Approved"
    assert decided["decidedBy"] == REVIEWER
    assert decided["version"] > approval["version"]
    assert t.wait_state(run_id, "Running")["pendingApprovals"] == []

    second = decide(t, approval, decision(decided), who=t.reviewer(SECOND_REVIEWER))
    assert_problem(second, 409, "approval-already-decided")

    t.succeed(t.claim(run_id))  # the approval resumed the parked attempt: claim it again
    assert t.wait_state(run_id, "Completed")["state"] == "Completed"


def test_a_decision_retried_with_its_idempotency_key_gets_its_answer(t: TenantView) -> None:
    """The same Idempotency-Key and body: the first answer again (a client retrying after a
    lost response), not 409. The same key with another decision: 409 idempotency-conflict."""
    run_id, claim, approval = t.waiting_for_approval()
    http = t.reviewer()
    url = f"/factory/approvals/{approval['approvalId']}/decision"
    key = {"Idempotency-Key": "decide-once"}
    first = http.post(url, json=decision(approval), headers=key)
    assert first.status_code == 200, first.text
    again = http.post(url, json=decision(approval), headers=key)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    changed = http.post(url, json=decision(approval, "reject", reason="no"), headers=key)
    assert_problem(changed, 409, "idempotency-conflict")
    t.succeed(t.claim(run_id))  # the approval resumed the parked attempt: claim it again
    assert t.wait_state(run_id, "Completed")["state"] == "Completed"


def test_version_mismatch_and_wrong_proposal_are_409(t: TenantView) -> None:
    run_id, _, approval = t.waiting_for_approval()
    body = decide(t, approval, decision(approval, version=approval["version"] + 7))
    assert_problem(body, 409, "approval-version-mismatch")
    wrong = decide(t, approval, decision(approval, proposalHash=proposal(99)))
    assert_problem(wrong, 409, "proposal-hash-mismatch")
    assert t.run(run_id)["state"] == "WaitingForApproval"


def test_the_requester_may_never_decide(t: TenantView) -> None:
    run_id, _, approval = t.waiting_for_approval()
    requester_reviewing = t.user(REQUESTER, Role.REQUESTER, Role.REVIEWER)
    response = decide(t, approval, decision(approval), who=requester_reviewing)
    assert_problem(response, 403, "separation-of-duties")
    assert t.run(run_id)["state"] == "WaitingForApproval"


def test_deciding_needs_an_approver_role(t: TenantView) -> None:
    # The role table gives an Observer no decide scope, even when its token claims one.
    _, _, approval = t.waiting_for_approval()
    observer = t.user("olga", Role.OBSERVER, scopes=[APPROVALS_DECIDE, APPROVALS_READ])
    assert_problem(decide(t, approval, decision(approval), who=observer), 403, "insufficient-scope")


def test_deciding_also_needs_the_policys_approver_role(t: TenantView) -> None:
    # A Reviewer holds the decide scope, but this tenant's policy names only WorkspaceAdmin.
    t.publish_policy(approver_roles=frozenset({Role.WORKSPACE_ADMIN}))
    run_id, _, approval = t.waiting_for_approval()
    assert_problem(decide(t, approval, decision(approval)), 403, "forbidden")
    admin = t.user("wanda", Role.WORKSPACE_ADMIN)
    granted = decide(t, approval, decision(approval), who=admin)
    assert granted.status_code == 200, granted.text
    assert t.wait_state(run_id, "Running", "Completed")


def test_other_tenant_and_unknown_approvals_are_404(t: TenantView) -> None:
    run_id, _, approval = t.waiting_for_approval()
    with t.api.client(t.api.token(new_tenant(), REVIEWER, [Role.REVIEWER])) as stranger:
        assert_problem(decide(t, approval, decision(approval), who=stranger), 404)
        assert stranger.get("/factory/approvals").json()["items"] == []
    unknown = dict(approval, approvalId=str(uuid.uuid4()))
    assert_problem(decide(t, unknown, decision(approval)), 404, "approval-not-found")
    assert t.run(run_id)["state"] == "WaitingForApproval"


def test_stale_requests_are_410(t: TenantView) -> None:
    # request-changes makes the request Stale: any later decision on it is gone.
    run_id, _, approval = t.waiting_for_approval()
    changes = decide(t, approval, decision(approval, "request-changes", reason="rename it"))
    assert changes.status_code == 200, changes.text
    assert changes.json()["state"] == "Stale"
    late = decide(t, approval, decision(changes.json()), who=t.reviewer(SECOND_REVIEWER))
    assert_problem(late, 410, "approval-gone")

    # The decision resumed the parked attempt; its next holder regenerates the proposal,
    # which is a new request; the stale one stays gone.
    regenerated = t.request_approval(t.claim(run_id), 2)
    fresh = t.wait_state(run_id, "WaitingForApproval")["pendingApprovals"][0]
    assert fresh["approvalId"] == str(regenerated.approval_id) != approval["approvalId"]
    assert fresh["proposalHash"] != approval["proposalHash"]
    assert_problem(decide(t, approval, decision(changes.json())), 410, "approval-gone")


def test_expired_requests_are_410(t: TenantView) -> None:
    t.publish_policy(expiry_hours=1 / 3600)  # one second
    run_id, _, approval = t.waiting_for_approval()
    # The ApprovalExpiryReconciler (real clock, in the scheduler actor) expires it and fails
    # the run; the late decision then finds the request gone.
    assert t.wait_state(run_id, "Failed")["failureClass"] == "cancellation"
    assert_problem(decide(t, approval, decision(approval)), 410, "approval-gone")


def test_reject_fails_the_run(t: TenantView) -> None:
    run_id, _, approval = t.waiting_for_approval()
    response = decide(t, approval, decision(approval, "reject", reason="unsafe"))
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "Rejected"
    failed = t.wait_state(run_id, "Failed")
    assert failed["failureClass"] == "policy-denied"


def test_break_glass_needs_a_reason_and_is_audited(t: TenantView, db: Database) -> None:
    _, _, approval = t.waiting_for_approval()
    admin = t.user("pat", Role.PLATFORM_ADMIN)
    missing = decide(t, approval, decision(approval, reason=None), who=admin)
    assert_problem(missing, 422, "break-glass-reason-required")
    blank = decide(t, approval, decision(approval, reason="   "), who=admin)
    assert_problem(blank, 422, "break-glass-reason-required")

    granted = decide(t, approval, decision(approval, reason="incident 42"), who=admin)
    assert granted.status_code == 200, granted.text
    assert granted.json()["state"] == "Approved"
    assert granted.json()["decidedBy"] == "pat"
    with db.tenant(t.tenant) as conn:
        audits = conn.execute(
            select(audit_log.c.kind, audit_log.c.actor, audit_log.c.detail).where(
                audit_log.c.kind == "break-glass-decision"
            )
        ).all()
    assert [(a.kind, a.actor, a.detail["reason"]) for a in audits] == [
        ("break-glass-decision", "pat", "incident 42")
    ]


def test_invalid_decisions_are_422(t: TenantView) -> None:
    _, _, approval = t.waiting_for_approval()
    for body in (
        decision(approval, "maybe"),
        decision(approval, version=0),
        decision(approval, version="one"),
        {"decision": "approve"},
    ):
        assert_problem(decide(t, approval, body), 422, "request-invalid")


def test_list_approvals_filters_and_pages(t: TenantView) -> None:
    first_run, _, first = t.waiting_for_approval()
    decide(t, first, decision(first)).raise_for_status()
    t.succeed(t.claim(first_run))  # the decision resumed it; finish it before the next claim
    _, _, second = t.waiting_for_approval()
    reader = t.user("olga", Role.OBSERVER, scopes=[APPROVALS_READ, RUNS_READ])

    everything = reader.get("/factory/approvals").json()
    assert [a["approvalId"] for a in everything["items"]] == [
        second["approvalId"],
        first["approvalId"],
    ]
    assert everything["asOf"]
    pending = reader.get("/factory/approvals", params={"state": "Pending"}).json()["items"]
    assert [a["approvalId"] for a in pending] == [second["approvalId"]]
    approved = reader.get("/factory/approvals", params={"state": "Approved"}).json()["items"]
    assert [(a["approvalId"], a["runId"]) for a in approved] == [(first["approvalId"], first_run)]

    page = reader.get("/factory/approvals", params={"limit": 1}).json()
    assert len(page["items"]) == 1 and page["nextCursor"]
    rest = reader.get("/factory/approvals", params={"limit": 1, "cursor": page["nextCursor"]})
    assert [a["approvalId"] for a in rest.json()["items"]] == [first["approvalId"]]
    assert rest.json()["nextCursor"] is None

    assert_problem(reader.get("/factory/approvals", params={"state": "Maybe"}), 422)
    assert_problem(reader.get("/factory/approvals", params={"cursor": "%%%"}), 400)
    decider = t.user("dana", Role.REVIEWER, scopes=[APPROVALS_DECIDE])
    assert_problem(decider.get("/factory/approvals"), 403, "insufficient-scope")


def test_a_requester_lists_only_the_approvals_of_its_own_runs(t: TenantView) -> None:
    _, _, mine = t.waiting_for_approval()
    someone_else = t.user("erin", Role.REQUESTER)
    theirs_run = t.submit(someone_else)
    claim = t.claim(theirs_run)
    t.request_approval(claim, 2)

    listed = t.requester().get("/factory/approvals").json()["items"]
    assert [a["approvalId"] for a in listed] == [mine["approvalId"]]
    by_erin = someone_else.get("/factory/approvals").json()["items"]
    assert [a["runId"] for a in by_erin] == [theirs_run]
    assert len(t.reviewer().get("/factory/approvals").json()["items"]) == 2
