"""Publication proves a definition can run (issue 34): each input the hostile-client session
found accepted and then failing every submission (or failing publication with a 500) is a 422
problem at publication, and nothing is stored."""

from __future__ import annotations

import json
from typing import Any

import pytest
from api_harness import TenantView, assert_problem

from runcontrol.domain import Role

BIG = [2**31, 2**32, 2**64, 10**20, 123456789012345678901]


def admin(t: TenantView) -> Any:
    return t.user("wanda", Role.WORKSPACE_ADMIN)


def step(t: TenantView, **fields: Any) -> dict[str, Any]:
    return {"name": "only", "agentId": t.agent, **fields}


def releases(t: TenantView) -> list[str]:
    return [w["workflowId"] for w in t.requester().get("/factory/workflows").json()["items"]]


def refused_release(t: TenantView, definition: dict[str, Any]) -> dict[str, Any]:
    response = admin(t).post("/factory/releases", json={"definition": definition})
    problem = assert_problem(response, 422, "validation-failed")
    assert releases(t) == []
    return problem


@pytest.mark.parametrize("max_attempts", BIG)
def test_max_attempts_beyond_the_integer_column_is_refused(t: TenantView, max_attempts: int):
    problem = refused_release(
        t, {"workflowId": t.workflow, "steps": [step(t, maxAttempts=max_attempts)]}
    )
    assert problem["field"] == "steps[0].maxAttempts"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"agentId": "a" * 100_000}, "steps[0].agentId"),
        ({"agentId": {"x": 1}}, "steps[0].agentId"),
        ({"skillId": {"x": 1}}, "steps[0].skillId"),
        ({"name": 123}, "steps[0].name"),
        ({"name": {"x": 1}}, "steps[0].name"),
        ({"name": "tab\there"}, "steps[0].name"),
        ({"kind": "signal", "signal": "a/b"}, "steps[0].signal"),
    ],
)
def test_a_step_field_the_store_cannot_hold_is_refused(
    t: TenantView, fields: dict[str, Any], field: str
):
    problem = refused_release(t, {"workflowId": t.workflow, "steps": [step(t, **fields)]})
    assert problem["field"] == field


@pytest.mark.parametrize(
    "workflow_id",
    [
        "w" * 17_000,
        "w" * 15_000,
        "w" * 184,
        "../../etc/passwd",
        "..",
        "\t\n",
        "\u202eevil",
        "acc-\ufeff-956",
        " " * 100_000,
        123,
    ],
)
def test_a_workflow_id_beyond_its_limits_is_refused(t: TenantView, workflow_id: Any):
    problem = refused_release(t, {"workflowId": workflow_id, "steps": [step(t)]})
    assert problem["field"] == "workflowId"


def test_the_longest_workflow_id_publishes_and_runs_by_release_id(t: TenantView):
    t.workflow = "w" * 183
    published = admin(t).post(
        "/factory/releases", json={"definition": {"workflowId": t.workflow, "steps": [step(t)]}}
    )
    assert published.status_code == 201, published.text
    release_id = published.json()["releaseId"]
    response = t.requester().post(
        "/factory/runs",
        json=t.body(releaseAlias=None, releaseId=release_id),
        headers={"Idempotency-Key": "longest"},
    )
    assert response.status_code == 202, response.text


@pytest.mark.parametrize("alias", ["a/b", "..", "x" * 201, "\u202e"])
def test_an_alias_beyond_its_limits_is_refused(t: TenantView, alias: str):
    definition = {"workflowId": t.workflow, "steps": [step(t)]}
    response = admin(t).post(
        "/factory/releases", json={"definition": definition, "aliases": [alias]}
    )
    assert_problem(response, 422)
    assert releases(t) == []


@pytest.mark.parametrize(
    "rate_limits",
    [
        {"tenant": {"perSecond": 1e-300}},
        {"agents": {"planner": {"perSecond": 1e-300}}},
        {"named": {"tokens": {"perSecond": 1e-300}}},
        {"tenant": {"perSecond": 1, "burst": 1.5}},
        {"tenant": {"perSecond": 1e-6, "burst": 1000}},
        {"tenant": {"perSecond": 10**400}},
        {"agents": {"a\u202eb": {"perSecond": 1}}},
    ],
)
def test_a_rate_whose_interval_cannot_fit_is_refused(t: TenantView, rate_limits: Any):
    before = t.requester().get("/factory/policies/current")
    response = admin(t).post(
        "/factory/policies",
        content=json.dumps({"rateLimits": rate_limits}),  # 10**400 as its digits
        headers={"Content-Type": "application/json"},
    )
    assert_problem(response, 422, "validation-failed")
    after = t.requester().get("/factory/policies/current")
    assert after.json() == before.json()


@pytest.mark.parametrize(
    "document", [{"requiredApprovals": "2"}, {"requiredApprovals": 2.0}, {"maxReRequests": True}]
)
def test_a_policy_count_is_never_converted(t: TenantView, document: dict[str, Any]):
    response = admin(t).post("/factory/policies", json=document)
    assert_problem(response, 422)
