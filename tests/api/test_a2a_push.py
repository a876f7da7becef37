"""A2A push notifications (issue 31): a task's push config, stored in PostgreSQL and delivered
by the session's real scheduler (its outbox relay and WebhookDelivery job, the webhooks'
retries) to a real local HTTP receiver, as A2A's StreamResponse JSON with the config's token
and authentication headers; the config CRUD through a2a-sdk's client over both bindings; its
owner alone reads and deletes it, another tenant sees TaskNotFound."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from a2a.client import Client
from a2a.types.a2a_pb2 import (
    AuthenticationInfo,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    SendMessageRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from a2a_harness import (
    BINDINGS,
    data_message,
    fetch_card,
    publish_agent,
    run,
    send,
    text_message,
    with_client,
)
from api_harness import REVIEWER, TenantView, new_tenant, wait_until
from webhook_receiver import Receiver

from runcontrol.a2a.notify import TOKEN_HEADER
from runcontrol.domain import Role

S = TaskState


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as opened:
        yield opened


def push_config(url: str, config_id: str = "cfg-1", token: str = "tok-1") -> Any:
    return TaskPushNotificationConfig(
        id=config_id,
        url=url,
        token=token,
        authentication=AuthenticationInfo(scheme="Bearer", credentials="receiver-secret"),
    )


def states(received: list[Any]) -> list[str]:
    """The task state each acknowledged notification carried, in arrival order."""
    found = []
    for r in received:
        if r.status != 200:
            continue
        body = json.loads(r.body)
        update = body.get("statusUpdate") or body.get("task")
        found.append(update["status"]["state"])
    return found


def test_a_task_pushes_its_status_changes_with_the_token_after_a_retry(
    t: TenantView, receiver: Receiver
) -> None:
    publish_agent(t, signal=True)
    card = run(fetch_card(t, t.token()))
    assert card.capabilities.push_notifications
    path = f"/a2a-{uuid.uuid4().hex[:8]}"
    url = receiver.url(path, "flaky:1")  # the first delivery fails: retried as a webhook is

    async def start(client: Client) -> Any:
        request = SendMessageRequest(message=text_message("push me"))
        request.configuration.task_push_notification_config.CopyFrom(push_config(url))
        last = None
        async for event in client.send_message(request):
            last = event
        assert last is not None
        return last.task

    async def unwatched(client: Client) -> Any:
        return await send(client, text_message("no config"), immediately=True)

    task = run(with_client(t, t.token(), BINDINGS[0], start))
    assert task.status.state == S.TASK_STATE_INPUT_REQUIRED  # the signal step asks
    other = run(with_client(t, t.token(), BINDINGS[0], unwatched))  # same tenant, no config

    wait_until(lambda: "TASK_STATE_INPUT_REQUIRED" in states(receiver.at(path)), timeout=30)
    first = receiver.at(path)[0]
    assert first.status == 500
    retried = [r for r in receiver.at(path) if r.event_id == first.event_id and r.status == 200]
    assert retried and retried[0].attempt == 2

    # The signal answered, the task cancelled: it ends CANCELED (no attempt in flight).
    async def answer_then_cancel(client: Client) -> Any:
        await send(client, data_message({"ticket": 7}, task_id=task.id), immediately=True)
        return await client.cancel_task(CancelTaskRequest(id=task.id))

    run(with_client(t, t.token(), BINDINGS[0], answer_then_cancel))
    t.wait_state(task.id, "Cancelled")
    wait_until(lambda: "TASK_STATE_CANCELED" in states(receiver.at(path)), timeout=30)

    got = [r for r in receiver.at(path) if r.status == 200]
    seen = states(got)
    assert seen.index("TASK_STATE_INPUT_REQUIRED") < seen.index("TASK_STATE_CANCELED")
    for r in got:
        body = json.loads(r.body)
        assert (body.get("statusUpdate") or {}).get("taskId", task.id) == task.id, other.id
        assert (body.get("task") or {}).get("id", task.id) == task.id
        assert r.headers[TOKEN_HEADER] == "tok-1"
        assert r.headers["Authorization"] == "Bearer receiver-secret"
        assert r.headers["Content-Type"] == "application/json"
    asks = [
        json.loads(r.body)["statusUpdate"]["status"]["message"]["parts"][1]["data"]
        for r in got
        if json.loads(r.body).get("statusUpdate", {}).get("status", {}).get("state")
        == "TASK_STATE_INPUT_REQUIRED"
    ]
    assert {a["kind"] for a in asks} >= {"signal"}
    ended = json.loads(got[-1].body)
    assert ended["task"]["id"] == task.id and ended["task"]["status"]["state"] == (
        "TASK_STATE_CANCELED"
    )
    # Each notification is one event's, once acknowledged (receivers deduplicate on its id).
    acknowledged = [r.event_id for r in got]
    assert len(acknowledged) == len(set(acknowledged))


@pytest.mark.parametrize("binding", BINDINGS)
def test_push_configs_are_the_owners_and_another_tenant_sees_none(
    t: TenantView, receiver: Receiver, binding: str, api: Any
) -> None:
    publish_agent(t, signal=True)
    owner = t.token()
    url = receiver.url(f"/crud-{uuid.uuid4().hex[:8]}")

    async def start(client: Client) -> Any:
        return await send(client, text_message("configs"), immediately=True)

    task = run(with_client(t, owner, binding, start))

    def config(config_id: str, target: str = url) -> Any:
        found = push_config(target, config_id)
        found.task_id = task.id
        return found

    async def create_and_read(client: Client) -> tuple[Any, Any, Any]:
        made = await client.create_task_push_notification_config(config("a"))
        await client.create_task_push_notification_config(config("b"))
        # the same id again replaces it (its token now)
        again = config("a")
        again.token = "tok-2"
        await client.create_task_push_notification_config(again)
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task.id, id="a")
        )
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task.id)
        )
        return made, got, listed

    made, got, listed = run(with_client(t, owner, binding, create_and_read))
    assert (made.id, made.task_id, made.url, made.token) == ("a", task.id, url, "tok-1")
    assert made.authentication.scheme == "Bearer"
    assert (got.id, got.token) == ("a", "tok-2")
    assert sorted(c.id for c in listed.configs) == ["a", "b"]

    # Not http(s), or a URL with credentials: the A2A InvalidParams, nothing stored.
    for bad in ("ftp://127.0.0.1/x", "file:///etc/passwd", "http://user:pw@127.0.0.1/x"):
        with pytest.raises(InvalidParamsError):
            run(
                with_client(
                    t,
                    owner,
                    binding,
                    lambda c, bad=bad: c.create_task_push_notification_config(config("z", bad)),
                )
            )
    header_smuggle = config("h")
    header_smuggle.token = "x\r\nX-Other: 1"
    with pytest.raises(InvalidParamsError):
        run(
            with_client(
                t, owner, binding, lambda c: c.create_task_push_notification_config(header_smuggle)
            )
        )

    def get_a(c: Client) -> Any:
        return c.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task.id, id="a")
        )

    def list_all(c: Client) -> Any:
        return c.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task.id)
        )

    def delete_a(c: Client) -> Any:
        return c.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="a")
        )

    # Another caller of the tenant (who can read the task) sees none of the owner's configs:
    # their tokens are the owner's.
    colleague = t.token(REVIEWER, Role.REVIEWER)
    assert list(run(with_client(t, colleague, binding, list_all)).configs) == []
    with pytest.raises(TaskNotFoundError):
        run(with_client(t, colleague, binding, get_a))
    run(with_client(t, colleague, binding, delete_a))  # deletes nothing of the owner's

    # Another tenant: the task is not found, for every config call.
    other = TenantView(api, t.runtime, new_tenant())
    try:
        other.workflow = t.workflow
        publish_agent(other)
        token = other.token()
        for call in (
            get_a,
            list_all,
            delete_a,
            lambda c: c.create_task_push_notification_config(config("x")),
        ):
            with pytest.raises(TaskNotFoundError):
                run(with_client(other, token, binding, call))
    finally:
        other.close()

    assert sorted(c.id for c in run(with_client(t, owner, binding, list_all)).configs) == [
        "a",
        "b",
    ]
    run(with_client(t, owner, binding, delete_a))
    assert [c.id for c in run(with_client(t, owner, binding, list_all)).configs] == ["b"]
    with pytest.raises(TaskNotFoundError):
        run(with_client(t, owner, binding, get_a))
