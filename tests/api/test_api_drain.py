"""A draining API replica (the session's Serve app, drained through its handle as
``runcontrol up`` drains it on SIGTERM): new submissions (HTTP) and claims (gRPC) are refused
with 503 / UNAVAILABLE ``draining`` and a Retry-After, having done nothing; the work already
accepted goes on: reads, a reviewer's decision, and the lease holder's report of the attempt it
holds (refusing that would lose the attempt). Readiness says so. Called off, the same
submission (same key) is accepted.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from api_harness import TenantView, assert_problem, decision, proposal
from grpc_harness import GrpcTenant
from grpc_health.v1 import health_pb2, health_pb2_grpc

from schemas import runcontrol_pb2 as pb

APP_NAME = "runcontrol"


class Replica:
    """Calls to the session app's handle (its ``drain`` and ``resume``), made on an event loop
    of this helper's own: with Serve's throughput settings a handle belongs to the asyncio
    loop that first uses it."""

    def __init__(self) -> None:
        from ray import serve

        self.handle = serve.get_app_handle(APP_NAME)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, method: str, *args: Any) -> Any:
        async def call() -> Any:
            return await getattr(self.handle, method).remote(*args)

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout=120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


@pytest.fixture
def replica(api: Any) -> Iterator[Replica]:
    """The session's replica; its drain is called off after the test, whatever happened (the
    other tests share it)."""
    found = Replica()
    try:
        yield found
    finally:
        found.call("resume")
        found.close()


def test_a_draining_api_refuses_new_work_and_keeps_accepted_work_going(
    g: GrpcTenant, t: TenantView, channel: grpc.Channel, replica: Replica
) -> None:
    t.publish(gate="approval")
    run_id = t.submit()
    worker = g.worker()
    lease = worker.claimed([t.agent], run_id)
    asked = worker.request_approval(worker.approval_request(lease, proposal()))
    assert asked.required  # the lease is suspended while the approval is pending
    view = t.wait_state(run_id, "WaitingForApproval")
    (pending,) = view["pendingApprovals"]

    report = replica.call("drain", 0.0)  # begins; nothing of this test in flight
    assert report["idle"], report

    # New work is refused, with Retry-After, and did nothing.
    key = f"drain-{uuid.uuid4().hex}"
    refused = t.requester().post("/factory/runs", json=t.body(), headers={"Idempotency-Key": key})
    body = assert_problem(refused, 503, "draining")
    assert refused.headers["Retry-After"] == "5"  # drain.retry_after_seconds
    assert body["retryAfter"] == 5
    claim = worker.refused(
        "AcquireLease",
        pb.AcquireLeaseRequest(
            worker_instance_id="inst-2",
            claim_next=pb.ClaimNext(agent_ids=[t.agent], wait_seconds=1),
        ),
    )
    assert claim.status == grpc.StatusCode.UNAVAILABLE and claim.reason == "draining"
    assert claim.info is not None and claim.info.metadata["retryable"] == "true"
    listed = t.requester().get("/factory/runs", params={"limit": 50}).json()["items"]
    assert [r["runId"] for r in listed] == [run_id]

    # Readiness tells load balancers to send new work elsewhere.
    ready = t.api.client().get("/health/ready")
    assert_problem(ready, 503, "not-ready")
    assert ready.json()["checks"]["drain"].startswith("draining")
    health = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
    status = health.Check(health_pb2.HealthCheckRequest(), timeout=30).status
    assert status == health_pb2.HealthCheckResponse.NOT_SERVING

    # Accepted work goes on: a reader, the reviewer's decision, the holder's report.
    assert t.run(run_id)["state"] == "WaitingForApproval"
    decided = t.reviewer().post(
        f"/factory/approvals/{pending['approvalId']}/decision", json=decision(pending)
    )
    assert decided.status_code == 200, decided.text
    attempt = worker.report(worker.report_request(lease))
    assert attempt.state == "Succeeded"
    assert t.wait_state(run_id, "Completed")["state"] == "Completed"

    # Called off: the refused submission, sent again with its key, creates its run.
    replica.call("resume")
    again = t.requester().post("/factory/runs", json=t.body(), headers={"Idempotency-Key": key})
    assert again.status_code == 202, again.text
    assert t.api.client().get("/health/ready").status_code == 200
