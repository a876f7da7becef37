"""The RPCs of ``runcontrol.v1.RunControl`` and ``grpc.health.v1.Health`` over a client.

Transport-neutral: each RPC takes the request message and a context with the calls both
``grpc.aio.ServicerContext`` and Ray Serve's ``RayServegRPCContext`` offer (metadata in, code,
details and trailers out). Ray Serve's gRPC ingress serves them (``actors/grpc_ingress.py``).

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
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from sqlalchemy import Connection, select, text

from schemas import runcontrol_pb2 as pb

from ..client import TERMINAL_EVENTS, RunControlClient
from ..commands import Command
from ..config import Settings
from ..domain import Role, RunState, WorkerIdentity, errors
from ..domain.access import RUNTIME
from ..drain import Drain
from ..edge import reads
from ..edge.auth import Caller, TokenVerifier, watch_scope
from ..edge.commands import Outside
from ..edge.errors import InsufficientScope, Unauthorized
from ..edge.metering import TenantRateLimiter
from ..edge.unexpected import unexpected
from ..store import Database
from ..store import queries as q
from ..store.commit import EVENTS_CHANNEL
from ..store.notify import Listener
from ..store.output import OUTPUT_CHANNEL
from ..store.tables import runs
from . import exchange
from . import output as output_stream
from .codec import Codec, json_text, uuid_field
from .status import DETAILS_KEY, rich_status
from .table import (
    NAMED_ACQUIRE,
    NAMED_RENEW,
    RPCS,
    Rpc,
    event_message,
    identity,
    lease_message,
)

M = TypeVar("M", bound=Message)
T = TypeVar("T")

SERVICE_NAME = "runcontrol.v1.RunControl"
MAX_CLAIM_WAIT_S = 60.0  # a longer long-poll only ties up the ingress replica's request slot
REPLAY_BATCH = 500
WATCH_IDLE_S = 30.0  # the output watchers' LISTEN connection closes after this long unused
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


def bearer_token(context: RpcContext) -> str:
    """The bearer token of the call's ``authorization`` metadata (else ``Unauthorized``)."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            text_value = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text_value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            raise Unauthorized("the authorization metadata must be 'Bearer <token>'")
    raise Unauthorized("a bearer token is required in the authorization metadata")


