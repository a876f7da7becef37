"""The gRPC test harness: a real channel on loopback to the session's Serve gRPC ingress.

Calls go through the generated stubs exactly as a worker in another language would make them
(``authorization`` metadata, proto messages); refusals are read back as gRPC status codes and
the typed ``google.rpc.ErrorInfo`` detail.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import grpc
from api_harness import Api, TenantView
from google.rpc import error_details_pb2, status_pb2

from runcontrol.api.auth import RUNS_READ, RUNTIME
from runcontrol.domain import Role, canonical_hash
from runcontrol.rpc.exchange import SERVE_APPLICATION
from runcontrol.rpc.status import DETAILS_KEY, DOMAIN
from schemas import runcontrol_pb2 as pb
from schemas import runcontrol_pb2_grpc as pb_grpc

WORKER_SUB = "svc-worker"


def wait_serving(target: str, timeout: float = 60.0) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, "the gRPC ingress did not come up"
            time.sleep(0.2)


def auth(token: str | None) -> tuple[tuple[str, str], ...]:
    # the application: Serve's gRPC proxy needs it while another test's app runs beside ours
    app = (("application", SERVE_APPLICATION),)
    return app if token is None else (*app, ("authorization", f"Bearer {token}"))


class Refused(Exception):
    def __init__(self, error: grpc.RpcError) -> None:
        super().__init__(f"{error.code()}: {error.details()}")
        self.status: grpc.StatusCode = error.code()
        self.message: str = error.details() or ""
        self.info: error_details_pb2.ErrorInfo | None = None
        for key, value in error.trailing_metadata() or ():
            if key == DETAILS_KEY:
                detail = status_pb2.Status.FromString(value)
                assert detail.code == self.status.value[0], "the detail names another status"
                info = error_details_pb2.ErrorInfo()
                assert detail.details[0].Unpack(info)
                assert info.domain == DOMAIN
                self.info = info

    @property
    def reason(self) -> str | None:
        return None if self.info is None else self.info.reason


class GrpcWorker:
    """One worker instance of a tenant, calling the RPCs with its token."""

    def __init__(self, stub: Any, token: str | None, instance: str = "inst-1") -> None:
        self.stub = stub
        self.token = token
        self.instance = instance

    def _call(self, method: str, request: Any, timeout: float = 30.0) -> Any:
        try:
            return getattr(self.stub, method)(request, metadata=auth(self.token), timeout=timeout)
        except grpc.RpcError as exc:
            raise Refused(exc) from None

    def refused(self, method: str, request: Any) -> Refused:
        try:
            self._call(method, request)
        except Refused as refusal:
            return refusal
        raise AssertionError(f"{method} was not refused")

    def claim(
        self, agents: Iterable[str], wait_s: float = 15.0, claim_id: str = ""
    ) -> pb.AcquireLeaseResponse:
        return self._call(
            "AcquireLease",
            pb.AcquireLeaseRequest(
                worker_instance_id=self.instance,
                claim_next=pb.ClaimNext(agent_ids=list(agents), wait_seconds=wait_s),
                command_id=claim_id,
            ),
            timeout=wait_s + 15,
        )

    def claimed(self, agents: Iterable[str], run_id: str) -> pb.Lease:
        response = self.claim(agents)
        assert response.granted, f"no attempt of run {run_id} became claimable"
        assert response.lease.run_id == run_id
        return response.lease

    def named(self, lease: pb.Lease, **overrides: Any) -> pb.AcquireLeaseRequest:
        fields: dict[str, Any] = {
            "run_id": lease.run_id,
            "attempt_id": lease.attempt_id,
            "fencing_token": lease.fencing_token,
            "lease_id": lease.lease_id,
        }
        fields.update(overrides)
        return pb.AcquireLeaseRequest(
            worker_instance_id=self.instance, attempt=pb.NamedAttempt(**fields)
        )

    def renew(self, lease: pb.Lease) -> pb.Lease:
        response = self._call("AcquireLease", self.named(lease))
        assert response.granted
        return response.lease

    def report_request(
        self, lease: pb.Lease, outcome: int = pb.SUCCEEDED, **overrides: Any
    ) -> pb.ReportAttemptOutcomeRequest:
        fields: dict[str, Any] = {
            "run_id": lease.run_id,
            "attempt_id": lease.attempt_id,
            "lease_id": lease.lease_id,
            "fencing_token": lease.fencing_token,
            "outcome": outcome,
            "outcome_hash": canonical_hash({"done": lease.attempt_id}),
            "command_id": str(uuid.uuid4()),
            "worker_instance_id": self.instance,
        }
        fields.update(overrides)
        return pb.ReportAttemptOutcomeRequest(**fields)

    def report(self, request: pb.ReportAttemptOutcomeRequest) -> pb.Attempt:
        return self._call("ReportAttemptOutcome", request).attempt

    def approval_request(
        self, lease: pb.Lease, proposal_hash: str, **overrides: Any
    ) -> pb.RequestApprovalRequest:
        fields: dict[str, Any] = {
            "run_id": lease.run_id,
            "attempt_id": lease.attempt_id,
            "lease_id": lease.lease_id,
            "fencing_token": lease.fencing_token,
            "proposal_hash": proposal_hash,
            "command_id": str(uuid.uuid4()),
            "worker_instance_id": self.instance,
        }
        fields.update(overrides)
        return pb.RequestApprovalRequest(**fields)

    def request_approval(self, request: pb.RequestApprovalRequest) -> pb.RequestApprovalResponse:
        return self._call("RequestApproval", request)

    def watch(self, run_id: str, after_seq: int = 0) -> Iterator[pb.RunEvent]:
        """The stream itself: iterate it, or ``.cancel()`` it to drop the connection."""
        return self.stub.WatchRun(  # type: ignore[no-any-return]
            pb.WatchRunRequest(run_id=run_id, after_seq=after_seq), metadata=auth(self.token)
        )


class GrpcTenant:
    """A tenant's HTTP view (``TenantView``) plus its workers over gRPC."""

    def __init__(self, view: TenantView, api: Api, channel: grpc.Channel) -> None:
        self.view = view
        self.api = api
        self.stub = pb_grpc.RunControlStub(channel)  # type: ignore[no-untyped-call]

    @property
    def tenant(self) -> str:
        return self.view.tenant

    def worker_token(
        self, subject: str = WORKER_SUB, roles: Iterable[str] = (Role.WORKER,), **kw: Any
    ) -> str:
        kw.setdefault("scopes", [RUNTIME])
        return self.api.token(self.tenant, subject, roles, **kw)

    def worker(self, instance: str = "inst-1", subject: str = WORKER_SUB) -> GrpcWorker:
        return GrpcWorker(self.stub, self.worker_token(subject), instance)

    def reader(self) -> GrpcWorker:
        """A watcher with the BFF's scope (no Worker role)."""
        token = self.api.token(self.tenant, "bff", (Role.OBSERVER,), [RUNS_READ])
        return GrpcWorker(self.stub, token)
