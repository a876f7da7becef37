"""Ray Serve's gRPC ingress: ``runcontrol.v1.RunControl`` and ``grpc.health.v1.Health``.

Serve's gRPC proxy (``grpc_options``) hands each call to the method of the same name on an
application's ingress deployment, and needs an ``application`` metadata entry once more than
one application is deployed. So the RPCs live on the one ingress the HTTP API already has:
``serve_app.RunControlApi`` inherits ``GrpcIngress``, and a worker calls with nothing but its
token. The methods are wiring only, one per row of ``runcontrol.rpc.table.RPCS`` (set below); the
RPCs are ``runcontrol.rpc.service.RunControlRpc``.
Server reflection is Serve's own (``gRPCOptions.enable_reflection``, on by default): it
answers on the proxy itself for every service registered here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from functools import cached_property
from typing import Any

from ray.serve.config import gRPCOptions

from runcontrol.client import RunControlClient
from runcontrol.config import Settings
from runcontrol.drain import Drain
from runcontrol.edge.metering import TenantRateLimiter
from runcontrol.rpc.service import SERVICE_NAME, RunControlRpc
from runcontrol.rpc.table import RPCS, Rpc
from runcontrol.store import Database
from runcontrol.telemetry import rpc_span

HEALTH_SERVICE = "grpc.health.v1.Health"

# Imported by every Serve proxy (the modules must be importable on every node): A2A's with
# a2a-sdk (the ``a2a`` extra) only.
SERVICER_FUNCTIONS = [
    "schemas.runcontrol_pb2_grpc.add_RunControlServicer_to_server",
    "grpc_health.v1.health_pb2_grpc.add_HealthServicer_to_server",
]
try:
    from runcontrol.a2a.grpc_binding import METHODS as A2A_METHODS
    from runcontrol.a2a.grpc_binding import SERVICE_NAME as A2A_SERVICE
    from runcontrol.a2a.grpc_binding import SERVICER_FUNCTION as A2A_SERVICER
except ImportError:
    A2A_METHODS = {}
else:
    SERVICER_FUNCTIONS.append(A2A_SERVICER)


def grpc_options(port: int) -> gRPCOptions:
    return gRPCOptions(
        port=port, grpc_servicer_functions=list(SERVICER_FUNCTIONS), enable_reflection=True
    )


class GrpcIngress:
    """The gRPC methods of the ingress deployment (a mixin: the class provides the client,
    the database, the settings, the replica's drain and tenant command rate, and
    ``ping_hosts``)."""

    client: RunControlClient
    db: Database
    settings: Settings
    edge_drain: Drain
    edge_limiter: TenantRateLimiter

    async def ping_hosts(self) -> None:
        raise NotImplementedError

    @property
    def edge_shared(self) -> dict[str, Any]:
        """What the replica's two doors share: the host probe of their readiness, one drain
        and one tenant command rate (``create_app`` and ``RunControlRpc`` take them)."""
        return {
            "host_probe": self.ping_hosts,
            "drain": self.edge_drain,
            "rate_limiter": self.edge_limiter,
        }

    @cached_property
    def _rpc(self) -> RunControlRpc:
        return RunControlRpc(self.client, self.db, self.settings, **self.edge_shared)

    # grpc.health.v1.Health

    async def Check(self, request: Any, grpc_context: Any) -> Any:
        with rpc_span(HEALTH_SERVICE, "Check", grpc_context):
            return await self._rpc.health_check(request, grpc_context)

    async def List(self, request: Any, grpc_context: Any) -> Any:
        with rpc_span(HEALTH_SERVICE, "List", grpc_context):
            return await self._rpc.health_list(request, grpc_context)

    async def Watch(self, request: Any, grpc_context: Any) -> AsyncIterator[Any]:
        with rpc_span(HEALTH_SERVICE, "Watch", grpc_context, stream=True):
            async for status in self._rpc.health_watch(request, grpc_context):
                yield status


def _method(rpc: Rpc) -> Callable[..., Any]:
    """Serve calls the ingress method named as the RPC; a stream's is an async generator."""
    if rpc.stream:

        async def stream(self: GrpcIngress, request: Any, grpc_context: Any) -> AsyncIterator[Any]:
            with rpc_span(SERVICE_NAME, rpc.method, grpc_context, stream=True):
                async for message in getattr(self._rpc, rpc.attr)(request, grpc_context):
                    yield message

        method: Callable[..., Any] = stream
    else:

        async def unary(self: GrpcIngress, request: Any, grpc_context: Any) -> Any:
            with rpc_span(SERVICE_NAME, rpc.method, grpc_context):
                return await getattr(self._rpc, rpc.attr)(request, grpc_context)

        method = unary
    method.__name__ = method.__qualname__ = rpc.method
    return method


for _rpc in RPCS:
    setattr(GrpcIngress, _rpc.method, _method(_rpc))


def _a2a_method(name: str, streaming: bool) -> Callable[..., Any]:
    """An A2A method (runcontrol.a2a.grpc_binding): the replica's HTTP app built the binding
    over its own services (``app.state.a2a_grpc``), so both doors share its streams."""
    if streaming:

        async def stream(self: Any, request: Any, grpc_context: Any) -> AsyncIterator[Any]:
            with rpc_span(A2A_SERVICE, name, grpc_context, stream=True):
                async for message in self.app.state.a2a_grpc.stream(name, request, grpc_context):
                    yield message

        method: Callable[..., Any] = stream
    else:

        async def unary(self: Any, request: Any, grpc_context: Any) -> Any:
            with rpc_span(A2A_SERVICE, name, grpc_context):
                return await self.app.state.a2a_grpc.call(name, request, grpc_context)

        method = unary
    method.__name__ = method.__qualname__ = name
    return method


for _name, _streaming in A2A_METHODS.items():
    setattr(GrpcIngress, _name, _a2a_method(_name, _streaming))
