"""Run templates over real HTTP (issue 44): created Proposed by A, decided Active by B (never
by A), bound to its version and content hash; an edit is a new version needing its own
decision; revoked at once; another tenant's is 404; a bad schema or expression is 422 with
nothing stored."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from api_harness import TenantView, assert_problem, new_tenant
from sqlalchemy import select

from runcontrol import cli
from runcontrol.commands import RequestApproval
from runcontrol.domain import Role, SideEffectClass, canonical_hash
from runcontrol.store.tables import audit_log

AUTHOR, APPROVER = "ann", "bob"


def body(template_id: str = "nightly", **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "templateId": template_id,
        "workflowId": "deps-bump",
        "defaultInput": {"branch": "main"},
        "inputSchema": {"type": "object", "properties": {"branch": {"type": "string"}}},
        "preApprovals": [
            {
                "actionClass": "shared-write",
                "proposalWhen": "proposal.files <= 3",
                "expiresAt": (datetime.now(UTC) + timedelta(days=7)).isoformat(),
                "maxUses": 5,
                "approverRole": "Reviewer",
            }
        ],
    }
    doc.update(changes)
    return doc


def created(t: TenantView, template_id: str = "nightly") -> dict[str, Any]:
    response = t.user(AUTHOR, Role.REQUESTER).post("/factory/templates", json=body(template_id))
    assert response.status_code == 201, response.text
    assert response.headers["Location"] == f"/factory/templates/{template_id}"
    return dict(response.json())


def decide(t: TenantView, view: dict[str, Any], subject: str = APPROVER, **kw: Any) -> Any:
    decision = {
        "decision": "approve",
        "version": view["version"],
        "contentHash": view["contentHash"],
        **kw,
    }
    path = f"/factory/templates/{view['templateId']}/decision"
    return t.user(subject, Role.REVIEWER).post(path, json=decision)


def test_a_template_is_proposed_then_decided_by_another_reviewer(t: TenantView) -> None:
    view = created(t)
    assert (view["state"], view["version"], view["uses"]) == ("Proposed", 1, 0)
    assert view["createdBy"] == AUTHOR
    assert view["preApprovals"][0]["proposalWhen"] == "proposal.files <= 3"
    assert_problem(decide(t, view, AUTHOR), 403, "separation-of-duties")
    assert_problem(decide(t, view, version=2), 409, "approval-version-mismatch")
    assert_problem(decide(t, view, contentHash="sha256:" + "0" * 64), 409)
    approved = decide(t, view)
    assert approved.status_code == 200, approved.text
    assert (approved.json()["state"], approved.json()["decidedBy"]) == ("Active", APPROVER)
    assert_problem(decide(t, view, "rob"), 409, "approval-already-decided")
    shown = t.reviewer().get("/factory/templates/nightly").json()
    assert shown["state"] == "Active"
    listed = t.reviewer().get("/factory/templates").json()["items"]
    assert [(i["templateId"], i["version"]) for i in listed] == [("nightly", 1)]


def test_an_edit_is_a_new_version_needing_a_new_decision(t: TenantView) -> None:
    view = created(t)
    assert decide(t, view).status_code == 200
    edited = t.user(AUTHOR, Role.REQUESTER).put(
        "/factory/templates/nightly", json=body(releaseAlias="stable")
    )
    assert edited.status_code == 200, edited.text
    new = edited.json()
    assert (new["version"], new["state"], new["releaseAlias"]) == (2, "Proposed", "stable")
    assert new["contentHash"] != view["contentHash"]
    first = t.reviewer().get("/factory/templates/nightly", params={"version": 1}).json()
    assert first["state"] == "Superseded"
    assert decide(t, new).json()["state"] == "Active"


def test_revoking_is_immediate(t: TenantView) -> None:
    view = created(t)
    decide(t, view)
    revoked = t.reviewer().post("/factory/templates/nightly/revocation", json={"reason": "no"})
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["state"] == "Revoked"
    again = t.reviewer().post("/factory/templates/nightly/revocation", json={})
    assert_problem(again, 409, "illegal-transition")
    assert_problem(t.requester().post("/factory/templates/nightly/revocation", json={}), 403)


def test_another_tenants_template_is_not_found(t: TenantView) -> None:
    view = created(t)
    other = TenantView(t.api, t.runtime, new_tenant())
    try:
        assert_problem(other.reviewer().get("/factory/templates/nightly"), 404)
        assert_problem(decide(other, view), 404, "template-not-found")
        assert other.reviewer().get("/factory/templates").json()["items"] == []
    finally:
        other.close()


def test_an_existing_id_is_a_conflict(t: TenantView) -> None:
    created(t)
    again = t.user(AUTHOR, Role.REQUESTER).post("/factory/templates", json=body())
    assert_problem(again, 409)


@pytest.mark.parametrize(
    ("changes", "detail"),
    [
        ({"inputSchema": {"$ref": "#/elsewhere"}}, "$ref"),
        ({"inputSchema": {"type": "thing"}}, "inputSchema.type"),
        ({"preApprovals": [{"actionClass": "shared-write", "maxUses": 1}]}, "expiresAt"),
        (
            {
                "preApprovals": [
                    {
                        "actionClass": "shared-write",
                        "expiresAt": "2999-01-01T00:00:00+00:00",
                        "maxUses": 1,
                        "proposalWhen": "proposal.files <=",
                    }
                ]
            },
            "proposalWhen",
        ),
    ],
)
def test_a_bad_schema_or_expression_is_422_and_nothing_is_stored(
    t: TenantView, changes: dict[str, Any], detail: str
) -> None:
    response = t.user(AUTHOR, Role.REQUESTER).post("/factory/templates", json=body(**changes))
    problem = assert_problem(response, 422)
    assert detail in problem["detail"], problem
    assert_problem(t.reviewer().get("/factory/templates/nightly"), 404)


# ---------------------------------------------------------------------- runs from templates


def active_for(t: TenantView, **changes: Any) -> dict[str, Any]:
    """A template of the tenant's shared-write workflow, created by A, approved by B."""
    t.publish(side_effect=SideEffectClass.SHARED_WRITE)
    doc = body(workflowId=t.workflow, defaultInput={"branch": "main", "dryRun": False}, **changes)
    view = t.user(AUTHOR, Role.REQUESTER).post("/factory/templates", json=doc).json()
    assert decide(t, view).status_code == 200
    return dict(view)


