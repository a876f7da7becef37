"""The A2A gRPC binding (``lf.a2a.v1.A2AService``) on Serve's gRPC ingress: a2a-sdk's own
servicer (``GrpcHandler``) over the same ``RunTaskHandler`` the HTTP bindings use, so the
protocol (its request mapping, its error statuses) is the SDK's and the rules are the run's.

Two things Serve's gRPC ingress lacks, made up here:

- **The agent.** gRPC has no path: the agent travels in A2A's own routing field, ``tenant``,
  as ``{tenantId}/{workflowId}``, which the card's gRPC interface names (a2a-sdk's client
  sets it on every request from the interface). The tenant in it must be the token's (another
  is as unknown as its agents: ``NOT_FOUND``); the handler then sees the token's tenant as the
  request's, as over HTTP.
- **abort.** Serve hands each call a ``RayServegRPCContext``, which sets a status but has no
  ``abort``; ``GrpcHandler`` reports every A2A error with ``await context.abort(...)``.
  ``ServeCallContext.abort`` sets the code, message and the rich status trailer
  (``grpc-status-details-bin``: the SDK's client maps it back to the A2A error) and lets the
  handler return its empty answer; in a stream it raises ``StreamRefused`` after setting them
  (Serve ends a stream with the code and message of a raised error, not its trailers: the
  client sees the status code and message only).

Before the SDK sees a call the door verifies the bearer token (``authorization`` metadata),
checks the caller may read runs and finds the agent, as the HTTP door does; a refusal is the
runcontrol gRPC status (``rpc.status``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.grpc_handler import GrpcHandler, GrpcServerCallContextBuilder
from a2a.types import a2a_pb2
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from ..api.context import Services
from ..domain import errors
from ..domain.access import Operation
from ..edge.auth import Caller, TokenVerifier, permit
from ..edge.metering import TenantRateLimiter
from ..rpc.service import StreamRefused, bearer_token, refuse
from .cards import Agent
from .handler import RunTaskHandler
from .routes import find_agent

SERVICE_NAME = "lf.a2a.v1.A2AService"
SERVICER_FUNCTION = "a2a.types.a2a_pb2_grpc.add_A2AServiceServicer_to_server"
_SERVICE = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"]
# Each method of the service: whether it streams (Serve calls a generator for a stream).
METHODS: dict[str, bool] = {m.name: m.server_streaming for m in _SERVICE.methods}


class ServeCallContext:
    """Serve's call context as the SDK's servicer uses a ``grpc.aio.ServicerContext``: the
    same, plus ``abort`` (above) and the door's findings (``caller``, ``agent``)."""

    def __init__(self, inner: Any, caller: Caller, agent: Agent, *, streaming: bool) -> None:
        self.inner = inner
        self.caller = caller
        self.agent = agent
        self.streaming = streaming

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def set_trailing_metadata(self, trailing_metadata: Any) -> None:
        self.inner.set_trailing_metadata(list(trailing_metadata))  # Serve's adds to a list

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing: Any = ()) -> None:
        self.inner.set_code(code)
        self.inner.set_details(details)
        if trailing:
            self.set_trailing_metadata([*(self.inner.trailing_metadata() or ()), *trailing])
        if self.streaming:
            raise StreamRefused(details)


class _ContextBuilder(GrpcServerCallContextBuilder):
    """The SDK's call context with what ``RunTaskHandler`` reads: the caller, the agent, the
    metadata as headers (``Last-Event-ID`` resumes a stream: ``last-event-id``)."""

    def build(self, context: Any) -> ServerCallContext:
        assert isinstance(context, ServeCallContext)
        headers = {
            str(k).lower(): v.decode() if isinstance(v, bytes) else str(v)
            for k, v in context.invocation_metadata() or ()
        }
        state = {"caller": context.caller, "agent": context.agent, "agent_url": None}
        return ServerCallContext(state={**state, "headers": headers})


@dataclass
class A2aGrpc:
    """The binding's calls: ``call`` for a unary method, ``stream`` for a streaming one."""

    svc: Services
    verifier: TokenVerifier
    rate_limiter: TenantRateLimiter

    def __post_init__(self) -> None:
        self.servicer = GrpcHandler(RunTaskHandler(self.svc, self.rate_limiter), _ContextBuilder())

    async def _enter(self, method: str, request: Any, context: Any) -> ServeCallContext:
        """The caller (its token) and the agent (the request's ``tenant``); the request's
        tenant becomes the token's, which the handler checks as over HTTP."""
        caller = await self.verifier.verify_async(bearer_token(context))
        permit(caller, Operation.READ_RUNS)
        tenant_id, _, workflow_id = str(request.tenant).partition("/")
        if not workflow_id:
            raise errors.WorkflowNotFound(
                "name the agent in the request's tenant: {tenantId}/{workflowId}, as the "
                "card's gRPC interface says"
            )
        if tenant_id != caller.tenant_id:
            raise errors.WorkflowNotFound(f"workflow {workflow_id!r} is no agent here")
        agent = await find_agent(self.svc, caller, workflow_id)
        request.tenant = caller.tenant_id
        return ServeCallContext(context, caller, agent, streaming=METHODS[method])

    async def call(self, method: str, request: Any, context: Any) -> Message:
        try:
            entered = await self._enter(method, request, context)
        except errors.RunControlError as exc:
            refuse(context, exc)
            return _empty_answer(method)
        answer: Message = await getattr(self.servicer, method)(request, entered)
        return answer

    async def stream(self, method: str, request: Any, context: Any) -> AsyncIterator[Message]:
        try:
            entered = await self._enter(method, request, context)
        except errors.RunControlError as exc:
            refuse(context, exc)
            raise StreamRefused(str(exc)) from None
        async for message in getattr(self.servicer, method)(request, entered):
            yield message


def _empty_answer(method: str) -> Message:
    answer: Message = GetMessageClass(_SERVICE.methods_by_name[method].output_type)()
    return answer
