"""The RPCs of ``runcontrol.v1.RunControl`` and ``grpc.health.v1.Health`` over a client.

Transport-neutral: each RPC takes the request message and a context with the calls both
``grpc.aio.ServicerContext`` and Ray Serve's ``RayServegRPCContext`` offer (metadata in, code,
details and trailers out). Ray Serve's gRPC ingress serves them (``grpc_ingress.py``).

Who the caller is comes only from the verified JWT in the ``authorization`` metadata: the
worker RPCs need role ``Worker`` and scope ``factory.runtime``; the tenant is the token's and
the lease holder is the token's subject plus the request's ``worker_instance_id``.

A unary refusal is answered with its status code, message and typed detail (``status``) and an
empty message; a stream's refusal before its first event sets code and message and raises
``StreamRefused`` (Ray Serve carries code and message of a raised error, not trailers).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar
from uuid import UUID

import grpc
from grpc_health.v1 import health_pb2
from sqlalchemy import Connection, select, text

from schemas import runcontrol_pb2 as pb

from ..api.auth import RUNS_READ, RUNTIME, Caller, TokenVerifier
from ..api.problems import InsufficientScope, Unauthorized
from ..client import TERMINAL_EVENTS, RunControlClient
from ..commands import (
    AcquireLease,
    ClaimToolCall,
    CompleteToolCall,
    RenewLease,
    ReportOutcome,
    ReportProgress,
    RequestApproval,
    new_command_id,
)
from ..config import Settings
from ..domain import FailureClass, Role, RunState, SideEffectClass, WorkerIdentity, errors
from ..drain import Drain
from ..store import Database
from ..store import queries as q
from ..store.tables import runs
from . import convert
from .status import DETAILS_KEY, rich_status

M = TypeVar("M")
T = TypeVar("T")

SERVICE_NAME = "runcontrol.v1.RunControl"
MAX_CLAIM_WAIT_S = 60.0  # a longer long-poll only ties up the ingress replica's request slot
REPLAY_BATCH = 500
WATCH_POLL_S = 20.0  # one host long-poll of a live WatchRun; the stream itself has no limit
HEALTH_WATCH_S = 5.0


class RpcContext(Protocol):
    def invocation_metadata(self) -> Any: ...

    def set_code(self, code: grpc.StatusCode) -> None: ...

    def set_details(self, details: str) -> None: ...

    def set_trailing_metadata(self, trailing_metadata: Any) -> None: ...


class StreamRefused(Exception):
    """A server stream refused before its first message; the context holds code and message."""


HostProbe = Callable[[], Awaitable[Any]]


def _bearer(context: RpcContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            text_value = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text_value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            raise Unauthorized("the authorization metadata must be 'Bearer <token>'")
    raise Unauthorized("a bearer token is required in the authorization metadata")


def refuse(context: RpcContext, error: errors.RunControlError) -> None:
    """Set the error's status code, message and typed detail on the call."""
    code, message, detail = rich_status(error)
    context.set_code(code)
    context.set_details(message)
    context.set_trailing_metadata([(DETAILS_KEY, detail)])


