"""Call the demo workflow of ``make run`` as an A2A agent with a2a-sdk's own client
(docs/a2a.md, "Walk-through").

    RC=http://127.0.0.1:8000 REQUESTER_TOKEN=... REVIEWER_TOKEN=... \
        .venv/bin/python examples/a2a_client/walkthrough.py [JSONRPC|HTTP+JSON|GRPC]

The requester sends a message (a run starts), the run asks for an approval (INPUT_REQUIRED),
the reviewer approves on the task, and the requester follows the task's stream (the steps'
streamed output, status updates) to COMPLETED and its result artifact. Over gRPC the card's
gRPC interface names the agent in its ``tenant`` (the client sets it on each call), and the
token travels as ``authorization`` metadata.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from typing import Any

import grpc
import httpx
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value

AGENT = f"{os.environ.get('RC', 'http://127.0.0.1:8000')}/a2a/demo-review"


def with_token(details: Any, token: str) -> Any:
    metadata = grpc.aio.Metadata(*(details.metadata or ()), ("authorization", f"Bearer {token}"))
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


# The token as ``authorization`` metadata on every gRPC call; one class per kind of call
# (grpc.aio files an interceptor under the first kind it is).
class UnaryBearer(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(with_token(details, self.token), request)


class StreamBearer(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(with_token(details, self.token), request)


async def client_for(http: httpx.AsyncClient, binding: str, streaming: bool) -> Client:
    token = http.headers["Authorization"].removeprefix("Bearer ")

    def channel(url: str) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(
            url, interceptors=[UnaryBearer(token), StreamBearer(token)]
        )

    config = ClientConfig(
        httpx_client=http,
        streaming=streaming,
        supported_protocol_bindings=[binding],
        grpc_channel_factory=channel,
    )
    return await ClientFactory(config).create_from_url(AGENT)  # GET the card, pick the binding


def http_for(token: str) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0"}
    return httpx.AsyncClient(headers=headers, timeout=60.0)


async def send(client: Client, message: Message, immediately: bool = False) -> Any:
    request = SendMessageRequest(message=message)
    request.configuration.return_immediately = immediately
    async for event in client.send_message(request):
        last = event
    return last.task


async def main(binding: str) -> None:
    async with http_for(os.environ["REQUESTER_TOKEN"]) as http:
        requester = await client_for(http, binding, streaming=False)
        print("card:", requester._card.name, [i.url for i in requester._card.supported_interfaces])
        data = ParseDict({"repository": "example/repo", "revision": "a1b2c3d"}, Value())
        start = Message(
            message_id=f"walkthrough-{uuid.uuid4().hex}",  # the idempotency key
            role=Role.ROLE_USER,
            parts=[Part(text="review this change"), Part(data=data)],
        )
        task = await send(requester, start)  # blocks until it asks for something or ends
        print("task", task.id, TaskState.Name(task.status.state))
        ask = MessageToDict(task.status.message.parts[1].data)
        print("it asks:", ask)

    async with http_for(os.environ["REVIEWER_TOKEN"]) as http:
        reviewer = await client_for(http, binding, streaming=False)
        decision = {"decision": "approve", "proposalHash": ask["proposalHash"]}
        reply = Message(
            message_id=f"decision-{uuid.uuid4().hex}",
            task_id=task.id,
            role=Role.ROLE_USER,
            parts=[Part(data=ParseDict(decision, Value()))],
        )
        decided = await send(reviewer, reply, immediately=True)
        print("after the decision:", TaskState.Name(decided.status.state))

    async with http_for(os.environ["REQUESTER_TOKEN"]) as http:
        follower = await client_for(http, binding, streaming=True)
        async for event in follower.subscribe(SubscribeToTaskRequest(id=task.id)):
            kind = event.WhichOneof("payload")
            if kind == "status_update":
                seqs = MessageToDict(event.status_update.metadata)["runcontrol"]["events"]
                state = TaskState.Name(event.status_update.status.state)
                print("status", state, "after events", [int(e["seq"]) for e in seqs])
            elif kind == "artifact_update":
                update = event.artifact_update
                parts = [
                    MessageToDict(p).get("text", MessageToDict(p).get("data"))
                    for p in update.artifact.parts
                ]
                print("artifact", update.artifact.name, parts or "(closed)")
            else:
                print(kind)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "JSONRPC"))
