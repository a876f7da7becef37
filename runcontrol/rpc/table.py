"""The gRPC surface as data: the codec of each message and the one table of RPCs.

The servicer (``service.RunControlRpc``), the worker's client (``client.GrpcWorkerClient``)
and Serve's ingress methods (``actors.grpc_ingress.GrpcIngress``) are built from ``RPCS``: a
worker command over gRPC is its declaration's ``rpc`` (``commands.declare``) and its messages in the
proto: its row here is derived, its answer's codec found in ``REPLIES``. An outside command (not
a worker's) is a row built by ``outside_rpc``, with the builder the HTTP route calls too
(``edge.commands``). A codec is checked when this module loads (``codec.Codec``): a field of a
domain type the proto lacks fails the import, as does a declared rpc the proto lacks or an
answer with no codec.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from schemas import runcontrol_pb2 as pb

from ..commands import DECLARATIONS, AcquireLease, Command, RenewLease, SendSignal, SignalResult
from ..domain import (
    ApprovalRequest,
    Attempt,
    Event,
    JournaledCall,
    LeaseGrant,
    ProgressAck,
    RateConsumed,
    RecordedCall,
    ToolCallClaim,
    WorkerIdentity,
    errors,
)
from ..domain.access import RUNS_READ, RUNS_WRITE, RUNTIME
from ..domain.output import OutputAck
from ..edge import commands as outside
from ..edge.commands import Outside
from .codec import Codec, json_text, uuid_field

# ---------------------------------------------------------------------- the answers

LEASE = Codec(LeaseGrant, pb.Lease, extra=("tenant_id", "input_json"))
ATTEMPT = Codec(Attempt, pb.Attempt)
APPROVAL = Codec(ApprovalRequest, pb.Approval)
PROGRESS_ACK = Codec(ProgressAck, pb.ReportProgressResponse)
TOOL_CALL = Codec(ToolCallClaim, pb.ToolCallResponse)
SIGNAL = Codec(SignalResult, pb.SendSignalResponse)
RATE_CONSUMED = Codec(RateConsumed, pb.ConsumeRateLimitResponse)
RECORDED_CALL = Codec(RecordedCall, pb.RecordCallResponse)
# what a grant carries of its step's journaled calls
JOURNALED_CALL = Codec(JournaledCall, pb.JournaledCall)
OUTPUT_ACK = Codec(OutputAck, pb.AppendOutputResponse)
# Event.body, the typed payload, is memory only: the wire carries the payload it serialises to.
# ``output``: a chunk of streamed output WatchRun interleaves on request (``rpc.output``).
EVENT = Codec(
    Event, pb.RunEvent, rename={"event_type": "type"}, supplied=("body",), extra=("output",)
)

# ---------------------------------------------------------------------- the requests

# Who the caller is comes from its token, never from the request: the tenant, and the lease
# holder (the token's subject plus the request's worker_instance_id).
_FROM_TOKEN = ("tenant_id", "holder")


def _fenced(command: type[Any], request: type[Message]) -> Codec[Any]:
    return Codec(command, request, supplied=_FROM_TOKEN, extra=("worker_instance_id",))


# AcquireLease names its attempt in a oneof beside claim_next; command_id is the request's.
NAMED_ACQUIRE = Codec(
    AcquireLease,
    pb.NamedAttempt,
    supplied=(*_FROM_TOKEN, "command_id"),
    extra=("fencing_token", "lease_id"),
)
NAMED_RENEW = Codec(RenewLease, pb.NamedAttempt, supplied=(*_FROM_TOKEN, "command_id"))


def identity(worker: WorkerIdentity) -> dict[str, str]:
    return {"tenant_id": worker.tenant_id, "holder": worker.holder}


# ---------------------------------------------------------------------- the table

ToCommand = Callable[[Any, WorkerIdentity], Command[Any]]
ToRequest = Callable[[Any, str], Message]  # (command, worker_instance_id)
Answer = Callable[[Any], Message]  # the command's answer -> the response
Result = Callable[[Any], Any]  # the response -> the command's answer
Build = Callable[[Any, Outside], Awaitable[Command[Any]]]  # (request, its sender) -> command


@dataclass(frozen=True, slots=True)
class Rpc:
    """One method of ``runcontrol.v1.RunControl``.

    A row with ``to_command`` (a worker command) or ``build`` (an outside command: the
    request through the builder the HTTP route calls too, ``edge.commands``) is served
    generically: the request is its command (plus the caller's identity), sent to the run's
    grain, and ``answer`` makes the response. A row with neither is a method of
    ``RunControlRpc`` of the same name in snake case (a long-poll, a stream). ``commands``
    are those the client sends through the method: ``to_request`` makes the request,
    ``result`` reads the command's answer back.
    """

    method: str
    request: type[Message]
    response: type[Message]
    scope: str  # with role Worker; WatchRun also takes factory.runs.read alone
    commands: tuple[type[Command[Any]], ...] = ()
    to_command: ToCommand | None = None
    to_request: ToRequest | None = None
    answer: Answer | None = None
    result: Result | None = None
    stream: bool = False
    build: Build | None = None

    @property
    def attr(self) -> str:
        """The servicer's method name (``ReportAttemptOutcome`` -> ``report_attempt_outcome``)."""
        return "".join("_" + c.lower() if c.isupper() else c for c in self.method).lstrip("_")


_SERVICE = pb.DESCRIPTOR.services_by_name["RunControl"]


def _messages(method: str) -> tuple[type[Message], type[Message]]:
    """The request and response message of a method of the proto's service."""
    m = _SERVICE.methods_by_name[method]
    return GetMessageClass(m.input_type), GetMessageClass(m.output_type)


def command_rpc(method: str, command: type[Command[Any]], answers: Any) -> Rpc:
    """A fenced worker command: its request message carries the command's fields by name,
    its response the answer through ``REPLIES[answers]`` (the whole response, or the one
    field of the codec's message)."""
    try:
        request, response = _messages(method)
    except KeyError:
        raise TypeError(f"{command.__name__}: the proto has no rpc {method}") from None
    codec = _fenced(command, request)
    reply = REPLIES.get(answers)
    if reply is None:
        raise TypeError(f"{command.__name__}: no codec in REPLIES for its answer {answers}")
    if isinstance(reply, tuple):
        answer, result = reply
    elif reply.message is response:
        answer, result = reply.encode, reply.decode
    else:
        field = _field_of(response, reply.message)
        answer = lambda value: response(**{field: reply.encode(value)})  # noqa: E731
        result = lambda message: reply.decode(getattr(message, field))  # noqa: E731
    return Rpc(
        method,
        request,
        response,
        RUNTIME,
        commands=(command,),
        to_command=lambda req, worker: codec.decode(req, **identity(worker)),
        to_request=lambda cmd, instance: codec.encode(cmd, worker_instance_id=instance),
        answer=answer,
        result=result,
    )


def _lease_request(command: AcquireLease | RenewLease, instance: str) -> pb.AcquireLeaseRequest:
    if isinstance(command, RenewLease):
        named = NAMED_RENEW.encode(command)
    else:
        named = NAMED_ACQUIRE.encode(command)
    return pb.AcquireLeaseRequest(
        worker_instance_id=instance, attempt=named, command_id=command.command_id
    )


def _approval_response(approval: ApprovalRequest | None) -> pb.RequestApprovalResponse:
    if approval is None:
        return pb.RequestApprovalResponse(required=False)
    return pb.RequestApprovalResponse(required=True, approval=APPROVAL.encode(approval))


def _approval(response: pb.RequestApprovalResponse) -> ApprovalRequest | None:
    return APPROVAL.decode(response.approval) if response.required else None


# ---------------------------------------------------------------------- outside commands


def _json_value(text: str, name: str) -> Any:
    """Any JSON value as its text; the empty text is null."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        raise errors.ValidationFailed(f"{name} must be JSON", field=name) from None


async def _send_signal(request: pb.SendSignalRequest, sender: Outside) -> SendSignal:
    return await outside.send_signal(
        sender,
        request.command_id,
        run_id=uuid_field(request.run_id, "run_id"),
        name=request.name,
        body=_json_value(request.body_json, "body_json"),
    )


def outside_rpc(
    method: str,
    command: type[Command[Any]],
    build: Build,
    reply: Codec[Any],
    *,
    from_caller: tuple[str, ...],
) -> Rpc:
    """An outside command: ``build`` makes it through its builder, ``reply`` is the codec of
    its answer (the whole response). Its request message carries the command's fields by name
    (checked here, as a worker command's codec is) but ``from_caller``: who sends it is the
    token's, never the request's, and ``command_id`` is the caller's idempotency key, which
    the builder scopes to the caller."""
    request, response = _messages(method)
    Codec(command, request, supplied=from_caller)  # a field missing on either side: TypeError
    return Rpc(method, request, response, RUNS_WRITE, answer=reply.encode, build=build)


def _field_of(response: type[Message], message: type[Message]) -> str:
    """The one field of ``response`` holding a ``message``."""
    found = [
        f.name
        for f in response.DESCRIPTOR.fields
        if f.message_type is not None and f.message_type.full_name == message.DESCRIPTOR.full_name
    ]
    if len(found) != 1:
        raise TypeError(f"{response.DESCRIPTOR.name} has no one field of {message.DESCRIPTOR.name}")
    return found[0]


# The response of a worker command, by what the command answers (``Command[R]``).
REPLIES: Mapping[Any, Codec[Any] | tuple[Answer, Result]] = {
    Attempt: ATTEMPT,
    ApprovalRequest | None: (_approval_response, _approval),
    ProgressAck: PROGRESS_ACK,
    ToolCallClaim: TOOL_CALL,
    RateConsumed: RATE_CONSUMED,
    RecordedCall: RECORDED_CALL,
    OutputAck: OUTPUT_ACK,
}

# The lease RPC carries two commands; every other worker command's row is its declaration's.
_LEASE_COMMANDS = (AcquireLease, RenewLease)

_ROWS: tuple[Rpc, ...] = (
    # Claim the next attempt (a long-poll, no command), or acquire / renew one attempt's lease.
    Rpc(
        "AcquireLease",
        *_messages("AcquireLease"),
        RUNTIME,
        commands=_LEASE_COMMANDS,
        to_request=_lease_request,
        result=lambda response: LEASE.decode(response.lease),
    ),
    *(
        command_rpc(d.rpc, d.command, d.answers)
        for d in DECLARATIONS.values()
        if d.rpc is not None and d.command not in _LEASE_COMMANDS
    ),
    Rpc("WatchRun", *_messages("WatchRun"), RUNS_READ, stream=True),
    # A worker session's exchange with one run host (``rpc.exchange``, DESIGN 10): the
    # commands above travel in it as their own requests.
    Rpc("Exchange", *_messages("Exchange"), RUNTIME),
    # Not a worker's call: input from outside for a signal step (the roles that submit).
    outside_rpc(
        "SendSignal", SendSignal, _send_signal, SIGNAL, from_caller=("tenant_id", "sent_by")
    ),
)
_ORDER = {m.name: i for i, m in enumerate(_SERVICE.methods)}
RPCS: tuple[Rpc, ...] = tuple(sorted(_ROWS, key=lambda r: _ORDER.get(r.method, len(_ORDER))))

BY_COMMAND: Mapping[type[Command[Any]], Rpc] = {c: r for r in RPCS for c in r.commands}


def _check_service() -> None:
    """Every method of the proto's service has one row, streaming as the proto says."""
    rows = {r.method: r for r in RPCS}
    for d in DECLARATIONS.values():
        if d.rpc is not None and d.command not in rows[d.rpc].commands:
            raise TypeError(f"RPCS {d.rpc} does not carry {d.command.__name__}")
    if sorted(rows) != sorted(_SERVICE.methods_by_name) or len(rows) != len(RPCS):
        raise TypeError(f"RPCS {sorted(rows)} != RunControl {sorted(_SERVICE.methods_by_name)}")
    for m in _SERVICE.methods:
        if rows[m.name].stream != m.server_streaming:
            raise TypeError(f"RPCS {m.name}: streaming is {m.server_streaming}")


_check_service()


# ---------------------------------------------------------------------- events


# A committed event as the read model (``store.queries.event_view``) and the HTTP history have
# it: camelCase keys of Event's fields, ``type`` for event_type, ids and times as text.
def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


_VIEW_KEY = {attr: "type" if attr == "event_type" else _camel(attr) for attr, _ in EVENT.fields}


def event_message(view: Mapping[str, Any]) -> pb.RunEvent:
    message: pb.RunEvent = EVENT.encode_values(
        {attr: view.get(key) for attr, key in _VIEW_KEY.items()}, {}
    )
    return message


def event_view(message: pb.RunEvent) -> dict[str, Any]:
    """A RunEvent as the envelope the HTTP history answers with."""
    event = EVENT.decode(message)
    found: dict[str, Any] = {}
    for attr, key in _VIEW_KEY.items():
        value = getattr(event, attr)
        if isinstance(value, UUID):
            value = str(value)
        elif hasattr(value, "isoformat"):
            value = value.isoformat()
        found[key] = value
    return found


def lease_message(grant: LeaseGrant, tenant_id: str, input: Any = None) -> pb.Lease:
    message: pb.Lease = LEASE.encode(grant, tenant_id=tenant_id, input_json=json_text(input))
    return message
