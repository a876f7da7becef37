"""Rate limits at the edges (issue 21 item 2), over real HTTP and gRPC: a bad definition is a
422 at publish naming its field and publishes nothing; a held step shows why on GET run; a
worker outside the cluster reports a named limit's units through the SDK over gRPC, fenced,
and the next dispatch waits units / rate."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from api_harness import TenantView, assert_problem
from grpc_harness import GrpcTenant
from test_sdk_grpc import serve_over_grpc

from runcontrol.cli import main
from runcontrol.domain import Role, StepSpec, WorkflowDefinition
from runcontrol.ports.policy import DEFAULT_POLICY_ID, document_from_dict
from runcontrol.sdk import Backoff, Step, Worker


def admin(t: TenantView) -> Any:
    return t.user("wanda", Role.WORKSPACE_ADMIN)


def limit_policy(t: TenantView, rate_limits: dict[str, Any]) -> None:
    doc = document_from_dict(DEFAULT_POLICY_ID, "", {"rateLimits": rate_limits})
    t.runtime.container.policies.publish(t.tenant, doc, datetime.now(UTC))


def publish_drawing(t: TenantView, name: str, units: float = 1) -> None:
    definition = WorkflowDefinition(
        t.workflow, (StepSpec(name="only", agent_id=t.agent, rate_limits=((name, units),)),)
    )
    t.runtime.container.releases.publish(
        t.tenant, definition, "publisher", datetime.now(UTC), ("latest",)
    )


@pytest.mark.parametrize(
    ("rate_limits", "message"),
    [
        ({"tenant": {"perSecond": 0, "burst": 1}}, "rateLimits.tenant.perSecond"),
        ({"agents": {"planner": {"perSecond": 1, "burst": 0}}}, "rateLimits.agents.planner"),
        ({"named": {"tok": "fast"}}, "rateLimits.named.tok"),
        ({"global": {}}, "unknown keys global"),
    ],
)
def test_a_bad_policy_rate_limit_is_422_and_publishes_nothing(
    t: TenantView, rate_limits: dict[str, Any], message: str
) -> None:
    response = admin(t).post("/factory/policies", json={"rateLimits": rate_limits})
    problem = assert_problem(response, 422, "validation-failed")
    assert message in problem["detail"], problem
    assert t.reviewer().get("/factory/policies/current").json()["revision"] == "0"


def test_a_policy_with_rate_limits_is_published_and_read_back(t: TenantView) -> None:
    limits = {
        "tenant": {"perSecond": 5.0, "burst": 10.0},
        "named": {"tok": {"perSecond": 1e3, "burst": 1e4}},
    }
    published = admin(t).post("/factory/policies", json={"rateLimits": limits})
    assert published.status_code == 201, published.text
    assert published.json()["document"]["rateLimits"] == limits
    current = t.reviewer().get("/factory/policies/current").json()
    assert current["document"]["rateLimits"] == limits


def test_a_bad_step_rate_limit_is_422_and_publishes_nothing(t: TenantView) -> None:
    steps = [{"name": "only", "agentId": t.agent, "rateLimits": [{"name": "tok", "units": -1}]}]
    body = {"definition": {"workflowId": t.workflow, "steps": steps}}
    problem = assert_problem(admin(t).post("/factory/releases", json=body), 422)
    assert "rateLimits units must be a number above 0" in problem["detail"], problem
    assert_problem(t.requester().get(f"/factory/workflows/{t.workflow}"), 404)


def test_a_held_step_says_why_on_get_run(t: TenantView) -> None:
    limit_policy(t, {"tenant": {"perSecond": 0.01, "burst": 1}})  # one per 100 s
    t.publish()
    first, second = t.submit(), t.submit()
    assert t.run(first)["steps"][0]["state"] == "Running"
    view = t.run(second)
    assert view["state"] == "Accepted"  # held, not failed
    (step,) = view["steps"]
    assert step["state"] == "Pending" and step["attempts"] == []
    held = step["held"]
    assert (held["kind"], held["bucket"], held["attempt"]) == ("rate-limit", "tenant", 1)
    assert datetime.fromisoformat(held["until"]) == datetime.fromisoformat(step["notBefore"])
    assert t.run(first)["steps"][0]["held"] is None


def test_the_cli_says_why_a_step_is_held(
    t: TenantView,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Any,
) -> None:
    limit_policy(t, {"agents": {t.agent: {"perSecond": 0.01, "burst": 1}}})
    t.publish()
    t.submit()
    held = t.submit()
    monkeypatch.setenv("RUNCONTROL_URL", t.api.base_url)
    monkeypatch.setenv("RUNCONTROL_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.setenv("RUNCONTROL_TOKEN", t.token("alice", Role.REQUESTER))
    assert main(["runs", "show", held]) == 0
    out = capsys.readouterr().out
    until = t.run(held)["steps"][0]["held"]["until"]
    assert f"step 1:only held: rate-limit agent:{t.agent} until {until}" in out, out


def test_a_release_drawing_on_an_undefined_limit_is_422_at_submission(t: TenantView) -> None:
    publish_drawing(t, "tok")
    response = t.requester().post(
        "/factory/runs", json=t.body(), headers={"Idempotency-Key": "k-undefined"}
    )
    problem = assert_problem(response, 422, "validation-failed")
    assert "'tok'" in problem["detail"], problem


def test_a_worker_over_grpc_consumes_a_named_limit_and_the_next_dispatch_waits(
    g: GrpcTenant, grpc_port: int
) -> None:
    t = g.view
    limit_policy(t, {"named": {"tok": {"perSecond": 100, "burst": 1}}})
    publish_drawing(t, "tok")
    worker = Worker("sdk-grpc-rates", concurrency=1, wait_s=2.0, backoff=Backoff(0.05, 0.5))
    answers: list[Any] = []

    @worker.agent(t.agent)
    async def only(step: Step) -> dict[str, Any]:
        if not answers:
            answers.append(await step.consume("tok", 250))  # 2.5 s of the limit
        return {"ok": True}

    run_ids: list[str] = []

    async def scenario() -> None:
        for _ in range(2):
            run_id = await asyncio.to_thread(t.submit)
            run_ids.append(run_id)
            view = await asyncio.to_thread(
                lambda r=run_id: t.wait_state(r, "Completed", "Failed", timeout=30)
            )
            assert view["state"] == "Completed", view

    serve_over_grpc(g, grpc_port, worker, scenario)
    (answer,) = answers
    assert (answer.name, answer.bucket, answer.units) == ("tok", "named:tok", 250.0)
    history = t.requester().get(f"/factory/runs/{run_ids[0]}/events/history").json()
    (consumed,) = [e for e in history if e["type"] == "RateLimitConsumed"]
    assert consumed["payload"]["units"] == 250.0
    second = t.run(run_ids[1])
    dispatched = datetime.fromisoformat(second["steps"][0]["attempts"][0]["dispatchedAt"])
    delay = (dispatched - datetime.fromisoformat(consumed["occurredAt"])).total_seconds()
    assert 2.5 - 0.05 <= delay <= 2.5 + 2.0, delay
