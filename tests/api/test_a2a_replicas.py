"""No second copy of a task's state (issue 31): a task created through one Serve app is read,
streamed and cancelled through another (its own replica, the same database), with the card of
each naming its own URLs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from a2a.client import Client
from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest, SubscribeToTaskRequest, TaskState
from a2a_harness import BINDINGS, fetch_card, publish_agent, run, send, text_message, with_client
from api_harness import Api, TenantView, app_on

S = TaskState


@pytest.fixture(scope="module")
def other_replica(
    api: Api, ray_runtime: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("a2a")
    with app_on(api, ray_runtime, "a2a-other", directory, ray_runtime.owner_url) as base:
        yield base


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_task_made_on_one_replica_is_read_streamed_and_cancelled_on_another(
    t: TenantView, other_replica: str, binding: str
) -> None:
    publish_agent(t, signal=True)
    token = t.token()
    card = run(fetch_card(t, token, base=other_replica))
    assert all(i.url.startswith(f"{other_replica}/a2a/") for i in card.supported_interfaces)

    async def start(client: Client) -> Any:
        return await send(client, text_message("from replica one"))

    task = run(with_client(t, token, binding, start))  # the session's app
    assert task.status.state == S.TASK_STATE_INPUT_REQUIRED

    async def elsewhere(client: Client) -> tuple[Any, Any, Any]:
        got = await client.get_task(GetTaskRequest(id=task.id))
        stream = client.subscribe(SubscribeToTaskRequest(id=task.id))
        first = await anext(stream)
        await stream.aclose()  # type: ignore[attr-defined]
        cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
        return got, first, cancelled

    got, first, cancelled = run(
        with_client(t, token, binding, elsewhere, streaming=True, base=other_replica)
    )
    assert got.status.state == S.TASK_STATE_INPUT_REQUIRED
    assert first.task.id == task.id
    # a signal step holds no attempt: the cancel settles at once
    t.wait_state(task.id, "Cancelled")

    async def get(client: Client) -> Any:
        return await client.get_task(GetTaskRequest(id=task.id))

    assert run(with_client(t, token, binding, get)).status.state == S.TASK_STATE_CANCELED
    assert cancelled.id == task.id
