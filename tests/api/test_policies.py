"""Approval policy in full, over real HTTP: a WorkspaceAdmin publishes revisions (quorum,
approver roles, assignees, expiry and its action), runs are pinned to the revision current at
submission, reviewers see it, and the approvals of one run are listed under the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from api_harness import PROJECT, REVIEWER, TenantView, assert_problem, decision

from runcontrol import cli
from runcontrol.domain import Role

POLICY = {
    "approvalRequiredFor": ["shared-write"],
    "approverRoles": ["Reviewer"],
    "requiredApprovals": 2,
    "assignees": ["ann", "bob"],
    "expiryHours": 4,
    "expiryAction": "re-request",
    "maxReRequests": 1,
}


def admin(t: TenantView):
    return t.user("wanda", Role.WORKSPACE_ADMIN)


def test_a_workspace_admin_publishes_and_everyone_who_reads_approvals_sees_it(
    t: TenantView,
) -> None:
    builtin = t.reviewer().get("/factory/policies/current")
    assert builtin.status_code == 200, builtin.text
    assert builtin.json()["revision"] == "0"
    assert builtin.json()["document"]["expiryAction"] == "fail"

    first = admin(t).post("/factory/policies", json=POLICY)
    assert first.status_code == 201, first.text
    assert first.headers["Location"] == "/factory/policies/current"
    assert first.json()["revision"] == "1"
    assert first.json()["document"] == POLICY
    second = admin(t).post("/factory/policies", json={"requiredApprovals": 1})
    assert second.json()["revision"] == "2"
    # Fields left out take the built-in values.
    assert second.json()["document"]["approvalRequiredFor"] == [
        "external-irreversible",
        "shared-write",
    ]
    current = t.reviewer().get("/factory/policies/current").json()
    assert current == second.json()


@pytest.mark.parametrize("role", [Role.REQUESTER, Role.REVIEWER, Role.OPERATOR, Role.OBSERVER])
def test_only_admins_publish(t: TenantView, role: Role) -> None:
    response = t.user("someone", role).post("/factory/policies", json=POLICY)
    assert_problem(response, 403, "insufficient-scope")
    assert t.reviewer().get("/factory/policies/current").json()["revision"] == "0"


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"requiredApprovals": 0}, "requiredApprovals"),
        ({"expiryAction": "shrug"}, "shrug"),
        ({"approverRoles": ["Wizard"]}, "Wizard"),
        ({"approvalRequiredFor": ["teleport"]}, "teleport"),
        ({"assignees": ["ann"], "requiredApprovals": 2}, "quorum"),
        ({"expiryHours": -1}, "expiryHours"),
        ({"quorum": 2}, "quorum"),
    ],
)
def test_a_malformed_policy_is_refused_and_nothing_is_published(
    t: TenantView, body: dict, detail: str
) -> None:
    response = admin(t).post("/factory/policies", json=body)
    problem = assert_problem(response, 422)
    assert detail in json.dumps(problem)
    assert t.reviewer().get("/factory/policies/current").json()["revision"] == "0"


def test_quorum_and_assignees_decide_and_the_run_lists_its_approvals(t: TenantView) -> None:
    published = admin(t).post(
        "/factory/policies",
        json={"requiredApprovals": 2, "assignees": ["ann", "bob"], "approvalRequiredFor": []},
    )
    assert published.status_code == 201, published.text
    run_id, _, approval = t.waiting_for_approval()  # the step's gate asks for approval
    assert approval["requiredApprovals"] == 2
    assert approval["approverRule"].endswith(";assignees:ann,bob")
    assert t.run(run_id)["policyRevision"] == "1"

    refused = t.reviewer(REVIEWER).post(
        f"/factory/approvals/{approval['approvalId']}/decision", json=decision(approval)
    )
    assert_problem(refused, 403)
    ann = t.reviewer("ann").post(
        f"/factory/approvals/{approval['approvalId']}/decision", json=decision(approval)
    )
    assert ann.status_code == 200, ann.text
    assert ann.json()["state"] == "Pending"
    bob = t.reviewer("bob").post(
        f"/factory/approvals/{approval['approvalId']}/decision", json=decision(ann.json())
    )
    assert bob.json()["state"] == "Approved"

    listed = t.requester().get(f"/factory/runs/{run_id}/approvals")
    assert listed.status_code == 200, listed.text
    (item,) = listed.json()["items"]
    assert (item["approvalId"], item["state"]) == (approval["approvalId"], "Approved")
    filtered = t.reviewer().get("/factory/approvals", params={"runId": run_id}).json()
    assert [a["approvalId"] for a in filtered["items"]] == [approval["approvalId"]]
    single = t.reviewer().get(f"/factory/approvals/{approval['approvalId']}").json()
    assert single["decidedBy"] == "bob"

    t.succeed(t.claim(run_id))  # the decision resumed the parked attempt
    assert t.wait_state(run_id, "Completed")["state"] == "Completed"


def test_another_projects_run_has_no_approvals_to_list(t: TenantView) -> None:
    run_id, _, _ = t.waiting_for_approval()
    assert PROJECT != "proj-elsewhere"
    outsider = t.api.client(t.token("olga", Role.OBSERVER, project="proj-elsewhere"))
    with outsider:
        assert_problem(outsider.get(f"/factory/runs/{run_id}/approvals"), 404, "run-not-found")
        listed = outsider.get("/factory/approvals", params={"runId": run_id}).json()
        assert listed["items"] == []


def test_the_cli_publishes_the_same_json(
    t: TenantView, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("RUNCONTROL_DATABASE_URL", t.runtime.owner_url)
    file = tmp_path / "policy.json"
    file.write_text(json.dumps(POLICY))
    assert cli.main(["policy", str(file), "--tenant", t.tenant]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["revision"], printed["document"]) == ("1", POLICY)
    assert t.reviewer().get("/factory/policies/current").json()["document"] == POLICY

    file.write_text(json.dumps({"expiryAction": "later"}))
    assert cli.main(["policy", str(file), "--tenant", t.tenant]) == 2
    assert "later" in capsys.readouterr().err
    assert t.reviewer().get("/factory/policies/current").json()["revision"] == "1"
