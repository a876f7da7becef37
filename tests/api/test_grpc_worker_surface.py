"""The gRPC worker surface over a real channel to Ray Serve's gRPC ingress (loopback)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from api_harness import Api, TenantView
from grpc_harness import WORKER_SUB, GrpcTenant, wait_serving

from schemas import runcontrol_pb2 as pb


@pytest.fixture(scope="module")
def channel(api: Api, grpc_port: int) -> Iterator[grpc.Channel]:
    target = f"127.0.0.1:{grpc_port}"
    wait_serving(target)
    with grpc.insecure_channel(target) as ch:
        yield ch


@pytest.fixture
def g(t: TenantView, api: Api, channel: grpc.Channel) -> GrpcTenant:
    return GrpcTenant(t, api, channel)


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
    events = [e["type"] for e in _history(g, run_id)]
    assert events.count("AttemptOutcomeRecorded") == 1


def _history(g: GrpcTenant, run_id: str) -> list[dict[str, Any]]:
    response = g.view.requester().get(f"/factory/runs/{run_id}/events/history?limit=500")
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()
    return events


def test_claim_next_answers_not_granted_when_nothing_is_dispatched(g: GrpcTenant) -> None:
    response = g.worker().claim(["no-such-agent"], wait_s=0.3)
    assert not response.granted and not response.HasField("lease")
    assert isinstance(response, pb.AcquireLeaseResponse)
