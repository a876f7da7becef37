"""One edge for HTTP and gRPC (issue 29): an outside command is built once
(``runcontrol.edge.commands``), so the same bad input through either door gets the same
refusal: the same error code, and the status the edges' one table (``edge.errors.STATUS``)
gives its family on each protocol.

Real HTTP through Serve and real gRPC through the Serve gRPC ingress, as a client in another
language would call them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import grpc
from api_harness import DOORS_RATE_TENANT, PROJECT, RATE_LIMIT, Api, TenantView, new_tenant
from grpc_harness import GrpcWorker
from test_signals import publish

from runcontrol.domain import Role
from runcontrol.domain.access import RUNS_WRITE
from schemas import runcontrol_pb2 as pb

# The status family of each HTTP status the refusals below answer, over gRPC.
GRPC_FAMILY = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@dataclass(frozen=True)
class Signal:
    """One SendSignal as a caller sends it, whatever the door."""

    token: str
    run_id: str
    name: str = "go"
    body: Any = None
    key: str | None = "k-1"


def over_http(api: Api, s: Signal) -> tuple[int, str]:
    headers = {} if s.key is None else {"Idempotency-Key": s.key}
    with api.client(s.token) as http:
        response = http.post(
            f"/factory/runs/{s.run_id}/signals/{s.name}", json=s.body, headers=headers
        )
    assert response.status_code >= 400, response.text
    return response.status_code, response.json()["code"]


def grpc_request(s: Signal) -> pb.SendSignalRequest:
    return pb.SendSignalRequest(
        run_id=s.run_id, name=s.name, body_json=json.dumps(s.body), command_id=s.key or ""
    )


def over_grpc(g: Any, s: Signal) -> tuple[grpc.StatusCode, str | None]:
    refusal = GrpcWorker(g.stub, s.token).refused("SendSignal", grpc_request(s))
    return refusal.status, refusal.reason


def test_the_same_bad_signal_is_the_same_refusal_through_both_doors(t: TenantView, g: Any) -> None:
    publish(t, {"name": "plan"}, {"name": "go", "kind": "signal"})
    run_id = t.submit()
    requester = t.token()
    stranger = t.api.token(new_tenant(), "mallory", (Role.REQUESTER,))
    elsewhere = t.api.token(t.tenant, "bob", (Role.REQUESTER,), project=f"not-{PROJECT}")
    deep: Any = "bottom"
    for _ in range(40):
        deep = [deep]
    cases = {
        "a body with a NUL character": (Signal(requester, run_id, body={"a": "\x00"}), 422),
        "a body nested too deep": (Signal(requester, run_id, body=deep), 422),
        "a body over 64 KiB": (Signal(requester, run_id, body={"a": "x" * 70_000}), 422),
        "no idempotency key": (Signal(requester, run_id, key=None), 400),
        "an unknown run": (Signal(requester, str(uuid.uuid4())), 404),
        "another tenant's run": (Signal(stranger, run_id), 404),
        "another project's run": (Signal(elsewhere, run_id), 404),
        "a role that may not submit": (Signal(t.token("obs", Role.OBSERVER), run_id), 403),
        "a scope its roles do not grant": (
            Signal(t.token("obs", Role.OBSERVER, scopes=[RUNS_WRITE]), run_id),
            403,
        ),
        "a role that cancels but may not submit": (
            Signal(t.token("otto", Role.OPERATOR), run_id),
            403,
        ),
        "a worker's token": (Signal(g.worker_token(), run_id), 403),
        "a signal the run does not wait for": (
            Signal(requester, run_id, name="nope", body={"x": 1}),
            404,
        ),
        "no body (issue 34: it settled the step with null)": (Signal(requester, run_id), 422),
    }
    for case, (signal, status) in cases.items():
        http_status, http_code = over_http(t.api, signal)
        grpc_status, grpc_code = over_grpc(g, signal)
        assert http_status == status, f"{case}: HTTP {http_status} {http_code}"
        assert (grpc_status, grpc_code) == (GRPC_FAMILY[status], http_code), case
    # None of them changed the run: the same signal, well formed, is taken through either door.
    ok = Signal(requester, run_id, body={"ok": 1}, key="k-grpc")
    sent = GrpcWorker(g.stub, requester)._call("SendSignal", grpc_request(ok))
    assert (sent.name, sent.delivered) == ("go", False)
    with t.api.client(requester) as http:
        again = http.post(
            f"/factory/runs/{run_id}/signals/go", json={"ok": 1}, headers={"Idempotency-Key": "h"}
        )
    assert again.json()["code"] == "signal-already-received"  # the gRPC one was kept


def test_watching_a_run_is_refused_alike_through_both_doors(t: TenantView, g: Any) -> None:
    """WatchRun and the HTTP event history share the reader's check and visibility
    (``edge.auth.watch_scope``): a stream's refusal carries its status and message (Serve
    does not carry a raised stream's trailers), the same message the problem's detail has."""
    t.publish()
    run_id = t.submit()
    elsewhere = t.api.token(t.tenant, "bob", (Role.REQUESTER,), project=f"not-{PROJECT}")
    cases = {
        "another project's run": (elsewhere, run_id, 404),
        "another tenant's run": (t.api.token(new_tenant(), "mallory"), run_id, 404),
        "an unknown run": (t.token(), str(uuid.uuid4()), 404),
        "a token without the read scope": (t.token(scopes=[RUNS_WRITE]), run_id, 403),
    }
    for case, (token, run, status) in cases.items():
        with t.api.client(token) as http:
            problem = http.get(f"/factory/runs/{run}/events/history").json()
        assert problem["status"] == status, f"{case}: HTTP {problem}"
        try:
            next(GrpcWorker(g.stub, token).watch(run))
            raise AssertionError(f"{case}: WatchRun was not refused")
        except grpc.RpcError as exc:
            assert (exc.code(), exc.details()) == (GRPC_FAMILY[status], problem["detail"]), case
    events = GrpcWorker(g.stub, t.token()).watch(run_id)  # the project's own reader watches
    assert next(events).type == "RunAccepted"
    events.cancel()


def test_one_command_rate_for_both_doors(api: Api, g: Any) -> None:
    """The replica's tenant command rate meters outside commands through either door, from one
    bucket: what one door spends the other cannot (``edge.metering``)."""
    unknown = Signal(api.token(DOORS_RATE_TENANT, "alice"), str(uuid.uuid4()))
    for i in range(int(RATE_LIMIT["burst"])):  # each spends a token, then finds no run
        refusal = over_grpc(g, unknown) if i % 2 else over_http(api, unknown)
        assert refusal[1] == "run-not-found", refusal
    assert over_http(api, unknown) == (429, "rate-limited")
    assert over_grpc(g, unknown) == (GRPC_FAMILY[429], "rate-limited")
