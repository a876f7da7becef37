"""A step's streamed output in A2A streams (issue 31, docs/a2a.md): a2a-sdk's client over
JSON-RPC and HTTP+JSON sees each chunk as a TaskArtifactUpdateEvent of the step's artifact
(append after the first, in order, the step's closing with lastChunk after its last chunk),
and a stream dropped mid-output and resumed from its cursor misses nothing and repeats
nothing, of the output or of the run's events."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from a2a.client import Client
from a2a.types.a2a_pb2 import SendMessageRequest, SubscribeToTaskRequest, TaskState
from a2a_harness import (
    BINDINGS,
    RESULT,
    publish_agent,
    resume_from,
    run,
    succeed_with_result,
    text_message,
    with_client,
)
from api_harness import TenantView
from google.protobuf.json_format import MessageToDict

from runcontrol.commands import AppendOutput
from runcontrol.domain.output import OutputChunk

S = TaskState
EVENT_WAIT_S = 30.0  # one stream event; the SSE pings would keep a hung stream open


def meta(obj: Any) -> dict[str, Any]:
    found: dict[str, Any] = MessageToDict(obj.metadata).get("runcontrol", {})
    return found


def chunk_value(update: Any) -> Any:
    part = update.artifact.parts[0]
    return part.text if part.WhichOneof("content") == "text" else MessageToDict(part.data)


async def next_event(stream: Any) -> Any:
    return await asyncio.wait_for(anext(stream), EVENT_WAIT_S)


@pytest.mark.parametrize("binding", BINDINGS)
def test_output_streams_as_artifact_updates_and_resumes_without_loss_or_repeat(
    t: TenantView, binding: str
) -> None:
    publish_agent(t, signal=False, gate="none")
    token = t.token()
    held: dict[str, Any] = {}

    def write(*chunks: OutputChunk) -> None:
        claim = held["claim"]
        t._call(t.runtime.client.send(AppendOutput(**claim.fenced(), chunks=chunks)))

    def start_work(run_id: str) -> None:
        held["claim"] = t.claim(run_id)
        write(
            OutputChunk(1, text="hello "),
            OutputChunk(2, text="world"),
            OutputChunk(3, data={"k": 1}),
        )

    # SendStreamingMessage: the task, then its output as it is written; dropped after the
    # second chunk.
    async def first(client: Client) -> tuple[Any, list[Any]]:
        stream = client.send_message(SendMessageRequest(message=text_message("stream it")))
        try:
            task = (await next_event(stream)).task
            await asyncio.to_thread(start_work, task.id)
            chunks: list[Any] = []
            seen: list[Any] = []
            while len(chunks) < 2:
                event = await next_event(stream)
                seen.append(event)
                if event.HasField("artifact_update"):
                    chunks.append(event.artifact_update)
            return task, seen
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    task, seen = run(with_client(t, token, binding, first, streaming=True))
    start_seq = int(meta(task)["lastEventSeq"])
    cursor = meta(seen[-1].artifact_update)["cursor"]

    write(OutputChunk(4, text="!"), OutputChunk(5, text=" bye"))
    succeed_with_result(t, task.id)  # the same lease: the claim above is the current one

    async def rest(client: Client) -> list[Any]:
        stream = client.subscribe(SubscribeToTaskRequest(id=task.id), context=resume_from(cursor))
        events: list[Any] = []
        try:
            while True:
                try:
                    events.append(await next_event(stream))
                except StopAsyncIteration:
                    return events
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    resumed = run(with_client(t, token, binding, rest, streaming=True))
    assert resumed[0].HasField("task")
    everything = seen + resumed[1:]
    updates = [e.artifact_update for e in everything if e.HasField("artifact_update")]
    output = [u for u in updates if u.artifact.name.startswith("output:")]
    chunks = [u for u in output if u.artifact.parts]
    assert [chunk_value(u) for u in chunks] == ["hello ", "world", {"k": 1}, "!", " bye"]
    assert [meta(u)["seq"] for u in chunks] == [1, 2, 3, 4, 5], "every chunk once, in order"
    assert [u.append for u in chunks] == [False, True, True, True, True]
    assert {u.artifact.artifact_id for u in output} == {
        f"{task.id}:output:{meta(chunks[0])['stepId']}"
    }
    assert chunks[0].artifact.name == "output:work"
    closing = [u for u in output if not u.artifact.parts]
    assert len(closing) == 1 and closing[0].last_chunk and closing[0].append
    assert output[-1] is closing[0], "the closing comes after the step's last chunk"
    result = [u for u in updates if u.artifact.name == "result"]
    assert [MessageToDict(u.artifact.parts[0].data) for u in result] == [RESULT]
    assert everything[-1].status_update.status.state == S.TASK_STATE_COMPLETED
    # The run's events: each once, in order, across the drop.
    seqs = [
        e["seq"]
        for ev in everything
        if ev.HasField("status_update")
        for e in meta(ev.status_update)["events"]
    ]
    assert seqs == [e["seq"] for e in t.history(task.id) if e["seq"] > start_seq]
