"""SubmitRun, GetRun, ListRuns and CancelRun over HTTP (real Serve, Ray and Postgres)."""

from __future__ import annotations

import asyncio
import uuid

from api_harness import PROJECT, REQUESTER, Api, TenantView, assert_problem, new_tenant

from runcontrol.api.auth import RUNS_READ
from runcontrol.domain import Role

# ---------------------------------------------------------------------- SubmitRun


def test_submit_answers_202_with_location_and_what_was_pinned(t: TenantView) -> None:
    release_id = t.publish()
    http = t.requester()
    response = http.post("/factory/runs", json=t.body(), headers={"Idempotency-Key": "k-1"})
    assert response.status_code == 202, response.text
    body = response.json()
    assert set(body) == {"runId", "state", "releaseId", "policyRevision", "snapshotId"}
    assert response.headers["location"] == f"/factory/runs/{body['runId']}"
    assert body["releaseId"] == release_id
    assert body["policyRevision"] == "0"
    uuid.UUID(body["snapshotId"])

    view = t.run(body["runId"])
    assert view["tenantId"] == t.tenant
    assert view["projectId"] == PROJECT
    assert view["requestedBy"] == REQUESTER
    assert view["releaseId"] == release_id
    assert view["snapshotId"] == body["snapshotId"]
    assert view["limits"] == {"maxCostUsd": 12.0, "maxMinutes": 45}
    assert view["input"] == t.body()["input"]
    assert [s["agentId"] for s in view["steps"]] == [t.agent]


def test_submit_by_release_id(t: TenantView) -> None:
    release_id = t.publish()
    body = t.body(releaseId=release_id)
    del body["releaseAlias"]
    response = t.requester().post("/factory/runs", json=body, headers={"Idempotency-Key": "by-id"})
    assert response.status_code == 202, response.text
    assert response.json()["releaseId"] == release_id


def test_submit_without_idempotency_key_is_400(t: TenantView) -> None:
    t.publish()
    response = t.requester().post("/factory/runs", json=t.body())
    assert_problem(response, 400, "idempotency-key-required")
    response = t.requester().post("/factory/runs", json=t.body(), headers={"Idempotency-Key": ""})
    assert_problem(response, 400, "idempotency-key-required")


def test_same_key_same_payload_is_the_same_run_and_different_payload_409(t: TenantView) -> None:
    t.publish()
    http = t.requester()
    headers = {"Idempotency-Key": "same-key"}
    first = http.post("/factory/runs", json=t.body(), headers=headers)
    again = http.post("/factory/runs", json=t.body(), headers=headers)
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]

    changed = http.post("/factory/runs", json=t.body(input={"other": 1}), headers=headers)
    assert_problem(changed, 409, "idempotency-conflict")


def test_twenty_concurrent_identical_submissions_make_exactly_one_run(
    t: TenantView, api: Api
) -> None:
    t.publish()
    token = t.token(REQUESTER, Role.REQUESTER)

    async def burst() -> list[tuple[int, str, str]]:
        async with api.async_client(token) as http:

            async def one() -> tuple[int, str, str]:
                r = await http.post(
                    "/factory/runs", json=t.body(), headers={"Idempotency-Key": "burst"}
                )
                return r.status_code, r.json().get("runId", r.text), r.headers.get("location", "")

            return await asyncio.gather(*(one() for _ in range(20)))

    results = asyncio.run(burst())
    assert {status for status, _, _ in results} == {202}, results
    run_ids = {run_id for _, run_id, _ in results}
    assert len(run_ids) == 1, results
    assert {loc for _, _, loc in results} == {f"/factory/runs/{run_ids.pop()}"}

    listed = t.requester().get("/factory/runs", params={"workflowId": t.workflow}).json()
    assert len(listed["items"]) == 1


def test_unknown_workflow_alias_or_release_is_404(t: TenantView) -> None:
    http = t.requester()
    response = http.post(
        "/factory/runs", json=t.body(workflowId="nope"), headers={"Idempotency-Key": "a"}
    )
    assert_problem(response, 404, "workflow-not-found")

    t.publish()
    response = http.post(
        "/factory/runs", json=t.body(releaseAlias="no-such-alias"), headers={"Idempotency-Key": "b"}
    )
    assert_problem(response, 404, "workflow-not-found")

    body = t.body(releaseId="wf@0000")
    del body["releaseAlias"]
    response = http.post("/factory/runs", json=body, headers={"Idempotency-Key": "c"})
    assert_problem(response, 404, "release-not-found")


def test_invalid_bodies_are_422_with_field_errors(t: TenantView) -> None:
    t.publish()
    http = t.requester()
    key = {"Idempotency-Key": "invalid"}

    response = http.post("/factory/runs", json={"input": {}}, headers=key)
    body = assert_problem(response, 422, "request-invalid")
    pointers = {e["pointer"] for e in body["errors"]}
    assert {"#/workflowId", "#/modelProfileId"} <= pointers
    assert all(e["in"] == "body" and e["detail"] for e in body["errors"])

    cases = [
        t.body(limits={"maxCostUsd": -1, "maxMinutes": 45}),
        t.body(limits={"maxCostUsd": 1, "maxMinutes": 0}),
        t.body(limits={"maxMinutes": 2**40}),
        t.body(input="not an object"),
        t.body(workflowId=""),
        t.body(workflowId="wf\u0000x"),
        t.body(input={"k": "nul \u0000 inside"}),
        t.body(releaseId="x@1"),  # with releaseAlias: one or the other
    ]
    for case in cases:
        assert_problem(http.post("/factory/runs", json=case, headers=key), 422, "request-invalid")

    malformed = http.post(
        "/factory/runs",
        content=b"{not json",
        headers={**key, "Content-Type": "application/json"},
    )
    assert_problem(malformed, 422, "request-invalid")


