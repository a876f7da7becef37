"""Worker sessions over gRPC: ``Exchange`` (a unary long poll per run host, DESIGN 10).

The messages of ``runcontrol.workers.protocol`` to and from ``ExchangeRequest`` / ``ExchangeReply``,
derived from the RPC table: a command in an exchange is the request of its own RPC, in the
``SessionCommand`` oneof field named as the RPC's servicer method (``report_attempt_outcome``
...), and its answer the RPC's response in the ``SessionAnswer`` field of the same name (or a
``SessionError``: the status its unary RPC would have set). Both oneofs are checked against
the table when this module loads.

Who the worker is comes from its token: the tenant of every credit, and each lease holder
(the token's subject plus the credit's ``worker_instance_id``). ``GrpcSessionTransport`` is the
``SessionTransport`` of a worker outside the cluster: a credit's holder is ``subject/instance``
(``WorkerIdentity.holder``) and its instance travels; the server makes the holder again from
the token's subject, so a holder naming another subject is never granted.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC
from typing import Any
from uuid import UUID

import grpc

from schemas import runcontrol_pb2 as pb
from schemas import runcontrol_pb2_grpc as pb_grpc

from ..commands import AcquireLease, Command, RenewLease
from ..domain import LeaseGrant, WorkerIdentity, errors
from ..drain import Drain
from ..workers.protocol import MAX_WAIT_S, Answer, Credit, Grant, SessionDown, SessionUp
from .codec import json_object, json_text, timestamp
from .status import error_from_rpc, error_from_status, rich_status
from .table import (
    BY_COMMAND,
    JOURNALED_CALL,
    LEASE,
    NAMED_ACQUIRE,
    NAMED_RENEW,
    RPCS,
    Rpc,
    identity,
)

# oneof field -> the RPC whose request / response it holds
SESSION_RPCS: Mapping[str, Rpc] = {r.attr: r for r in RPCS if r.commands}


def _check_oneofs() -> None:
    commands = {f.name for f in pb.SessionCommand.DESCRIPTOR.oneofs_by_name["command"].fields}
    answers = {f.name for f in pb.SessionAnswer.DESCRIPTOR.oneofs_by_name["answer"].fields}
    if commands != set(SESSION_RPCS) or answers != {*SESSION_RPCS, "error"}:
        raise TypeError(
            f"SessionCommand {sorted(commands)} / SessionAnswer {sorted(answers)} differ from "
            f"the command RPCs {sorted(SESSION_RPCS)}"
        )
    for name, rpc in SESSION_RPCS.items():
        command: Any = pb.SessionCommand.DESCRIPTOR.fields_by_name[name].message_type
        answer: Any = pb.SessionAnswer.DESCRIPTOR.fields_by_name[name].message_type
        if (command.full_name, answer.full_name) != (
            rpc.request.DESCRIPTOR.full_name,
            rpc.response.DESCRIPTOR.full_name,
        ):
            raise TypeError(f"SessionCommand/SessionAnswer.{name} is not {rpc.method}'s message")


_check_oneofs()


def instance_of(holder: str) -> str:
    """The instance part of a ``subject/instance`` holder (the whole string without one)."""
    return holder.split("/", 1)[1] if "/" in holder else holder


def session_key(worker: WorkerIdentity, session_id: str) -> str:
    """The host's session id: the worker's, scoped to its tenant and subject."""
    return f"{worker.tenant_id}/{worker.subject}/{session_id}"


# ---------------------------------------------------------------------- the server side


def credit_from(message: pb.SessionCredit, worker: WorkerIdentity) -> Credit:
    holder = WorkerIdentity(worker.tenant_id, worker.subject, message.worker_instance_id).holder
    if not message.claim_id:
        raise errors.ValidationFailed("a credit needs a claim_id", field="claim_id")
    agents = tuple(a for a in message.agent_ids if a)
    if not agents:
        raise errors.ValidationFailed("a credit needs agent_ids", field="agent_ids")
    return Credit(message.claim_id, holder, agents, worker.tenant_id, message.resent)


def command_from(message: pb.SessionCommand, worker: WorkerIdentity) -> Command[Any]:
    """The command a ``SessionCommand`` carries, as its own RPC would make it."""
    field = message.WhichOneof("command")
    if field is None:
        raise errors.ValidationFailed("a session command names one request", field="command")
    rpc = SESSION_RPCS[field]
    request = getattr(message, field)
    caller = WorkerIdentity(worker.tenant_id, worker.subject, request.worker_instance_id)
    if rpc.to_command is not None:
        return rpc.to_command(request, caller)
    # AcquireLease: a named attempt (acquisition or renewal); claims are the credits' business
    if request.WhichOneof("target") != "attempt":
        raise errors.ValidationFailed("a session's AcquireLease names an attempt", field="target")
    named = request.attempt
    codec = NAMED_RENEW if named.fencing_token else NAMED_ACQUIRE
    supplied = identity(caller)
    if request.command_id:
        supplied["command_id"] = request.command_id
    command: Command[Any] = codec.decode(named, **supplied)
    return command


def refusal(command_id: str, error: BaseException) -> pb.SessionAnswer:
    if not isinstance(error, errors.RunControlError):
        error = errors.RunControlError(f"the command failed: {type(error).__name__}")
    code, message, detail = rich_status(error)
    failed = pb.SessionError(code=code.value[0], message=message, status_details=detail)
    return pb.SessionAnswer(command_id=command_id, error=failed)


def answer_message(command: Command[Any], answer: Answer) -> pb.SessionAnswer:
    if not answer.ok:
        return refusal(answer.command_id, answer.value)
    rpc = BY_COMMAND[type(command)]
    if isinstance(command, AcquireLease | RenewLease):
        grant: LeaseGrant = answer.value
        response: Any = pb.AcquireLeaseResponse(
            granted=True, lease=LEASE.encode(grant, tenant_id=command.tenant_id, input_json="")
        )
    else:
        assert rpc.answer is not None
        response = rpc.answer(answer.value)
    return pb.SessionAnswer(command_id=answer.command_id, **{rpc.attr: response})


def grant_message(grant: Grant) -> pb.SessionGrant:
    lease = LEASE.encode(grant.lease, tenant_id=grant.tenant_id, input_json=json_text(grant.input))
    message = pb.SessionGrant(
        claim_id=grant.claim_id,
        lease=lease,
        results_json=json_text(dict(grant.results)) if grant.results else "",
        calls=[JOURNALED_CALL.encode(c) for c in grant.calls],
    )
    if grant.deadline_at is not None:
        message.deadline_at.CopyFrom(timestamp(grant.deadline_at))
    return message


def reply_message(down: SessionDown, commands: Mapping[str, Command[Any]]) -> pb.ExchangeReply:
    return pb.ExchangeReply(
        answers=[answer_message(commands[a.command_id], a) for a in down.answers],
        grants=[grant_message(g) for g in down.grants],
        cancels=[str(a) for a in down.cancels],
        backlog=dict(down.backlog),
        hosts=down.hosts,
        draining=down.draining,
    )


Send = Callable[[int, SessionUp], Awaitable[SessionDown]]


async def serve(
    request: pb.ExchangeRequest,
    worker: WorkerIdentity,
    hosts: int,
    send: Send,
    drain: Drain,
    targets: Sequence[str] = (),
) -> pb.ExchangeReply:
    """One exchange of a worker session with run host ``request.host``, for the worker the
    token names: the credits' tenant and holders are the token's; each command is answered as
    its own RPC would answer it; while ``drain`` drains, no credit is offered and a command
    starting new work is refused. ``send`` reaches the host (the replica's relay, or the host
    itself); ``targets``: where each host serves Exchange itself. An empty ``session_id``
    answers the host count and the targets only."""
    if not request.session_id:
        return pb.ExchangeReply(hosts=hosts, host_targets=targets)
    if not 0 <= request.host < hosts:
        raise errors.ValidationFailed(f"host must be in [0, {hosts})", field="host")
    credits = [credit_from(c, worker) for c in request.credits]
    if credits and drain.draining:
        credits = []  # no new leases through a door that drains
    commands: dict[str, Command[Any]] = {}
    refused: list[pb.SessionAnswer] = []
    for message in request.commands:
        try:
            command = command_from(message, worker)
            drain.admit(command)
        except errors.RunControlError as exc:
            field = message.WhichOneof("command")
            command_id = getattr(message, field).command_id if field else ""
            refused.append(refusal(command_id, exc))
            continue
        commands[command.command_id] = command
    up = SessionUp(
        session_key(worker, request.session_id),
        credits=credits,
        commands=tuple(commands.values()),
        acks=tuple(request.acks),
        wait_s=min(max(request.wait_seconds, 0.0), MAX_WAIT_S),
        seq=request.seq,
    )
    reply = reply_message(await send(request.host, up), commands)
    reply.answers.extend(refused)
    reply.host_targets.extend(targets)
    return reply


# ---------------------------------------------------------------------- the client side


def request_message(host: int, up: SessionUp) -> pb.ExchangeRequest:
    commands = []
    for command in up.commands:
        rpc = BY_COMMAND.get(type(command))
        if rpc is None or rpc.to_request is None:
            raise errors.ValidationFailed(f"{type(command).__name__} is not a worker command")
        holder = getattr(command, "holder", "")
        request: Any = rpc.to_request(command, instance_of(holder))
        commands.append(pb.SessionCommand(**{rpc.attr: request}))
    return pb.ExchangeRequest(
        host=host,
        session_id=up.session_id,
        credits=[
            pb.SessionCredit(
                claim_id=c.claim_id,
                worker_instance_id=instance_of(c.holder),
                agent_ids=list(c.agent_ids),
                resent=c.resent,
            )
            for c in up.credits
        ],
        commands=commands,
        acks=list(up.acks),
        wait_seconds=up.wait_s,
        seq=up.seq,
    )


def answer_from(message: pb.SessionAnswer) -> Answer:
    field = message.WhichOneof("answer")
    if field == "error":
        failed = message.error
        error = error_from_status(failed.code, failed.message, failed.status_details)
        return Answer(message.command_id, False, error)
    if field is None:
        return Answer(message.command_id, False, errors.Unavailable("an empty answer"))
    rpc = SESSION_RPCS[field]
    assert rpc.result is not None
    return Answer(message.command_id, True, rpc.result(getattr(message, field)))


def grant_from(message: pb.SessionGrant) -> Grant:
    lease = message.lease
    deadline = None
    if message.HasField("deadline_at"):
        deadline = message.deadline_at.ToDatetime(tzinfo=UTC)
    return Grant(
        message.claim_id,
        lease.tenant_id,
        LEASE.decode(lease),
        json_object(lease.input_json),
        json_object(message.results_json) or {},
        deadline,
        tuple(JOURNALED_CALL.decode(c) for c in message.calls),
    )


def down_from(reply: pb.ExchangeReply) -> SessionDown:
    return SessionDown(
        answers=[answer_from(a) for a in reply.answers],
        grants=[grant_from(g) for g in reply.grants],
        cancels=[UUID(a) for a in reply.cancels],
        backlog=dict(reply.backlog),
        hosts=reply.hosts,
        draining=reply.draining,
    )


# The Serve application runcontrol deploys (actors/service.py APP_NAME).
SERVE_APPLICATION = "runcontrol"
CALL_MARGIN_S = 10.0  # an exchange's deadline: its long poll plus this


# A host whose own Exchange did not answer is reached through the ingress for this long,
# twice as long after each further failure in a row (a worker that cannot reach the nodes).
RELAY_AFTER_FAILURE_S = 5.0
RELAY_AFTER_FAILURE_MAX_S = 300.0


class GrpcSessionTransport:
    """The ``SessionTransport`` of a worker outside the cluster: ``Exchange`` with the worker's
    token in every call, to each run host's own gRPC server once the ingress's replies name
    it (``host_targets``; ``direct=False``: always through Serve's gRPC ingress, relayed by an
    API replica). A failed call whose outcome is unknown raises ``errors.Unavailable`` (resend
    the same commands, the credits ``resent``); a host that did not answer its own call is
    reached through the ingress for ``RELAY_AFTER_FAILURE_S`` (doubled after each further
    failure in a row), whose reply names its target again (a restarted host serves on another
    port)."""

    def __init__(
        self,
        target: str,
        token: str,
        *,
        channel: grpc.aio.Channel | None = None,
        options: list[tuple[str, Any]] | None = None,
        metadata: tuple[tuple[str, str], ...] = (("application", SERVE_APPLICATION),),
        direct: bool = True,
    ) -> None:
        """``metadata``: more of it on every call through the ingress; by default the Serve
        application's name, which Serve's gRPC proxy needs as soon as a second application
        runs beside it."""
        self.target = target
        self._auth = (("authorization", f"Bearer {token}"),)
        self._metadata = (*self._auth, *metadata)
        self._options = options
        self._own_channel = channel is None
        self._channel = channel or grpc.aio.insecure_channel(target, options=options)
        self._stub = pb_grpc.RunControlStub(self._channel)  # type: ignore[no-untyped-call]
        self._hosts: int | None = None
        self._direct = direct
        self._targets: list[str] = []  # host k's own target, as the ingress last named it
        self._relay_until: dict[int, float] = {}  # host -> through the ingress until then
        self._failures: dict[int, int] = {}  # host -> its own Exchange's failures in a row
        self._host_channels: dict[str, tuple[grpc.aio.Channel, Any]] = {}  # target -> stub
        self.direct_exchanges = 0  # answered by a host's own server (tests, benchmarks)

    async def close(self) -> None:
        for channel, _ in self._host_channels.values():
            await channel.close()
        self._host_channels.clear()
        if self._own_channel:
            await self._channel.close()

    async def _call(
        self, request: pb.ExchangeRequest, stub: Any = None, metadata: Any = None
    ) -> pb.ExchangeReply:
        timeout = min(request.wait_seconds, MAX_WAIT_S) + CALL_MARGIN_S
        call: Callable[..., Any] = (stub or self._stub).Exchange
        try:
            reply: pb.ExchangeReply = await call(
                request, metadata=metadata or self._metadata, timeout=timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        self._hosts = reply.hosts or self._hosts
        if reply.host_targets:
            self._targets = list(reply.host_targets)
        return reply

    async def hosts(self) -> int:
        if self._hosts is None:
            await self._call(pb.ExchangeRequest())
        return self._hosts or 1

    async def exchange(self, host: int, up: SessionUp) -> SessionDown:
        request = request_message(host, up)
        stub = self._host_stub(host)
        if stub is None:
            return down_from(await self._call(request))
        try:
            reply = await self._call(request, stub, self._auth)
        except errors.Unavailable:
            failures = self._failures[host] = self._failures.get(host, 0) + 1
            relay_s = min(RELAY_AFTER_FAILURE_S * 2 ** (failures - 1), RELAY_AFTER_FAILURE_MAX_S)
            self._relay_until[host] = time.monotonic() + relay_s
            raise
        self._failures.pop(host, None)
        self.direct_exchanges += 1
        return down_from(reply)

    def _host_stub(self, host: int) -> Any:
        """Host ``host``'s own stub, or None: through the ingress."""
        if not self._direct or host >= len(self._targets) or not self._targets[host]:
            return None
        if time.monotonic() < self._relay_until.get(host, 0.0):
            return None
        target = self._targets[host]
        found = self._host_channels.get(target)
        if found is None:
            channel = grpc.aio.insecure_channel(target, options=self._options)
            found = channel, pb_grpc.RunControlStub(channel)  # type: ignore[no-untyped-call]
            self._host_channels[target] = found
        return found[1]