class RunControlRpc:
    def __init__(
        self,
        client: RunControlClient,
        db: Database,
        settings: Settings,
        *,
        verifier: TokenVerifier | None = None,
        host_probe: HostProbe | None = None,
        drain: Drain | None = None,
    ) -> None:
        self._client = client
        self._db = db
        self._settings = settings
        self._verifier = verifier or TokenVerifier(settings.auth)
        self._host_probe = host_probe
        # The replica's drain (shared with its HTTP app): no new leases while it drains; the
        # fenced calls of leases already held go on, and the drain waits for them.
        self._drain = drain or Drain(settings.drain.retry_after_seconds)

    # ------------------------------------------------------------------ identity

    async def _caller(self, context: RpcContext) -> Caller:
        return await self._verifier.verify_async(_bearer(context))

    async def _worker(self, context: RpcContext, instance_id: str) -> WorkerIdentity:
        caller = await self._caller(context)
        if Role.WORKER not in caller.principal.roles:
            raise errors.Forbidden("this call needs a token with the role Worker", role="Worker")
        if RUNTIME not in caller.scopes:
            raise InsufficientScope(f"the token lacks the scope {RUNTIME}", scope=RUNTIME)
        return WorkerIdentity(caller.tenant_id, caller.principal.subject, instance_id)

    async def _watcher(self, context: RpcContext) -> Caller:
        caller = await self._caller(context)
        if RUNS_READ in caller.scopes:
            return caller
        if Role.WORKER in caller.principal.roles and RUNTIME in caller.scopes:
            return caller
        raise InsufficientScope(
            f"WatchRun needs the scope {RUNS_READ}, or role Worker with {RUNTIME}",
            scope=RUNS_READ,
        )

    async def _read(self, tenant_id: str, query: Callable[[Connection], T]) -> T:
        def run() -> T:
            with self._db.tenant(tenant_id) as conn:
                return query(conn)

        return await asyncio.to_thread(run)

    async def _answer(self, context: RpcContext, empty: M, work: Callable[[], Awaitable[M]]) -> M:
        try:
            with self._drain.track():
                return await work()
        except errors.RunControlError as exc:
            refuse(context, exc)
            return empty

    # ------------------------------------------------------------------ RunControl

    async def acquire_lease(
        self, request: pb.AcquireLeaseRequest, context: RpcContext
    ) -> pb.AcquireLeaseResponse:
        async def work() -> pb.AcquireLeaseResponse:
            worker = await self._worker(context, request.worker_instance_id)
            target = request.WhichOneof("target")
            if target == "claim_next":
                return await self._claim_next(worker, request.claim_next, request.command_id)
            if target == "attempt":
                return await self._named(worker, request.attempt, request.command_id)
            raise errors.ValidationFailed("name claim_next or attempt", field="target")

        return await self._answer(context, pb.AcquireLeaseResponse(), work)

    async def _claim_next(
        self, worker: WorkerIdentity, claim_next: pb.ClaimNext, claim_id: str
    ) -> pb.AcquireLeaseResponse:
        agent_ids = [a for a in claim_next.agent_ids if a]
        if not agent_ids:
            raise errors.ValidationFailed("claim_next needs agent_ids", field="agent_ids")
        self._drain.check("AcquireLease")
        wait_s = min(max(claim_next.wait_seconds, 0.0), MAX_CLAIM_WAIT_S)
        claim = await self._client.claim(agent_ids, worker, wait_s, claim_id=claim_id or None)
        if claim is None:
            return pb.AcquireLeaseResponse(granted=False)
        lease = convert.lease_message(claim.grant, claim.tenant_id, claim.input)
        return pb.AcquireLeaseResponse(granted=True, lease=lease)

    async def _named(
        self, worker: WorkerIdentity, named: pb.NamedAttempt, command_id: str
    ) -> pb.AcquireLeaseResponse:
        run_id = convert.uuid_field(named.run_id, "run_id")
        attempt_id = convert.uuid_field(named.attempt_id, "attempt_id")
        common: dict[str, Any] = {
            "tenant_id": worker.tenant_id,
            "run_id": run_id,
            "command_id": command_id or new_command_id(),
            "attempt_id": attempt_id,
            "holder": worker.holder,
        }
        if named.fencing_token:
            grant = await self._client.send(
                RenewLease(
                    **common,
                    fencing_token=named.fencing_token,
                    lease_id=convert.optional_uuid(named.lease_id, "lease_id"),
                )
            )
            lease = convert.lease_message(grant, worker.tenant_id)
        else:
            acquire = AcquireLease(**common)
            self._drain.admit(acquire)
            grant = await self._client.send(acquire)
            lease = convert.lease_message(
                grant, worker.tenant_id, await self._read(worker.tenant_id, _input(run_id))
            )
        return pb.AcquireLeaseResponse(granted=True, lease=lease)

    async def report_attempt_outcome(
        self, request: pb.ReportAttemptOutcomeRequest, context: RpcContext
    ) -> pb.ReportAttemptOutcomeResponse:
        async def work() -> pb.ReportAttemptOutcomeResponse:
            worker = await self._worker(context, request.worker_instance_id)
            outcome = convert.OUTCOMES.get(request.outcome)
            if outcome is None:
                raise errors.ValidationFailed("outcome is required", field="outcome")
            attempt = await self._client.send(
                ReportOutcome(
                    **_fenced(worker, request),
                    outcome=outcome,
                    failure_class=_failure_class(request.failure_class),
                    outcome_hash=request.outcome_hash or None,
                )
            )
            return pb.ReportAttemptOutcomeResponse(attempt=convert.attempt_message(attempt))

        return await self._answer(context, pb.ReportAttemptOutcomeResponse(), work)

    async def request_approval(
        self, request: pb.RequestApprovalRequest, context: RpcContext
    ) -> pb.RequestApprovalResponse:
        async def work() -> pb.RequestApprovalResponse:
            worker = await self._worker(context, request.worker_instance_id)
            approval = await self._client.send(
                RequestApproval(
                    **_fenced(worker, request),
                    proposal_hash=request.proposal_hash,
                    action_class=_action_class(request.action_class),
                )
            )
            if approval is None:
                return pb.RequestApprovalResponse(required=False)
            return pb.RequestApprovalResponse(
                required=True, approval=convert.approval_message(approval)
            )

        return await self._answer(context, pb.RequestApprovalResponse(), work)

    async def report_progress(
        self, request: pb.ReportProgressRequest, context: RpcContext
    ) -> pb.ReportProgressResponse:
        async def work() -> pb.ReportProgressResponse:
            worker = await self._worker(context, request.worker_instance_id)
            ack = await self._client.send(
                ReportProgress(
                    **_fenced(worker, request),
                    messages=convert.progress_messages(request.messages),
                )
            )
            return convert.progress_response(ack)

        return await self._answer(context, pb.ReportProgressResponse(), work)

    async def claim_tool_call(
        self, request: pb.ClaimToolCallRequest, context: RpcContext
    ) -> pb.ToolCallResponse:
        async def work() -> pb.ToolCallResponse:
            worker = await self._worker(context, request.worker_instance_id)
            claim = await self._client.send(
                ClaimToolCall(
                    **_fenced(worker, request),
                    call_id=request.call_id,
                    request_hash=request.request_hash,
                )
            )
            return convert.tool_call_message(claim)

        return await self._answer(context, pb.ToolCallResponse(), work)

    async def complete_tool_call(
        self, request: pb.CompleteToolCallRequest, context: RpcContext
    ) -> pb.ToolCallResponse:
        async def work() -> pb.ToolCallResponse:
            worker = await self._worker(context, request.worker_instance_id)
            claim = await self._client.send(
                CompleteToolCall(
                    **_fenced(worker, request),
                    call_id=request.call_id,
                    result_hash=request.result_hash,
                )
            )
            return convert.tool_call_message(claim)

        return await self._answer(context, pb.ToolCallResponse(), work)

    async def watch_run(
        self, request: pb.WatchRunRequest, context: RpcContext
    ) -> AsyncIterator[pb.RunEvent]:
        """The run's events after ``after_seq`` (exclusive), replayed from the store, then
        live; ends after the terminal event (at once for a finished run already seen)."""
        try:
            caller = await self._watcher(context)
            run_id = convert.uuid_field(request.run_id, "run_id")
            cursor = max(request.after_seq, 0)
            run, batch = await self._read(caller.tenant_id, _run_and_events(run_id, cursor))
            if run is None:
                raise errors.RunNotFound(f"run {run_id} not found", run_id=str(run_id))
        except errors.RunControlError as exc:
            code, message, _ = rich_status(exc)
            context.set_code(code)
            context.set_details(message)
            raise StreamRefused(message) from None
        tenant_id = caller.tenant_id
        while True:
            for event in batch:
                cursor = event["seq"]
                yield convert.event_message(event)
                if event["type"] in TERMINAL_EVENTS:
                    return
            if len(batch) < REPLAY_BATCH:
                break
            run, batch = await self._read(tenant_id, _run_and_events(run_id, cursor))
        if run is not None and RunState(run["state"]).terminal:
            return  # the terminal event is at or before the cursor: nothing more will come
        async for event in self._client.watch(tenant_id, run_id, cursor, wait_s=WATCH_POLL_S):
            yield convert.event_message(event)

    # ------------------------------------------------------------------ grpc.health.v1

    async def _serving(self) -> bool:
        if self._drain.draining:
            return False

        def select_one() -> None:
            with self._db.app.connect() as conn:
                conn.scalar(text("SELECT 1"))

        probes: list[Awaitable[Any]] = [asyncio.to_thread(select_one)]
        if self._host_probe is not None:
            probes.append(self._host_probe())
        try:
            await asyncio.wait_for(
                asyncio.gather(*probes), self._settings.api.readiness_timeout_seconds
            )
        except Exception:  # noqa: BLE001 - any failure means not serving
            return False
        return True

    def _status(self, serving: bool) -> health_pb2.HealthCheckResponse:
        value = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        return health_pb2.HealthCheckResponse(status=value)

    async def health_check(
        self, request: health_pb2.HealthCheckRequest, context: RpcContext
    ) -> health_pb2.HealthCheckResponse:
        """Serving when the database and every run host answer (the HTTP readiness)."""
        if request.service not in ("", SERVICE_NAME):
            context.set_code(grpc.StatusCode.NOT_FOUND)
            context.set_details(f"unknown service {request.service!r}")
            return health_pb2.HealthCheckResponse()
        return self._status(await self._serving())

    async def health_list(
        self, request: health_pb2.HealthListRequest, context: RpcContext
    ) -> health_pb2.HealthListResponse:
        status = self._status(await self._serving())
        return health_pb2.HealthListResponse(statuses={"": status, SERVICE_NAME: status})

    async def health_watch(
        self, request: health_pb2.HealthCheckRequest, context: RpcContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        """The status now, then each change (checked every few seconds)."""
        if request.service not in ("", SERVICE_NAME):
            yield health_pb2.HealthCheckResponse(
                status=health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            )
            return
        last: bool | None = None
        while True:
            serving = await self._serving()
            if serving != last:
                last = serving
                yield self._status(serving)
            await asyncio.sleep(HEALTH_WATCH_S)


# ---------------------------------------------------------------------- helpers


FencedRequest = (
    pb.ReportAttemptOutcomeRequest
    | pb.RequestApprovalRequest
    | pb.ReportProgressRequest
    | pb.ClaimToolCallRequest
    | pb.CompleteToolCallRequest
)


def _fenced(worker: WorkerIdentity, request: FencedRequest) -> dict[str, Any]:
    return {
        "tenant_id": worker.tenant_id,
        "run_id": convert.uuid_field(request.run_id, "run_id"),
        "command_id": request.command_id or new_command_id(),
        "attempt_id": convert.uuid_field(request.attempt_id, "attempt_id"),
        "holder": worker.holder,
        "fencing_token": request.fencing_token,
        "lease_id": convert.optional_uuid(request.lease_id, "lease_id"),
    }


def _failure_class(value: str) -> FailureClass | None:
    try:
        return FailureClass(value) if value else None
    except ValueError:
        raise errors.ValidationFailed(f"unknown failure class {value!r}") from None


def _action_class(value: str) -> SideEffectClass | None:
    try:
        return SideEffectClass(value) if value else None
    except ValueError:
        raise errors.ValidationFailed(f"unknown action class {value!r}") from None


def _input(run_id: UUID) -> Callable[[Connection], Any]:
    def read(conn: Connection) -> Any:
        return conn.scalar(select(runs.c.input).where(runs.c.run_id == run_id))

    return read


RunAndEvents = tuple[dict[str, Any] | None, list[dict[str, Any]]]


def _run_and_events(run_id: UUID, after: int) -> Callable[[Connection], RunAndEvents]:
    """The run's state (None: not in this tenant) and its events after ``after``."""

    def read(conn: Connection) -> RunAndEvents:
        state = conn.scalar(select(runs.c.state).where(runs.c.run_id == run_id))
        if state is None:
            return None, []
        return {"state": state}, q.events_after(conn, run_id, after, REPLAY_BATCH)

    return read