def test_tenant_and_requester_come_only_from_the_token(t: TenantView) -> None:
    t.publish()
    other = new_tenant()
    spoofing = t.api.client(
        t.token(REQUESTER, Role.REQUESTER),
        **{"X-Tenant-Id": other, "X-Project-Id": "spoof", "X-Subject": "mallory"},
    )
    with spoofing:
        body = t.body(tenantId=other, projectId="spoof", requestedBy="mallory")
        response = spoofing.post("/factory/runs", json=body, headers={"Idempotency-Key": "s"})
        assert response.status_code == 202, response.text
        run_id = response.json()["runId"]
        view = spoofing.get(f"/factory/runs/{run_id}").json()
        listed = spoofing.get("/factory/runs").json()["items"]
    assert (view["tenantId"], view["projectId"], view["requestedBy"]) == (
        t.tenant,
        PROJECT,
        REQUESTER,
    )
    assert [r["runId"] for r in listed] == [run_id]

    # The tenant named in the headers sees nothing of it.
    with t.api.client(t.api.token(other)) as other_http:
        assert_problem(other_http.get(f"/factory/runs/{run_id}"), 404, "run-not-found")
        assert other_http.get("/factory/runs").json()["items"] == []


# ---------------------------------------------------------------------- GetRun


def test_get_unknown_or_other_tenants_run_is_404(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    assert_problem(t.requester().get(f"/factory/runs/{uuid.uuid4()}"), 404, "run-not-found")
    with t.api.client(t.api.token(new_tenant())) as stranger:
        assert_problem(stranger.get(f"/factory/runs/{run_id}"), 404, "run-not-found")
    assert_problem(t.requester().get("/factory/runs/not-a-uuid"), 422, "request-invalid")


def test_an_observer_with_read_scope_reads_runs(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    observer = t.user("olga", Role.OBSERVER, scopes=[RUNS_READ])
    assert observer.get(f"/factory/runs/{run_id}").json()["runId"] == run_id


# ---------------------------------------------------------------------- ListRuns


def test_list_runs_pages_by_cursor_with_filters_and_freshness(t: TenantView) -> None:
    t.publish()
    run_ids = [t.submit() for _ in range(3)]
    http = t.requester()

    first = http.get("/factory/runs", params={"limit": 2})
    assert first.status_code == 200, first.text
    page = first.json()
    assert set(page) == {"items", "nextCursor", "asOf"}
    assert page["asOf"]
    assert page["nextCursor"]
    second = http.get("/factory/runs", params={"limit": 2, "cursor": page["nextCursor"]}).json()
    assert second["nextCursor"] is None
    seen = [r["runId"] for r in page["items"] + second["items"]]
    assert seen == list(reversed(run_ids))  # newest first, no gap, no repeat

    running = http.get("/factory/runs", params=[("state", "Running"), ("state", "Accepted")])
    assert {r["runId"] for r in running.json()["items"]} == set(run_ids)
    none = http.get("/factory/runs", params={"state": "Completed"}).json()
    assert none["items"] == [] and none["nextCursor"] is None
    by_workflow = http.get("/factory/runs", params={"workflowId": "other-workflow"}).json()
    assert by_workflow["items"] == []


def test_list_runs_rejects_bad_parameters(t: TenantView) -> None:
    http = t.requester()
    assert_problem(http.get("/factory/runs", params={"limit": 0}), 422)
    assert_problem(http.get("/factory/runs", params={"limit": 201}), 422)
    assert_problem(http.get("/factory/runs", params={"state": "Sleeping"}), 422)
    assert_problem(http.get("/factory/runs", params={"cursor": "garbage!"}), 400, "invalid-cursor")
    assert_problem(http.get("/factory/runs", params={"cursor": "WyJ4Il0"}), 400, "invalid-cursor")


# ---------------------------------------------------------------------- CancelRun


def test_cancel_records_intent_and_answers_the_observed_state(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    http = t.requester()
    response = http.post(f"/factory/runs/{run_id}/cancel", json={"reason": "not needed"})
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["runId"] == run_id
    assert body["state"] in {"Cancelling", "Cancelled"}
    assert t.wait_state(run_id, "Cancelled")["state"] == "Cancelled"

    # Cancelling again changes nothing and says what is observed now.
    again = http.post(f"/factory/runs/{run_id}/cancel", json={"reason": "again"})
    assert again.status_code == 202
    assert again.json()["state"] == "Cancelled"


def test_cancel_errors(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    http = t.requester()
    assert_problem(
        http.post(f"/factory/runs/{uuid.uuid4()}/cancel", json={"reason": "x"}),
        404,
        "run-not-found",
    )
    assert_problem(http.post(f"/factory/runs/{run_id}/cancel", json={}), 422)
    assert_problem(http.post(f"/factory/runs/{run_id}/cancel", json={"reason": ""}), 422)
    assert_problem(
        http.post(f"/factory/runs/{run_id}/cancel", json={"reason": "   "}),
        422,
        "validation-failed",
    )
    with t.api.client(t.api.token(new_tenant())) as stranger:
        response = stranger.post(f"/factory/runs/{run_id}/cancel", json={"reason": "mine now"})
        assert_problem(response, 404, "run-not-found")
    assert t.run(run_id)["state"] in {"Running", "Accepted"}
