"""Run templates over real HTTP (issue 44): created Proposed by A, decided Active by B (never
by A), bound to its version and content hash; an edit is a new version needing its own
decision; revoked at once; another tenant's is 404; a bad schema or expression is 422 with
nothing stored."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from api_harness import TenantView, assert_problem, new_tenant

from runcontrol.domain import Role

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
