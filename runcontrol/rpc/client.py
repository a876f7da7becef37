"""``GrpcWorkerClient``: the unary RPCs of ``runcontrol.v1.RunControl``, one call per command.

A worker does not use this client: the worker SDK (``runcontrol.sdk``, ``runcontrol worker
--transport grpc``) keeps one session per run host over ``Exchange``
(``rpc.exchange.GrpcSessionTransport``, ``runcontrol.workers.protocol``): its free slots go up as
credits, the host pushes grants with the run's input and the dependencies' results, and
reports, renewals, progress and tool calls travel batched in the same exchanges, cancels down
them. This client is for a caller that wants the spec's unary surface: a tool, an operator's
script, a language without a session client yet (``docs/workers.md`` walks through the same
calls with ``grpcurl``), and the bench's figure of the old claim path (``claim`` is
``AcquireLease`` with ``claim_next``, a long poll per claim).

Identity is the token's: every call carries it in the ``authorization`` metadata, and the
server makes the lease holder from its subject and this client's ``instance_id`` (the
``holder`` a command names is the server's answer, sent back as it came). A refusal arrives
as the typed error it stands for (``status.error_from_rpc``); a call whose outcome is unknown
(no connection, deadline) as ``errors.Unavailable``: resend the same command, and its
``command_id`` gets the stored answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, TypeVar, cast
from uuid import UUID

import grpc

from schemas import runcontrol_pb2 as pb
from schemas import runcontrol_pb2_grpc as pb_grpc

from ..client import Claim
from ..commands import Command
from ..domain import WorkerIdentity, errors
from ..telemetry import current_carrier
from .codec import json_object
from .status import error_from_rpc
from .table import BY_COMMAND, LEASE, event_view

R = TypeVar("R")

CALL_TIMEOUT_S = 30.0
CLAIM_MARGIN_S = 10.0  # a claim's deadline: its long-poll plus this


class GrpcWorkerClient:
    def __init__(
        self,
        target: str,
        token: str,
        instance_id: str,
        *,
        call_timeout_s: float = CALL_TIMEOUT_S,
        options: list[tuple[str, Any]] | None = None,
    ) -> None:
        self.target = target
        self.instance_id = instance_id
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._timeout = call_timeout_s
        self._channel = grpc.aio.insecure_channel(target, options=options)
        self._stub = pb_grpc.RunControlStub(self._channel)  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> GrpcWorkerClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _unary(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        # tracing on: the worker's current span becomes the parent of the RPC's server span
        metadata = self._metadata + tuple((current_carrier() or {}).items())
        try:
            return await method(request, metadata=metadata, timeout=timeout or self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None

    # ------------------------------------------------------------------ commands

    async def send(self, command: Command[R]) -> R:
        """A worker command as its RPC (``table.RPCS``); answers what the in-cluster client
        would."""
        rpc = BY_COMMAND.get(type(command))
        if rpc is None or rpc.to_request is None or rpc.result is None:
            names = ", ".join(c.__name__ for c in BY_COMMAND)
            raise errors.ValidationFailed(
                f"{type(command).__name__} is not a worker command (the gRPC surface takes {names})"
            )
        request = rpc.to_request(command, self.instance_id)
        response = await self._unary(getattr(self._stub, rpc.method), request)
        return cast(R, rpc.result(response))

    # ------------------------------------------------------------------ claims and events

    async def claim(
        self,
        agent_ids: list[str],
        holder: str | WorkerIdentity = "",
        timeout_s: float = 30.0,
        *,
        claim_id: str | None = None,
    ) -> Claim | None:
        """Long-poll for the next dispatched attempt of these agents in the token's tenant.
        ``holder`` is not sent: the server makes it from the token and ``instance_id``.
        ``claim_id`` travels as the request's ``command_id``: a resend gets the first grant."""
        response = await self._unary(
            self._stub.AcquireLease,
            pb.AcquireLeaseRequest(
                worker_instance_id=self.instance_id,
                claim_next=pb.ClaimNext(agent_ids=list(agent_ids), wait_seconds=timeout_s),
                command_id=claim_id or "",
            ),
            timeout=timeout_s + CLAIM_MARGIN_S,
        )
        if not response.granted:
            return None
        lease = response.lease
        return Claim(
            LEASE.decode(lease),
            lease.tenant_id,
            json_object(lease.input_json),
            json_object(response.results_json) or {},
        )

    async def watch(
        self, tenant_id: str, run_id: UUID, after_seq: int = 0, *, wait_s: float = 20.0
    ) -> AsyncIterator[dict[str, Any]]:
        """The run's events after ``after_seq`` in seq order, ending after a terminal event
        (``tenant_id`` is the token's; ``wait_s`` is the server's business here)."""
        call = self._stub.WatchRun(
            pb.WatchRunRequest(run_id=str(run_id), after_seq=after_seq), metadata=self._metadata
        )
        try:
            async for message in call:
                yield event_view(message)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        finally:
            call.cancel()
