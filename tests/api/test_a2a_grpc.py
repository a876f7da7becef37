"""The A2A gRPC binding (issue 31, docs/a2a.md): a2a-sdk's own client over gRPC, through Serve's
gRPC ingress, against the session's app: the card's gRPC interface names the agent in its
``tenant``; a message starts a run and asks at its signal step, the task is read, streamed,
answered and cancelled; push configs; another tenant's token and an unknown agent are not
found, a missing token is refused."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import httpx
import pytest
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetExtendedAgentCardRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import A2AError, InvalidParamsError, TaskNotFoundError
from a2a_harness import agent_url, data_message, publish_agent, run, send, text_message
from api_harness import TenantView, new_tenant

from runcontrol.rpc.exchange import SERVE_APPLICATION

S = TaskState
T = TypeVar("T")
EVENT_WAIT_S = 30.0


def call_details(details: Any, pairs: list[tuple[str, str]]) -> Any:
    metadata = grpc.aio.Metadata(*(details.metadata or ()), *pairs)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


# One class per kind: grpc.aio files an interceptor under the first kind it is.
class UnaryMetadata(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Adds the bearer token (and Serve's application, needed while other apps run beside
    the session's) to every unary call."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(call_details(details, self.pairs), request)


class StreamMetadata(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """The same for every server stream."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(call_details(details, self.pairs), request)


async def over_grpc(
    t: TenantView,
    token: str | None,
    use: Callable[[Client], Awaitable[T]],
    *,
    card_token: str,
    streaming: bool = False,
) -> T:
    """``use`` with a2a-sdk's client over gRPC, the card fetched with ``card_token``."""
    pairs = [("application", SERVE_APPLICATION)]
    if token is not None:
        pairs.append(("authorization", f"Bearer {token}"))

    def channel(url: str) -> Any:
        return grpc.aio.insecure_channel(
            url, interceptors=[UnaryMetadata(pairs), StreamMetadata(pairs)]
        )

    headers = {"Authorization": f"Bearer {card_token}"}
    async with httpx.AsyncClient(headers=headers, timeout=60.0) as http:
        config = ClientConfig(
            httpx_client=http,
            grpc_channel_factory=channel,
            supported_protocol_bindings=["GRPC"],
            streaming=streaming,  # False: SendMessage (blocking); True: the streams too
        )
        client = await ClientFactory(config).create_from_url(agent_url(t))
        try:
            return await use(client)
        finally:
            await client.close()


def test_a2a_over_grpc_reads_streams_answers_and_cancels_a_task(t: TenantView, api: Any) -> None:
    publish_agent(t, signal=True)
    token = t.token()

    async def start(client: Client) -> Any:
        return await send(client, text_message("over gRPC"))

    async def read(client: Client) -> dict[str, Any]:
        found: dict[str, Any] = {"task": task}
        found["got"] = await client.get_task(GetTaskRequest(id=task.id))
        stream = client.subscribe(SubscribeToTaskRequest(id=task.id))
        try:
            found["first"] = await asyncio.wait_for(anext(stream), EVENT_WAIT_S)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        found["card"] = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
        with pytest.raises(InvalidParamsError):  # an unknown status, not the whole list
            await client.list_tasks(ListTasksRequest(status=99))  # type: ignore[arg-type]
        config = TaskPushNotificationConfig(
            task_id=task.id, id="g", url="http://127.0.0.1:9/hook", token="tok"
        )
        await client.create_task_push_notification_config(config)
        found["configs"] = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task.id)
        )
        return found

    async def answer_and_cancel(client: Client) -> dict[str, Any]:
        return {
            "answered": await send(
                client, data_message({"ticket": 3}, task_id=task.id), immediately=True
            ),
            "cancelled": await client.cancel_task(CancelTaskRequest(id=task.id)),
        }

    task = run(over_grpc(t, token, start, card_token=token))
    found = run(over_grpc(t, token, read, card_token=token, streaming=True))
    found.update(run(over_grpc(t, token, answer_and_cancel, card_token=token)))
    assert task.status.state == S.TASK_STATE_INPUT_REQUIRED
    assert found["got"].id == task.id
    assert found["got"].status.state == S.TASK_STATE_INPUT_REQUIRED
    assert found["first"].task.id == task.id
    assert [i.protocol_binding for i in found["card"].supported_interfaces] == ["GRPC"]
    assert [c.id for c in found["configs"].configs] == ["g"]
    assert found["answered"].id == task.id
    assert found["cancelled"].id == task.id
    t.wait_state(task.id, "Cancelled")

    async def get(client: Client) -> Any:
        return await client.get_task(GetTaskRequest(id=task.id))

    assert run(over_grpc(t, token, get, card_token=token)).status.state == S.TASK_STATE_CANCELED

    # Another tenant's token (its own agent of the same workflow id): the card its client
    # reads names its own tenant, and this tenant's task is not found over gRPC either.
    other = TenantView(api, t.runtime, new_tenant())
    try:
        other.workflow = t.workflow
        publish_agent(other)
        with pytest.raises(TaskNotFoundError):
            run(over_grpc(other, other.token(), get, card_token=other.token()))
        # Its token with this tenant's card (this tenant's agent in the request): not found.
        with pytest.raises(A2AError):
            run(over_grpc(t, other.token(), get, card_token=token))
    finally:
        other.close()

    # A stream's refusal: the status code and message (Serve ends a stream with a raised
    # error's, not its trailers), which the SDK's client raises as its error.
    async def subscribe_unknown(client: Client) -> Any:
        stream = client.subscribe(SubscribeToTaskRequest(id=str(uuid.uuid4())))
        try:
            return await asyncio.wait_for(anext(stream), EVENT_WAIT_S)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    with pytest.raises(A2AError, match="NOT_FOUND"):
        run(over_grpc(t, token, subscribe_unknown, card_token=token, streaming=True))
    # No token on the gRPC call: refused before anything is read.
    with pytest.raises(A2AError):
        run(over_grpc(t, None, get, card_token=token))