def from_template(t: TenantView, subject: str, **given: Any) -> Any:
    run = t.body(templateId="nightly", input=given, limits={})
    key = {"Idempotency-Key": f"key-{uuid.uuid4().hex}"}
    return t.user(subject, Role.REQUESTER).post("/factory/runs", json=run, headers=key)


def asks(t: TenantView, run_id: str, proposal: dict[str, Any]) -> Any:
    claim = t.claim(run_id)
    command = RequestApproval(
        **claim.fenced(), proposal_hash=canonical_hash(proposal), proposal=proposal
    )
    return t._call(t.runtime.client.send(command))


def test_a_run_from_the_template_passes_a_fitting_shared_write_without_a_human(
    t: TenantView,
) -> None:
    active_for(t)
    submitted = from_template(t, "cid", branch="release-2")
    assert submitted.status_code == 202, submitted.text
    run_id = submitted.json()["runId"]
    run = t.run(run_id)
    assert run["input"] == {"branch": "release-2", "dryRun": False}
    assert (run["templateId"], run["templateVersion"]) == ("nightly", 1)
    approval = asks(t, run_id, {"files": 2})
    assert approval.decided_by == "template:nightly@1"
    view = t.wait_state(run_id, "Running")
    assert view["pendingApprovals"] == []
    listed = t.reviewer().get("/factory/approvals", params={"runId": run_id}).json()["items"]
    assert [(a["state"], a["decidedBy"]) for a in listed] == [("Approved", "template:nightly@1")]
    assert "ApprovalDecided" in [e["type"] for e in t.history(run_id)]
    assert t.reviewer().get("/factory/templates/nightly").json()["uses"] == 1


def test_a_proposal_outside_and_the_authors_own_run_wait_for_a_human(t: TenantView) -> None:
    active_for(t)
    outside = from_template(t, "cid").json()["runId"]
    assert asks(t, outside, {"files": 9}).state == "Pending"
    own = from_template(t, AUTHOR).json()["runId"]
    assert asks(t, own, {"files": 1}).state == "Pending"


def test_the_input_is_checked_against_the_templates_constraint(t: TenantView) -> None:
    active_for(t)
    refused = from_template(t, "cid", branch=7)
    problem = assert_problem(refused, 422)
    assert "input.branch: type" in problem["detail"], problem
    proposed = t.user(AUTHOR, Role.REQUESTER).post(
        "/factory/templates", json=body("draft", workflowId=t.workflow)
    )
    assert proposed.status_code == 201
    draft = t.body(templateId="draft", input={})
    response = t.requester().post(
        "/factory/runs", json=draft, headers={"Idempotency-Key": "draft-1"}
    )
    assert_problem(response, 409)


def test_the_cli_proposes_decides_and_revokes(t: TenantView, tmp_path: Path, capsys) -> None:
    file = tmp_path / "template.json"
    file.write_text(json.dumps(body()), encoding="utf-8")

    def as_user(subject: str, role: str, *words: str) -> int:
        url = ["--url", t.api.base_url, "--token", t.token(subject, role)]
        return cli.main(["templates", *words, *url])

    assert as_user(AUTHOR, Role.REQUESTER, "create", str(file)) == 0
    assert "Proposed" in capsys.readouterr().out
    assert as_user(AUTHOR, Role.REVIEWER, "decide", "approve", "nightly") != 0  # its author
    assert as_user(APPROVER, Role.REVIEWER, "decide", "approve", "nightly") == 0
    assert "nightly@1 Active" in capsys.readouterr().out
    assert as_user(APPROVER, Role.REVIEWER, "revoke", "nightly", "--reason", "done") == 0
    assert "nightly@1 Revoked" in capsys.readouterr().out
    assert as_user(APPROVER, Role.REVIEWER, "list") == 0
    assert "Revoked" in capsys.readouterr().out


def test_every_change_is_audited_and_break_glass_says_so(t: TenantView) -> None:
    view = created(t)
    admin = t.user("pat", Role.PLATFORM_ADMIN)
    path = "/factory/templates/nightly/decision"
    decision = {"decision": "approve", "version": 1, "contentHash": view["contentHash"]}
    assert_problem(admin.post(path, json=decision), 422, "break-glass-reason-required")
    decided = admin.post(path, json={**decision, "reason": "incident 7"})
    assert decided.json()["breakGlass"] is True, decided.text
    with t.runtime.container.db.tenant(t.tenant) as conn:
        rows = conn.execute(select(audit_log).order_by(audit_log.c.id)).all()
    assert [(r.kind, r.actor, r.detail["breakGlass"]) for r in rows] == [
        ("template-proposed", AUTHOR, False),
        ("template-decided", "pat", True),
    ]