async def worker_of(
    verifier: TokenVerifier, context: RpcContext, instance_id: str, scope: str = RUNTIME
) -> WorkerIdentity:
    """The worker the call's token names (role ``Worker`` and ``scope`` required), as lease
    holder ``instance_id`` of it."""
    caller = await verifier.verify_async(bearer_token(context))
    if Role.WORKER not in caller.principal.roles:
        raise errors.Forbidden("this call needs a token with the role Worker", role="Worker")
    if scope not in caller.scopes:
        raise InsufficientScope(f"the token lacks the scope {scope}", scope=scope)
    return WorkerIdentity(caller.tenant_id, caller.principal.subject, instance_id)


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
        rate_limiter: TenantRateLimiter | None = None,
    ) -> None:
        self._client = client
        self._db = db
        self._settings = settings
        self._verifier = verifier or TokenVerifier(settings.auth)
        self._host_probe = host_probe
        # The replica's drain (shared with its HTTP app): no new leases while it drains; the
        # fenced calls of leases already held go on, and the drain waits for them.
        self._drain = drain or Drain(settings.drain.retry_after_seconds)
        # The replica's tenant command rate (shared with its HTTP app): outside commands only.
        self._rate_limiter = rate_limiter or TenantRateLimiter(settings.api)
        # WatchRun with output: open only while such a stream waits (rpc/output.py).
        self._watch_listener = Listener(
            db.app_urls,
            (EVENTS_CHANNEL, OUTPUT_CHANNEL),
            application_name="runcontrol-grpc-watch",
            idle_s=WATCH_IDLE_S,
        )

    # ------------------------------------------------------------------ identity

    async def _caller(self, context: RpcContext) -> Caller:
        return await self._verifier.verify_async(bearer_token(context))

    async def _worker(
        self, context: RpcContext, instance_id: str, scope: str = RUNTIME
    ) -> WorkerIdentity:
        return await worker_of(self._verifier, context, instance_id, scope)

    async def _read(
        self, tenant_id: str, query: Callable[[Connection], T], project_id: str | None = None
    ) -> T:
        return await reads.read(self._db, tenant_id, query, project_id=project_id)

    async def _answer(self, context: RpcContext, empty: M, work: Callable[[], Awaitable[M]]) -> M:
        try:
            with self._drain.track():
                return await work()
        except errors.RunControlError as exc:
            refuse(context, exc)
        except Exception as exc:  # noqa: BLE001 - logged with an id, answered INTERNAL
            refuse(context, unexpected(exc, f"gRPC {type(empty).__name__}"))
        return empty

    # ------------------------------------------------------------------ RunControl

    async def command(self, rpc: Rpc, request: Any, context: RpcContext) -> Any:
        """A command of the table: a worker's (the request's fields, the caller's identity),
        or an outside command (the request through its builder, as the HTTP route sends it:
        the same permission, visibility, key and checks)."""
        answer = rpc.answer
        assert answer is not None and (rpc.to_command or rpc.build) is not None

        async def work() -> Message:
            command: Command[Any]
            if rpc.build is not None:
                caller = await self._caller(context)
                sender = Outside(caller, self._db, "grpc", self._rate_limiter)
                command = await rpc.build(request, sender)
            else:
                assert rpc.to_command is not None
                worker = await self._worker(context, request.worker_instance_id, rpc.scope)
                command = rpc.to_command(request, worker)
            self._drain.admit(command)
            return answer(await self._client.send(command))

        return await self._answer(context, rpc.response(), work)

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
        lease = lease_message(claim.grant, claim.tenant_id, claim.input)
        results = json_text(dict(claim.results)) if claim.results else ""
        return pb.AcquireLeaseResponse(granted=True, lease=lease, results_json=results)

    async def _named(
        self, worker: WorkerIdentity, named: pb.NamedAttempt, command_id: str
    ) -> pb.AcquireLeaseResponse:
        codec: Codec[Any] = NAMED_RENEW if named.fencing_token else NAMED_ACQUIRE
        supplied = identity(worker)
        if command_id:
            supplied["command_id"] = command_id
        command = codec.decode(named, **supplied)
        self._drain.admit(command)
        grant = await self._client.send(command)
        input = None
        if not named.fencing_token:  # an acquisition answers the run's input; a renewal not
            input = await self._read(worker.tenant_id, _input(command.run_id))
        return pb.AcquireLeaseResponse(
            granted=True, lease=lease_message(grant, worker.tenant_id, input)
        )

    async def exchange(self, request: pb.ExchangeRequest, context: RpcContext) -> pb.ExchangeReply:
        """One exchange of a worker session with run host ``request.host`` (``rpc.exchange``):
        the credits' tenant and holders are the token's; each command is answered as its own
        RPC would answer it. An empty ``session_id`` answers the host count only."""

        async def work() -> pb.ExchangeReply:
            worker = await self._worker(context, "session")
            client = self._client
            hosts, targets = await asyncio.gather(client.hosts(), client.exchange_targets())
            return await exchange.serve(
                request, worker, hosts, client.exchange, self._drain, targets
            )

        return await self._answer(context, pb.ExchangeReply(), work)

    async def watch_run(
        self, request: pb.WatchRunRequest, context: RpcContext
    ) -> AsyncIterator[pb.RunEvent]:
        """The run's events after ``after_seq`` (exclusive), replayed from the store, then
        live; ends after the terminal event (at once for a finished run already seen)."""
        try:
            caller = await self._caller(context)
            project = watch_scope(caller)  # another project's run is not found, as over HTTP
            run_id = uuid_field(request.run_id, "run_id")
            cursor = max(request.after_seq, 0)
            read = _run_and_events(run_id, cursor)
            run, batch = await self._read(caller.tenant_id, read, project)
            if run is None:
                raise errors.RunNotFound(f"run {run_id} not found", run_id=str(run_id))
        except Exception as exc:  # noqa: BLE001 - an unexpected one: logged with an id, INTERNAL
            typed = (
                exc if isinstance(exc, errors.RunControlError) else unexpected(exc, "gRPC WatchRun")
            )
            refuse(context, typed)  # its status, message and typed detail
            raise StreamRefused(typed.message) from None
        tenant_id = caller.tenant_id
        if request.include_output:
            output = output_stream.watch_with_output(
                self._watch_listener,
                lambda query: self._read(tenant_id, query, project),
                run_id,
                cursor,
                max(request.after_output_position, 0),
            )
            async for found in output:
                if found is not None:
                    yield found
            return
        while True:
            for event in batch:
                cursor = event["seq"]
                yield event_message(event)
                if event["type"] in TERMINAL_EVENTS:
                    return
            if len(batch) < REPLAY_BATCH:
                break
            run, batch = await self._read(tenant_id, _run_and_events(run_id, cursor), project)
        if run is not None and RunState(run["state"]).terminal:
            return  # the terminal event is at or before the cursor: nothing more will come
        async for event in self._client.watch(tenant_id, run_id, cursor, wait_s=WATCH_POLL_S):
            yield event_message(event)

    # ------------------------------------------------------------------ grpc.health.v1

    async def _serving(self) -> bool:
        if self._drain.draining:
            return False

        def select_one() -> None:
            for each in self._db.databases():  # every shard database answers
                with each.app.connect() as conn:
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


def _served(rpc: Rpc) -> Callable[..., Awaitable[Any]]:
    async def serve(self: RunControlRpc, request: Any, context: RpcContext) -> Any:
        return await self.command(rpc, request, context)

    serve.__name__ = rpc.attr
    return serve


for _rpc in RPCS:
    if _rpc.to_command is not None or _rpc.build is not None:
        setattr(RunControlRpc, _rpc.attr, _served(_rpc))
    elif not callable(getattr(RunControlRpc, _rpc.attr, None)):
        raise TypeError(f"RPCS {_rpc.method}: RunControlRpc has no method {_rpc.attr}")
