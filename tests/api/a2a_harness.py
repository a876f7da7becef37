"""A2A tests' harness: a tenant's workflow published as an agent, and a2a-sdk's own client
(over JSON-RPC or HTTP+JSON) against the session's real Serve app."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
from a2a.client import ClientCallContext, ClientConfig, ClientFactory
from a2a.client.client import Client
from a2a.types.a2a_pb2 import (
    AgentCard,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
)
from a2a.utils.constants import TransportProtocol
from api_harness import TenantView
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Value

from runcontrol.commands import ReportOutcome
from runcontrol.domain import AttemptOutcome, WorkflowDefinition, canonical_hash

T = TypeVar("T")
BINDINGS = (TransportProtocol.JSONRPC.value, TransportProtocol.HTTP_JSON.value)
RESULT = {"verdict": "ship it", "score": 7}


def agent_block(**overrides: Any) -> dict[str, Any]:
    block: dict[str, Any] = {
        "name": "Review agent",
        "description": "Reviews a change; asks for details, then for a reviewer's approval.",
        "skills": [{"id": "review", "name": "Review", "description": "Review a change."}],
        "input": {"text": "question", "data": "merge", "required": ["question"]},
        "modelProfileId": "code-agent",
    }
    block.update(overrides)
    return block


def publish_agent(t: TenantView, *, signal: bool = True, gate: str = "approval") -> str:
    """The tenant's workflow as an agent: a signal step ``details`` (if ``signal``), then an
    agent step of ``t.agent`` behind ``gate``."""
    steps: list[dict[str, Any]] = []
    if signal:
        steps.append({"name": "ask", "kind": "signal", "signal": "details"})
    steps.append({"name": "work", "agentId": t.agent, "gate": gate, "sideEffectClass": "read"})
    definition = WorkflowDefinition.from_dict(
        {"workflowId": t.workflow, "steps": steps, "agent": agent_block()}
    )
    t.runtime.container.releases.publish(
        t.tenant, definition, "publisher", datetime.now(UTC), ("latest",)
    )
    return t.workflow


def agent_url(t: TenantView, base: str | None = None) -> str:
    """The agent's URL on the session's app, or on the app at ``base``."""
    return f"{base or t.api.base_url}/a2a/{t.workflow}"


def text_message(text: str, **fields: Any) -> Message:
    return Message(
        message_id=f"m-{uuid.uuid4().hex}", role=Role.ROLE_USER, parts=[Part(text=text)], **fields
    )


def data_message(data: Any, **fields: Any) -> Message:
    return Message(
        message_id=f"m-{uuid.uuid4().hex}",
        role=Role.ROLE_USER,
        parts=[Part(data=ParseDict(data, Value()))],
        **fields,
    )


CALL_TIMEOUT_S = 90.0


def run(coro: Awaitable[T]) -> T:
    """``coro`` to its end, bounded: an SSE stream is kept alive by the server's pings
    (sse-starlette's, every 15 s), so a stream that never ends would never meet the client's
    read timeout; a call that hangs fails the test instead."""
    return asyncio.run(asyncio.wait_for(coro, CALL_TIMEOUT_S))


async def with_client(
    t: TenantView,
    token: str,
    binding: str,
    use: Callable[[Client], Awaitable[T]],
    *,
    streaming: bool = False,
    base: str | None = None,
) -> T:
    """``use`` with a2a-sdk's client for the agent's card (on the app at ``base``), over
    ``binding``."""
    headers = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0"}
    async with httpx.AsyncClient(headers=headers, timeout=60.0) as http:
        config = ClientConfig(
            httpx_client=http, streaming=streaming, supported_protocol_bindings=[binding]
        )
        client = await ClientFactory(config).create_from_url(agent_url(t, base))
        try:
            return await use(client)
        finally:
            await client.close()


async def fetch_card(t: TenantView, token: str, base: str | None = None) -> AgentCard:
    async def card(client: Client) -> AgentCard:
        return client._card  # type: ignore[attr-defined,no-any-return]

    return await with_client(t, token, BINDINGS[0], card, base=base)


async def send(client: Client, message: Message, *, immediately: bool = False) -> Any:
    request = SendMessageRequest(message=message)
    request.configuration.return_immediately = immediately
    last: StreamResponse | None = None
    async for event in client.send_message(request):
        last = event
    assert last is not None and last.HasField("task"), last
    return last.task


def resume_from(cursor: int | str) -> ClientCallContext:
    """A call context that resumes a stream after ``cursor``: a run event seq, or a stream
    cursor (``metadata.runcontrol.cursor``)."""
    return ClientCallContext(service_parameters={"Last-Event-ID": str(cursor)})


def succeed_with_result(t: TenantView, run_id: str) -> None:
    claim = t.claim(run_id)
    t._call(
        t.runtime.client.send(
            ReportOutcome(
                **claim.fenced(),
                outcome=AttemptOutcome.SUCCEEDED,
                result=RESULT,
                outcome_hash=canonical_hash(RESULT),
            )
        )
    )
