"""gRPC: approval requests, WatchRun (resumable, the same seqs as the HTTP history), the
grpc.health.v1 service and server reflection, over a real channel to Serve's gRPC ingress."""

from __future__ import annotations

import json

import grpc
from api_harness import decision
from grpc_harness import GrpcTenant
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from runcontrol.domain import canonical_hash
from schemas import runcontrol_pb2 as pb

TERMINAL = {"RunCompleted", "RunFailed", "RunCancelled"}


def test_watch_run_resumes_after_a_dropped_stream_without_gap_or_duplicate(
    g: GrpcTenant,
) -> None:
    g.view.publish(gate="approval")
    run_id = g.view.submit()
    worker, bff = g.worker(), g.reader()
    lease = worker.claimed([g.view.agent], run_id)

    # The approval request over gRPC; a resend of its command id answers the same request.
    proposal = canonical_hash({"diff": "apply"})
    request = worker.approval_request(lease, proposal)
    asked = worker.request_approval(request)
    assert asked.required and asked.approval.state == "Pending"
    assert asked.approval.proposal_hash == proposal and asked.approval.run_id == run_id
    assert worker.request_approval(request) == asked
    view = g.view.wait_state(run_id, "WaitingForApproval")
    (pending,) = view["pendingApprovals"]
    assert pending["approvalId"] == asked.approval.approval_id

    # A watcher (the BFF's read scope) reads up to the request, then its stream drops.
    seen: list[pb.RunEvent] = []
    stream = bff.watch(run_id)
    for event in stream:
        seen.append(event)
        if event.type == "ApprovalRequested":
            break
    stream.cancel()
    assert seen and seen[-1].type == "ApprovalRequested"

    # The run goes on while nobody watches.
    decided = g.view.reviewer().post(
        f"/factory/approvals/{pending['approvalId']}/decision", json=decision(pending)
    )
    assert decided.status_code == 200, decided.text
    # The request parked the attempt; the decision resumed it: claim it again (a new lease,
    # carrying the approved hash) and report.
    resumed_lease = worker.claimed([g.view.agent], run_id)
    assert resumed_lease.fencing_token > lease.fencing_token
    assert resumed_lease.approved_proposal_hash == proposal
    assert worker.report(worker.report_request(resumed_lease)).state == "Succeeded"

    # Resumed from the last seq seen (the worker's own token may watch too): the rest, once.
    resumed = list(worker.watch(run_id, after_seq=seen[-1].seq))
    assert resumed and resumed[-1].type == "RunCompleted"  # the stream ended by itself
    watched = seen + resumed
    history = g.view.history(run_id)
    assert [e.seq for e in watched] == list(range(1, len(history) + 1))
    assert [e.seq for e in watched] == [e["seq"] for e in history]
    assert [e.event_id for e in watched] == [e["eventId"] for e in history]
    assert [e.type for e in watched] == [e["type"] for e in history]
    assert [json.loads(e.payload_json) for e in watched] == [e["payload"] for e in history]
    assert all(e.run_id == run_id and e.tenant_id == g.tenant for e in watched)

    # A finished run: from its last seq the stream ends at once; from 0 it replays and ends.
    assert list(bff.watch(run_id, after_seq=watched[-1].seq)) == []
    assert [e.seq for e in bff.watch(run_id)] == [e.seq for e in watched]


def test_health_service_reports_serving(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=30).status == serving
    named = health_pb2.HealthCheckRequest(service="runcontrol.v1.RunControl")
    assert health.Check(named, timeout=30).status == serving
    try:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=30)
        raise AssertionError("an unknown service was reported")
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.NOT_FOUND
    statuses = health.List(health_pb2.HealthListRequest(), timeout=30).statuses
    assert {k: v.status for k, v in statuses.items()} == {
        "": serving,
        "runcontrol.v1.RunControl": serving,
    }
    watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=30)
    assert next(watch).status == serving
    watch.cancel()


def test_server_reflection_describes_the_services(channel: grpc.Channel) -> None:
    reflected = ProtoReflectionDescriptorDatabase(channel)
    services = set(reflected.get_services())
    assert {"runcontrol.v1.RunControl", "grpc.health.v1.Health"} <= services
    found = reflected.FindFileContainingSymbol("runcontrol.v1.RunControl")
    assert found.name == "schemas/runcontrol.proto" and found.package == "runcontrol.v1"
    (service,) = found.service
    # every method of the proto this build was generated from, in its order
    declared = pb.DESCRIPTOR.services_by_name["RunControl"].methods
    assert [m.name for m in service.method] == [m.name for m in declared]
    assert [m.name for m in service.method][:7] == [
        "AcquireLease",
        "ReportAttemptOutcome",
        "RequestApproval",
        "WatchRun",
        "ReportProgress",
        "ClaimToolCall",
        "CompleteToolCall",
    ]
    assert service.method[3].server_streaming
