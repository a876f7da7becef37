"""Child runs, conditions and the results of steps no worker executes over real HTTP, on the
real hosts (issue 32): a parent gets its child's result and both show the lineage; a
cancel of the parent ends both Cancelled; a false condition skips a step, a true one runs it,
and a join after a skipped branch runs; publication refuses a bad ``when`` (with its
position) and a bad run step; the new surfaces pass the bad-input and other-tenant probes."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from api_harness import TenantView, assert_problem, new_tenant

from runcontrol.commands import ReportOutcome
from runcontrol.domain import AttemptOutcome, Role, canonical_hash


def publish(t: TenantView, workflow_id: str, *steps: dict[str, Any]) -> None:
    definition = {
        "workflowId": workflow_id,
        "steps": [dict({"agentId": t.agent}, **s) for s in steps],
    }
    admin = t.user("wanda", Role.WORKSPACE_ADMIN)
    response = admin.post("/factory/releases", json={"definition": definition})
    assert response.status_code == 201, response.text


def signal(t: TenantView, run_id: str, name: str, body: Any) -> None:
    sent = t.requester().post(
        f"/factory/runs/{run_id}/signals/{name}",
        json=body,
        headers={"Idempotency-Key": f"sig-{uuid.uuid4().hex}"},
    )
    assert sent.status_code == 202, sent.text


def child_of(t: TenantView, run_id: str, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        children = t.run(run_id)["children"]
        if children:
            return str(children[0]["runId"])
        assert time.monotonic() < deadline, "the parent's child run never appeared"
        time.sleep(0.1)


def submit(t: TenantView, workflow_id: str, **input: Any) -> str:
    response = t.requester().post(
        "/factory/runs",
        json=t.body(workflowId=workflow_id, input=input or {"repo": "x"}),
        headers={"Idempotency-Key": f"key-{uuid.uuid4().hex}"},
    )
    assert response.status_code == 202, response.text
    return str(response.json()["runId"])


def succeed_with(t: TenantView, run_id: str, result: Any) -> None:
    claim = t.claim(run_id)
    t._call(
        t.runtime.client.send(
            ReportOutcome(
                **claim.fenced(),
                outcome=AttemptOutcome.SUCCEEDED,
                outcome_hash=canonical_hash(result),
                result=result,
            )
        )
    )


def test_a_parent_gets_its_childs_result_and_both_show_the_lineage(t: TenantView) -> None:
    child_wf, parent_wf = f"{t.workflow}-child", f"{t.workflow}-parent"
    publish(t, child_wf, {"name": "work"})
    publish(
        t,
        parent_wf,
        {"name": "plan", "kind": "signal"},
        {
            "name": "delegate",
            "kind": "run",
            "workflowId": child_wf,
            "releaseAlias": "latest",
            "input": {"topic": "results.plan.topic"},
            "dependsOn": ["plan"],
        },
    )
    parent = submit(t, parent_wf)
    signal(t, parent, "plan", {"topic": "tests"})
    child = child_of(t, parent)
    succeed_with(t, child, {"answer": 42})
    done = t.wait_state(parent, "Completed", "Failed")
    assert done["state"] == "Completed", done
    assert done["result"] == {"answer": 42}
    plan, delegate = done["steps"]
    assert plan["result"] == {"topic": "tests"}  # a signal's body is its step's result
    assert delegate["kind"] == "run" and delegate["result"] == {"answer": 42}
    assert delegate["child"] == {"runId": child, "number": 1}
    (listed_child,) = done["children"]
    assert listed_child["runId"] == child and listed_child["workflowId"] == child_wf
    assert listed_child["state"] == "Completed" and listed_child["parentStepId"]
    seen = t.run(child)
    assert seen["parentRunId"] == parent and seen["depth"] == 1
    assert seen["parentStepId"] == delegate["stepId"]
    assert seen["input"] == {"topic": "tests"}
    page = t.requester().get(f"/factory/runs?parentRunId={parent}").json()
    assert [r["runId"] for r in page["items"]] == [child]
    types = [e["type"] for e in t.history(parent)]
    assert types.count("ChildRunStarted") == 1 and types.count("ChildRunEnded") == 1
    accepted = next(e for e in t.history(child) if e["type"] == "RunAccepted")
    assert accepted["payload"]["parentRunId"] == parent


def test_cancelling_the_parent_ends_both_cancelled(t: TenantView) -> None:
    child_wf, parent_wf = f"{t.workflow}-child", f"{t.workflow}-parent"
    publish(t, child_wf, {"name": "go", "kind": "signal"})
    publish(t, parent_wf, {"name": "delegate", "kind": "run", "workflowId": child_wf})
    parent = submit(t, parent_wf)
    child = child_of(t, parent)
    t.wait_state(child, "Running")
    cancelled = t.requester().post(f"/factory/runs/{parent}/cancel", json={"reason": "enough"})
    assert cancelled.status_code == 202, cancelled.text
    assert t.wait_state(child, "Cancelled", "Completed", "Failed")["state"] == "Cancelled"
    assert t.wait_state(parent, "Cancelled", "Completed", "Failed")["state"] == "Cancelled"


@pytest.mark.parametrize(("broken", "fix"), [(False, "Skipped"), (True, "Succeeded")])
def test_a_condition_skips_or_runs_a_step_and_the_join_runs(
    t: TenantView, broken: bool, fix: str
) -> None:
    publish(
        t,
        t.workflow,
        {"name": "check", "kind": "signal"},
        {"name": "fix", "dependsOn": ["check"], "when": "results.check.broken == true"},
        {"name": "report", "kind": "wait", "seconds": 0, "dependsOn": ["check", "fix"]},
    )
    run_id = submit(t, t.workflow)
    signal(t, run_id, "check", {"broken": broken})
    if broken:
        succeed_with(t, run_id, {"fixed": True})
    view = t.wait_state(run_id, "Completed", "Failed")
    assert view["state"] == "Completed", view
    states = {s["name"]: s["state"] for s in view["steps"]}
    assert states == {"check": "Succeeded", "fix": fix, "report": "Succeeded"}
    assert view["steps"][1]["condition"] == "results.check.broken == true"
    assert set(view["result"]) == {"firedAt", "endedAt"}  # a wait's result: when it ended
    types = [e["type"] for e in t.history(run_id)]
    assert types.count("StepSkipped") == (0 if broken else 1)


@pytest.mark.parametrize(
    ("step", "detail"),
    [
        ({"name": "a", "when": "input.x =="}, {"position": 10}),
        ({"name": "a", "when": "secrets.key"}, {"position": 0}),
        ({"name": "a", "when": "results.ghost.ok"}, {"step": "a", "unknown": "ghost"}),
        ({"name": "a", "kind": "run"}, {}),
        ({"name": "a", "kind": "run", "workflowId": "w", "input": {"x": "input."}}, {}),
        ({"name": "a", "kind": "run", "workflowId": "w", "input": ["x"]}, {}),
    ],
)
def test_a_bad_condition_or_run_step_is_a_422_and_nothing_is_published(
    t: TenantView, step: dict[str, Any], detail: dict[str, Any]
) -> None:
    definition = {"workflowId": t.workflow, "steps": [dict({"agentId": t.agent}, **step)]}
    response = t.user("wanda", Role.WORKSPACE_ADMIN).post(
        "/factory/releases", json={"definition": definition}
    )
    problem = assert_problem(response, 422, "validation-failed")
    for key, value in detail.items():
        assert problem[key] == value, problem
    assert_problem(t.requester().get(f"/factory/workflows/{t.workflow}"), 404)


def test_too_many_run_steps_are_refused(t: TenantView) -> None:
    steps = [{"name": f"r{i}", "kind": "run", "workflowId": "w"} for i in range(21)]
    response = t.user("wanda", Role.WORKSPACE_ADMIN).post(
        "/factory/releases", json={"definition": {"workflowId": t.workflow, "steps": steps}}
    )
    problem = assert_problem(response, 422, "validation-failed")
    assert "at most 20 run steps" in problem["detail"]


def test_the_lineage_surfaces_refuse_bad_input_and_other_tenants(t: TenantView) -> None:
    child_wf, parent_wf = f"{t.workflow}-child", f"{t.workflow}-parent"
    publish(t, child_wf, {"name": "go", "kind": "signal"})
    publish(t, parent_wf, {"name": "delegate", "kind": "run", "workflowId": child_wf})
    parent = submit(t, parent_wf)
    child = child_of(t, parent)
    bad = t.requester().get("/factory/runs?parentRunId=not-a-uuid")
    assert_problem(bad, 422, "request-invalid")
    with t.api.client(t.api.token(new_tenant())) as stranger:
        assert_problem(stranger.get(f"/factory/runs/{child}"), 404, "run-not-found")
        assert_problem(stranger.get(f"/factory/runs/{parent}"), 404, "run-not-found")
        assert stranger.get(f"/factory/runs?parentRunId={parent}").json()["items"] == []
    cancelled = t.requester().post(f"/factory/runs/{parent}/cancel", json={"reason": "done"})
    assert cancelled.status_code == 202
    t.wait_state(parent, "Cancelled")
