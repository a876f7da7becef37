"""The gRPC worker surface over a real channel to Ray Serve's gRPC ingress (loopback)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import grpc
import pytest
from api_harness import Api, TenantView, new_tenant
from grpc_harness import WORKER_SUB, GrpcTenant, GrpcWorker

from runcontrol.api.auth import RUNS_READ
from runcontrol.domain import canonical_hash
from schemas import runcontrol_pb2 as pb


def test_claim_renew_report_and_resend(g: GrpcTenant) -> None:
    g.view.publish()
    run_id = g.view.submit()
    worker = g.worker("inst-1")

    lease = worker.claimed([g.view.agent], run_id)
    assert lease.tenant_id == g.tenant
    assert lease.holder == f"{WORKER_SUB}/inst-1"  # the token's subject + the instance id
    assert lease.fencing_token > 0 and lease.lease_id and not lease.cancel_requested
    assert lease.agent_id == g.view.agent and lease.attempt_number == 1
    assert json.loads(lease.input_json) == g.view.body()["input"]
    assert lease.expires_at.ToDatetime(tzinfo=UTC) > datetime.now(UTC)

    renewed = worker.renew(lease)
    assert (renewed.lease_id, renewed.fencing_token) == (lease.lease_id, lease.fencing_token)
    assert renewed.expires_at.ToDatetime() >= lease.expires_at.ToDatetime()

    request = worker.report_request(lease)
    attempt = worker.report(request)
    assert attempt.state == "Succeeded" and attempt.settled_by == lease.holder
    assert attempt.outcome_hash == request.outcome_hash
    assert g.view.wait_state(run_id, "Completed")["state"] == "Completed"

    # A resend of the same command id answers the first answer, with no second effect.
    assert worker.report(request) == attempt
    events = [e["type"] for e in g.view.history(run_id)]
    assert events.count("AttemptOutcomeRecorded") == 1


def test_claim_next_answers_not_granted_when_nothing_is_dispatched(g: GrpcTenant) -> None:
    response = g.worker().claim(["no-such-agent"], wait_s=0.3)
    assert not response.granted and not response.HasField("lease")
    assert isinstance(response, pb.AcquireLeaseResponse)


def _audits(g: GrpcTenant, run_id: str) -> list[str]:
    from sqlalchemy import select

    from runcontrol.store.tables import audit_log

    with g.view.runtime.container.db.tenant(g.tenant) as conn:
        rows = conn.execute(
            select(audit_log.c.kind)
            .where(audit_log.c.run_id == UUID(run_id))
            .order_by(audit_log.c.id)
        )
        return [r.kind for r in rows]


def test_each_refusal_has_its_status_code_and_typed_detail(g: GrpcTenant) -> None:
    g.view.publish()
    run_id = g.view.submit()
    worker = g.worker("inst-1")
    lease = worker.claimed([g.view.agent], run_id)
    S = grpc.StatusCode

    # No token, a token that does not verify: UNAUTHENTICATED.
    for token in (None, "not-a-jwt"):
        refusal = GrpcWorker(g.stub, token).refused("AcquireLease", worker.named(lease))
        assert (refusal.status, refusal.reason) == (S.UNAUTHENTICATED, "unauthorized")
    # A verified token without the role Worker, or without factory.runtime: PERMISSION_DENIED.
    requester = GrpcWorker(g.stub, g.view.token())
    refusal = requester.refused("AcquireLease", worker.named(lease))
    assert (refusal.status, refusal.reason) == (S.PERMISSION_DENIED, "forbidden")
    scopeless = GrpcWorker(g.stub, g.worker_token(scopes=[RUNS_READ]))
    refusal = scopeless.refused("ReportAttemptOutcome", worker.report_request(lease))
    assert (refusal.status, refusal.reason) == (S.PERMISSION_DENIED, "insufficient-scope")

    # A made-up fencing token or lease id, or another instance of the same account:
    # FAILED_PRECONDITION with the typed reason, and audited.
    refusal = worker.refused(
        "ReportAttemptOutcome", worker.report_request(lease, fencing_token=lease.fencing_token + 7)
    )
    assert (refusal.status, refusal.reason) == (S.FAILED_PRECONDITION, "stale-fencing-token")
    assert refusal.info is not None and refusal.info.metadata["retryable"] == "false"
    assert refusal.info.metadata["attempt_id"] == lease.attempt_id
    refusal = worker.refused("AcquireLease", worker.named(lease, lease_id=str(uuid.uuid4())))
    assert (refusal.status, refusal.reason) == (S.FAILED_PRECONDITION, "stale-fencing-token")
    other = g.worker("inst-2")
    refusal = other.refused("ReportAttemptOutcome", other.report_request(lease))
    assert (refusal.status, refusal.reason) == (S.FAILED_PRECONDITION, "lease-not-held")
    refusal = other.refused("AcquireLease", other.named(lease, fencing_token=0, lease_id=""))
    assert (refusal.status, refusal.reason) == (S.FAILED_PRECONDITION, "lease-held")
    assert _audits(g, run_id) == ["stale-fencing-token", "lease-rejected", "lease-not-held"]

    # Unknown ids: NOT_FOUND; a malformed one: INVALID_ARGUMENT.
    refusal = worker.refused("AcquireLease", worker.named(lease, run_id=str(uuid.uuid4())))
    assert (refusal.status, refusal.reason) == (S.NOT_FOUND, "run-not-found")
    refusal = worker.refused("AcquireLease", worker.named(lease, attempt_id=str(uuid.uuid4())))
    assert (refusal.status, refusal.reason) == (S.NOT_FOUND, "attempt-not-found")
    refusal = worker.refused("AcquireLease", worker.named(lease, run_id="nope"))
    assert (refusal.status, refusal.reason) == (S.INVALID_ARGUMENT, "validation-failed")
    bad = g.worker("bad/instance")  # an instance id may not hold "/": the holder is sub/inst
    refusal = bad.refused("AcquireLease", bad.named(lease))
    assert (refusal.status, refusal.reason) == (S.INVALID_ARGUMENT, "validation-failed")

    # The outcome, then a second, different one: ALREADY_EXISTS.
    first = worker.report(worker.report_request(lease))
    assert first.state == "Succeeded"
    refusal = worker.refused(
        "ReportAttemptOutcome", worker.report_request(lease, outcome=pb.FAILED, outcome_hash="")
    )
    assert (refusal.status, refusal.reason) == (S.ALREADY_EXISTS, "outcome-already-recorded")

    # The run has ended: renewing, re-acquiring or asking for approval is FAILED_PRECONDITION.
    g.view.wait_state(run_id, "Completed")
    refusal = worker.refused("AcquireLease", worker.named(lease))
    assert (refusal.status, refusal.reason) == (S.FAILED_PRECONDITION, "stale-fencing-token")
    refusal = worker.refused("AcquireLease", worker.named(lease, fencing_token=0, lease_id=""))
    assert (refusal.status, refusal.reason) == (S.FAILED_PRECONDITION, "lease-rejected")
    refusal = worker.refused(
        "RequestApproval", worker.approval_request(lease, canonical_hash({"p": 1}))
    )
    assert (refusal.status, refusal.reason) == (S.FAILED_PRECONDITION, "stale-fencing-token")


def test_a_worker_sees_only_its_own_tenants_attempts(
    g: GrpcTenant, api: Api, channel: grpc.Channel, ray_runtime: Any
) -> None:
    other_view = TenantView(api, ray_runtime, new_tenant())
    try:
        other_view.agent = g.view.agent  # the same agent id in both tenants
        other_view.publish()
        theirs = other_view.submit()
        other = GrpcTenant(other_view, api, channel)
        ours, intruder = other.worker(), g.worker()
        S = grpc.StatusCode

        # Tenant A's worker claims nothing although B's attempt of that agent waits.
        assert not intruder.claim([g.view.agent], wait_s=1.0).granted
        lease = ours.claimed([g.view.agent], theirs)
        assert lease.tenant_id == other.tenant

        # Naming B's run or attempt from A: NOT_FOUND, as an unknown run.
        for method, request in (
            ("AcquireLease", intruder.named(lease)),
            ("AcquireLease", intruder.named(lease, fencing_token=0, lease_id="")),
            ("ReportAttemptOutcome", intruder.report_request(lease)),
            ("RequestApproval", intruder.approval_request(lease, canonical_hash({"p": 1}))),
        ):
            refusal = intruder.refused(method, request)
            assert (refusal.status, refusal.reason) == (S.NOT_FOUND, "run-not-found"), method
        with pytest.raises(grpc.RpcError) as stream:
            list(intruder.watch(theirs))
        assert stream.value.code() == S.NOT_FOUND

        # B's own worker finishes the run; A's refusals changed nothing.
        assert ours.report(ours.report_request(lease)).state == "Succeeded"
        assert other_view.wait_state(theirs, "Completed")["state"] == "Completed"
    finally:
        other_view.close()


def test_progress_and_tool_calls_over_grpc(g: GrpcTenant) -> None:
    """Ordered progress (a gap is DATA_LOSS with the ack) and an at-most-once tool call, as a
    worker in another language calls them; the progress reaches WatchRun as events."""
    g.view.publish()
    run_id = g.view.submit()
    worker = g.worker("inst-1")
    lease = worker.claimed([g.view.agent], run_id)
    S = grpc.StatusCode
    fenced = {
        "run_id": lease.run_id,
        "attempt_id": lease.attempt_id,
        "lease_id": lease.lease_id,
        "fencing_token": lease.fencing_token,
        "worker_instance_id": worker.instance,
    }

    def progress(*seqs: int) -> pb.ReportProgressRequest:
        return pb.ReportProgressRequest(
            **fenced,
            command_id=str(uuid.uuid4()),
            messages=[
                pb.ProgressMessage(seq=s, text=f"m{s}", payload_json=json.dumps({"s": s}))
                for s in seqs
            ],
        )

    ack = worker._call("ReportProgress", progress(1, 2))
    assert (ack.acked_seq, ack.stored, ack.duplicates) == (2, 2, 0)
    refusal = worker.refused("ReportProgress", progress(2, 3, 5))
    assert (refusal.status, refusal.reason) == (S.DATA_LOSS, "progress-gap")
    assert refusal.info is not None and refusal.info.metadata["acked_seq"] == "3"
    made_up = pb.ReportProgressRequest(**{**fenced, "fencing_token": lease.fencing_token + 9})
    made_up.messages.add(seq=4)
    refusal = worker.refused("ReportProgress", made_up)
    assert (refusal.status, refusal.reason) == (S.FAILED_PRECONDITION, "stale-fencing-token")

    def claim() -> pb.ToolCallResponse:
        request = pb.ClaimToolCallRequest(
            **fenced, call_id="pr-1", request_hash=canonical_hash({"pr": 1})
        )
        return worker._call("ClaimToolCall", request)  # type: ignore[no-any-return]

    assert claim().status == "proceed"
    assert claim().status == "in-progress"
    done = worker._call(
        "CompleteToolCall",
        pb.CompleteToolCallRequest(**fenced, call_id="pr-1", result_hash=canonical_hash(7)),
    )
    assert (done.status, done.result_hash) == ("completed", canonical_hash(7))
    assert (claim().status, claim().result_hash) == ("completed", canonical_hash(7))

    with_result = pb.ClaimToolCallRequest(**fenced, call_id="pr-2", request_hash=canonical_hash(2))
    assert worker._call("ClaimToolCall", with_result).status == "proceed"
    worker._call(
        "CompleteToolCall",
        pb.CompleteToolCallRequest(
            **fenced, call_id="pr-2", result_hash=canonical_hash({"pr": 2}), result_json='{"pr":2}'
        ),
    )
    repeat = worker._call("ClaimToolCall", with_result)  # the stored result comes back
    assert (repeat.status, repeat.result_json) == ("completed", '{"pr":2}')

    worker.report(worker.report_request(lease))
    events = list(worker.watch(run_id))
    progressed = [json.loads(e.payload_json) for e in events if e.type == "ProgressReported"]
    assert [(p["seq"], p["text"], p["payload"]) for p in progressed] == [
        (n, f"m{n}", {"s": n}) for n in (1, 2, 3)
    ]
    types = [e.type for e in events]
    assert types.count("ToolCallClaimed") == types.count("ToolCallCompleted") == 2


def test_journaled_calls_over_grpc(g: GrpcTenant) -> None:
    """RecordCall as a worker in another language calls it: the first value is stored, a
    second record of the key is answered the stored value, a stale token is refused."""
    g.view.publish()
    run_id = g.view.submit()
    worker = g.worker("inst-1")
    lease = worker.claimed([g.view.agent], run_id)
    fenced = {
        "run_id": lease.run_id,
        "attempt_id": lease.attempt_id,
        "lease_id": lease.lease_id,
        "fencing_token": lease.fencing_token,
        "worker_instance_id": worker.instance,
    }

    def record(value: str, **overrides: Any) -> pb.RecordCallRequest:
        return pb.RecordCallRequest(
            **{**fenced, **overrides}, name="plan", occurrence=1, value_json=value
        )

    first = worker._call("RecordCall", record('{"plan":"A"}'))
    assert first.recorded and first.value_json == ""
    assert first.value_hash == canonical_hash({"plan": "A"}) and first.bytes == 12
    second = worker._call("RecordCall", record('{"plan":"B"}'))
    assert not second.recorded and second.value_json == '{"plan":"A"}'
    refusal = worker.refused("RecordCall", record("1", fencing_token=lease.fencing_token + 9))
    assert (refusal.status, refusal.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "stale-fencing-token",
    )
    view = g.view.requester().get(f"/factory/runs/{run_id}").json()
    (call,) = view["steps"][0]["calls"]
    assert (call["name"], call["occurrence"], call["valueHash"]) == ("plan", 1, first.value_hash)


def test_a_claim_resent_with_its_command_id_gets_the_same_lease(g: GrpcTenant) -> None:
    """``command_id`` with ``claim_next`` is the claim id: a resend after a lost answer gets
    the lease the first send was granted (not a second attempt, not nothing), to the same
    worker instance only."""
    g.view.publish()
    run_id = g.view.submit()
    worker = g.worker("inst-1")

    def claim(instance: str) -> pb.AcquireLeaseRequest:
        return pb.AcquireLeaseRequest(
            worker_instance_id=instance,
            claim_next=pb.ClaimNext(agent_ids=[g.view.agent], wait_seconds=15.0),
            command_id=claim_id,
        )

    claim_id = str(uuid.uuid4())
    first = worker._call("AcquireLease", claim("inst-1"))
    assert first.granted and first.lease.run_id == run_id
    again = worker._call("AcquireLease", claim("inst-1"))
    assert again.granted
    assert (again.lease.lease_id, again.lease.fencing_token) == (
        first.lease.lease_id,
        first.lease.fencing_token,
    )
    assert json.loads(again.lease.input_json) == g.view.body()["input"]
    refusal = g.worker("inst-2").refused("AcquireLease", claim("inst-2"))
    assert (refusal.status, refusal.reason) == (
        grpc.StatusCode.ALREADY_EXISTS,
        "idempotency-conflict",
    )
