"""Results over gRPC and HTTP (Serve's gRPC ingress, real hosts and Postgres): an SDK agent's
return value reaches the next step's function byte-identical and becomes the run's result on
``GET /factory/runs/{id}``; a resent report stores its result once; an over-cap result is
refused (INVALID_ARGUMENT result-too-large) with the attempt still open, and a reference is
taken instead; a client that sends no result works as before."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import grpc
from grpc_harness import GrpcTenant
from sqlalchemy import func, select
from test_sdk_grpc import serve_over_grpc

from runcontrol.domain import StepSpec, WorkflowDefinition, canonical_hash, canonical_json
from runcontrol.sdk import Backoff, Step, Worker
from runcontrol.store.tables import attempt_results
from schemas import runcontrol_pb2 as pb

# Numbers jsonb would rewrite, a NUL escape, non-ASCII, a big int, nesting, a list at the top.
PLAN = [{"path": "a.py", "lines": 10**20, "ratio": 1e300, "x": 0.1}, "\u0000 é ✓", None, True]


def publish_two(g: GrpcTenant) -> tuple[str, str]:
    plan, apply = f"{g.view.agent}-plan", f"{g.view.agent}-apply"
    definition = WorkflowDefinition(
        g.view.workflow, (StepSpec("plan", plan), StepSpec("apply", apply))
    )
    g.view.runtime.container.releases.publish(
        g.tenant, definition, "publisher", datetime.now(UTC), ("latest",)
    )
    return plan, apply


def stored_results(g: GrpcTenant, run_id: str) -> int:
    with g.view.runtime.container.db.tenant(g.tenant) as conn:
        return int(
            conn.execute(
                select(func.count()).where(attempt_results.c.run_id == uuid.UUID(run_id))
            ).scalar_one()
        )


def test_step_two_receives_step_ones_result_byte_identical_over_grpc(
    g: GrpcTenant, grpc_port: int
) -> None:
    plan_agent, apply_agent = publish_two(g)
    worker = Worker("results-grpc", concurrency=2, wait_s=2.0, backoff=Backoff(0.05, 0.5))
    received: list[bytes] = []
    final = {"summary": "2 files", "ok": True}

    @worker.agent(plan_agent)
    async def plan(step: Step) -> Any:
        assert step.results == {}  # the first step depends on nothing
        return PLAN

    @worker.agent(apply_agent)
    async def apply(step: Step) -> dict[str, Any]:
        received.append(canonical_json(step.results["plan"]))
        return final

    run_ids: list[str] = []

    async def scenario() -> None:
        run_ids.append(await asyncio.to_thread(g.view.submit))
        view = await asyncio.to_thread(
            lambda: g.view.wait_state(run_ids[0], "Completed", "Failed", timeout=60)
        )
        assert view["state"] == "Completed", view

    serve_over_grpc(g, grpc_port, worker, scenario)
    assert received == [canonical_json(PLAN)]
    run = g.view.run(run_ids[0])
    assert run["result"] == final and run["resultRef"] is None
    assert run["resultHash"] == canonical_hash(final)
    assert run["resultBytes"] == len(canonical_json(final))
    listed = g.view.requester().get("/factory/runs", params={"limit": 5}).json()["items"]
    (summary,) = [r for r in listed if r["runId"] == run_ids[0]]
    assert summary["resultHash"] == canonical_hash(final) and "result" not in summary
    history = g.view.requester().get(f"/factory/runs/{run_ids[0]}/events/history").json()
    (completed,) = [e for e in history if e["type"] == "RunCompleted"]
    assert completed["payload"]["resultHash"] == canonical_hash(final)
    assert stored_results(g, run_ids[0]) == 2


def test_a_resent_report_stores_its_result_once_and_an_over_cap_one_is_refused(
    g: GrpcTenant,
) -> None:
    g.view.publish()
    run_id = g.view.submit()
    worker = g.worker()
    lease = worker.claimed([g.view.agent], run_id)

    # Over the 256 KiB cap: refused, nothing stored, the attempt still open.
    big = {"blob": "x" * (256 * 1024)}
    refused = worker.refused(
        "ReportAttemptOutcome",
        worker.report_request(lease, result_json=canonical_json(big).decode(), outcome_hash=""),
    )
    assert refused.status is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.reason == "result-too-large"
    assert stored_results(g, run_id) == 0
    assert g.view.run(run_id)["steps"][0]["attempts"][0]["state"] == "Leased"

    # A sent hash that is not the result's is refused too.
    result = {"answer": 42, "unicode": "é"}
    wrong = worker.refused(
        "ReportAttemptOutcome",
        worker.report_request(
            lease, result_json=canonical_json(result).decode(), outcome_hash=canonical_hash({})
        ),
    )
    assert wrong.reason == "outcome-hash-mismatch"

    # The report, then the same report resent (same command id): one result stored.
    request = worker.report_request(
        lease, result_json=canonical_json(result).decode(), outcome_hash=""
    )
    first = worker.report(request)
    assert worker.report(request) == first
    assert first.outcome_hash == canonical_hash(result)
    assert stored_results(g, run_id) == 1
    view = g.view.wait_state(run_id, "Completed")
    assert view["result"] == result and view["resultHash"] == canonical_hash(result)


def test_a_reference_is_taken_where_the_inline_result_was_refused(g: GrpcTenant) -> None:
    g.view.publish()
    run_id = g.view.submit()
    worker = g.worker()
    lease = worker.claimed([g.view.agent], run_id)
    ref = {"uri": "file:///var/artifacts/blob.json", "sha256": "cd" * 32, "bytes": 300_000}
    attempt = worker.report(
        worker.report_request(lease, result_ref_json=canonical_json(ref).decode(), outcome_hash="")
    )
    assert attempt.outcome_hash == canonical_hash(ref)
    view = g.view.wait_state(run_id, "Completed")
    assert view["result"] is None and view["resultRef"] == ref
    assert view["resultBytes"] == 300_000


def test_a_client_that_sends_no_result_works_as_before(g: GrpcTenant) -> None:
    g.view.publish()
    run_id = g.view.submit()
    worker = g.worker()
    lease = worker.claimed([g.view.agent], run_id)
    request = worker.report_request(lease)  # its own receipt hash, no result
    assert worker.report(request).outcome_hash == request.outcome_hash
    view = g.view.wait_state(run_id, "Completed")
    assert view["result"] is None and view["resultHash"] is None
    assert stored_results(g, run_id) == 0
    assert pb.ReportAttemptOutcomeRequest.DESCRIPTOR.fields_by_name["result_json"].number == 10


def test_a_unary_claim_carries_the_dependency_results(g: GrpcTenant) -> None:
    """A worker on the unary claim path (``AcquireLease`` ``claim_next``, as a worker in any
    language writes it) gets the results of the steps the claimed one depends on, as a
    session's grant carries them; a claim resent with its claim id gets them again."""
    plan_agent, apply_agent = publish_two(g)
    run_id = g.view.submit()
    worker = g.worker()
    first = worker.claim([plan_agent])
    assert first.granted and first.lease.run_id == run_id
    assert first.results_json == ""  # the first step depends on nothing
    worker.report(
        worker.report_request(
            first.lease, result_json=canonical_json(PLAN).decode(), outcome_hash=""
        )
    )
    claim_id = f"claim-{uuid.uuid4()}"
    second = worker.claim([apply_agent], claim_id=claim_id)
    assert second.granted and second.lease.run_id == run_id
    assert second.results_json.encode() == canonical_json({"plan": PLAN})
    resent = worker.claim([apply_agent], claim_id=claim_id)  # its answer lost: resent
    assert resent.lease.lease_id == second.lease.lease_id
    assert resent.results_json == second.results_json
