"""Runs as A2A tasks (issue 31), through a2a-sdk's own client over JSON-RPC and HTTP+JSON
against the session's real Serve app: the card, a run from a message, INPUT_REQUIRED at a
signal step answered, INPUT_REQUIRED at an approval decided by a second identity (never the
requester), a stream resumed after a reconnect, COMPLETED with the result as the artifact;
cancel observed as CANCELED only once settled; another tenant sees nothing."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from a2a.client import Client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.types.a2a_pb2 import Role as A2ARole
from a2a.utils.errors import (
    A2AError,
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from a2a_harness import (
    BINDINGS,
    RESULT,
    agent_url,
    data_message,
    fetch_card,
    publish_agent,
    resume_from,
    run,
    send,
    succeed_with_result,
    text_message,
    with_client,
)
from api_harness import (
    A2A_RATE_TENANT,
    REQUESTER,
    REVIEWER,
    TenantView,
    api_settings,
    assert_problem,
    new_tenant,
)
from google.protobuf.json_format import MessageToDict

from runcontrol.api import create_app
from runcontrol.config import Settings
from runcontrol.domain import Role

S = TaskState


def meta(obj: Any) -> dict[str, Any]:
    found: dict[str, Any] = MessageToDict(obj.metadata).get("runcontrol", {})
    return found


def test_the_card_names_the_agent_its_bindings_and_the_bearer_scheme(t: TenantView) -> None:
    publish_agent(t)
    card = run(fetch_card(t, t.token()))
    assert card.name == "Review agent"
    assert [s.id for s in card.skills] == ["review"]
    assert {i.protocol_binding for i in card.supported_interfaces} == {*BINDINGS, "GRPC"}
    (grpc_interface,) = [i for i in card.supported_interfaces if i.protocol_binding == "GRPC"]
    assert grpc_interface.tenant == f"{t.tenant}/{t.workflow}"  # gRPC has no path
    assert card.capabilities.push_notifications
    assert card.security_schemes["bearer"].http_auth_security_scheme.bearer_format == "JWT"
    assert card.capabilities.streaming and card.capabilities.extended_agent_card

    async def extended(client: Client) -> Any:
        from a2a.types.a2a_pb2 import GetExtendedAgentCardRequest

        return await client.get_extended_agent_card(GetExtendedAgentCardRequest())

    full = run(with_client(t, t.token(), BINDINGS[0], extended))
    (ext,) = full.capabilities.extensions
    assert MessageToDict(ext.params)["input"]["required"] == ["question"]


def test_a_card_is_404_unknown_unexposed_foreign_or_without_a_token(t: TenantView) -> None:
    publish_agent(t)
    path = f"/a2a/{t.workflow}/.well-known/agent-card.json"
    assert t.requester().get(path).status_code == 200
    with t.api.client() as anonymous:
        assert_problem(anonymous.get(path), 401, "unauthorized")
    t.publish(workflow_id="plain")  # no agent block: no agent
    assert_problem(t.requester().get("/a2a/plain/.well-known/agent-card.json"), 404)
    assert_problem(t.requester().get("/a2a/nope/.well-known/agent-card.json"), 404)
    with t.api.client(t.api.token(new_tenant())) as other:
        assert_problem(other.get(path), 404, "workflow-not-found")
        # every binding of another tenant's agent: the same 404
        assert_problem(other.post(f"/a2a/{t.workflow}/jsonrpc", json={}), 404)
        assert_problem(other.get(f"/a2a/{t.workflow}/rest/tasks"), 404)


def test_the_host_card_is_the_tenants_one_agent_and_404_with_several(t: TenantView) -> None:
    """``/.well-known/agent-card.json`` at the root, where A2A clients look first."""
    own = TenantView(t.api, t.runtime, new_tenant())
    try:
        with own.api.client() as anonymous:
            assert_problem(anonymous.get("/.well-known/agent-card.json"), 401, "unauthorized")
        assert_problem(own.requester().get("/.well-known/agent-card.json"), 404)
        publish_agent(own)
        card = own.requester().get("/.well-known/agent-card.json")
        assert card.status_code == 200, card.text
        found = card.json()["supportedInterfaces"]
        urls = [i["url"] for i in found if i["protocolBinding"] != "GRPC"]
        assert urls and all(f"/a2a/{own.workflow}/" in u for u in urls), urls
        grpc_tenants = [i["tenant"] for i in found if i["protocolBinding"] == "GRPC"]
        assert grpc_tenants == [f"{own.tenant}/{own.workflow}"]  # gRPC names it there
        own.workflow = f"wf-{uuid.uuid4().hex[:6]}"
        publish_agent(own)  # a second agent: each card at its own path only
        assert_problem(own.requester().get("/.well-known/agent-card.json"), 404)
    finally:
        own.close()


def test_the_public_agents_card_needs_no_token_and_its_calls_do(
    t: TenantView, ray_runtime: Any, db: Any, tmp_path: Any
) -> None:
    """``RunControl:Api:A2aPublicAgent`` (``runcontrol up --dev``: the demo's): its card at
    the root answers without a token; calling it still needs one. An app built in this
    process over the session's run hosts, with the setting."""
    publish_agent(t)
    settings = api_settings(ray_runtime, tmp_path / "jwks.json")
    settings["auth"].pop("jwks_file")
    settings["auth"]["hs256_with_jwks"] = False
    settings["api"]["a2a_public_agent"] = f"{t.tenant}/{t.workflow}"
    app = create_app(ray_runtime.client, db, Settings.model_validate(settings))

    agent = f"/a2a/{t.workflow}"
    # The card at the root, at the agent's root and under each binding's URL.
    paths = ["", agent, f"{agent}/jsonrpc", f"{agent}/rest"]

    async def probe() -> tuple[list[httpx.Response], httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as http:
            cards = [await http.get(f"{p}/.well-known/agent-card.json") for p in paths]
            call = await http.post(f"{agent}/jsonrpc", json={})
            tasks = await http.get(f"{agent}/rest/tasks")
            return cards, call, tasks

    cards, call, tasks = asyncio.run(probe())
    for card in cards:
        assert card.status_code == 200, card.text
        assert card.json()["name"] == "Review agent"
        urls = [i["url"] for i in card.json()["supportedInterfaces"]]
        assert all(u.startswith(f"http://replica/a2a/{t.workflow}/") for u in urls), urls
    assert_problem(call, 401, "unauthorized")
    assert_problem(tasks, 401, "unauthorized")


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_run_as_a_task_signal_approval_stream_and_result(t: TenantView, binding: str) -> None:
    publish_agent(t)
    requester, reviewer = t.token(), t.token(REVIEWER, Role.REVIEWER)

    async def start(client: Client) -> Any:
        return await send(client, text_message("review PR 12"))

    # SendMessage blocks until the run asks for something: the signal step's input.
    task = run(with_client(t, requester, binding, start))
    assert task.status.state == S.TASK_STATE_INPUT_REQUIRED, task
    ask = MessageToDict(task.status.message.parts[1].data)
    assert ask == {"kind": "signal", "signal": "details"}
    assert t.run(task.id)["input"] == {"question": "review PR 12"}

    async def answer(client: Client) -> Any:
        reply = data_message({"files": 3}, task_id=task.id, context_id=task.context_id)
        return await send(client, reply, immediately=True)

    answered = run(with_client(t, requester, binding, answer))
    assert answered.status.state in (S.TASK_STATE_WORKING, S.TASK_STATE_SUBMITTED)

    # The worker takes the gated step and asks for approval: INPUT_REQUIRED again.
    t.request_approval(t.claim(task.id))
    t.wait_state(task.id, "WaitingForApproval")

    async def get(client: Client) -> Any:
        return await client.get_task(GetTaskRequest(id=task.id))

    waiting = run(with_client(t, requester, binding, get))
    assert waiting.status.state == S.TASK_STATE_INPUT_REQUIRED
    approval = MessageToDict(waiting.status.message.parts[1].data)
    assert approval["kind"] == "approval" and approval["proposalHash"]

    def decide(token: str) -> Any:
        async def call(client: Client) -> Any:
            # the ask's version echoed back as read (a JSON number: 1.0)
            body = {k: approval[k] for k in ("proposalHash", "version")} | {"decision": "approve"}
            return await send(client, data_message(body, task_id=task.id), immediately=True)

        return run(with_client(t, token, binding, call))

    # The requester may never approve its own run, even holding a reviewer's role: refused
    # (and audited by the run's grain, as over HTTP), and the task still asks.
    with pytest.raises(InvalidRequestError):
        decide(t.token(REQUESTER, Role.REQUESTER, Role.REVIEWER))
    with pytest.raises(InvalidRequestError):  # no decide scope at all
        decide(requester)
    assert run(with_client(t, requester, binding, get)).status.state == (
        S.TASK_STATE_INPUT_REQUIRED
    )

    async def chat(client: Client) -> list[Any]:
        request = SendMessageRequest(message=text_message("looks fine", task_id=task.id))
        return [event async for event in client.send_message(request)]

    # Free text is no decision (a decision is bound to the proposal hash): the agent's reply
    # restates the ask, and the task still asks.
    (reply,) = run(with_client(t, reviewer, binding, chat))
    assert reply.HasField("message"), reply
    assert reply.message.task_id == task.id
    assert MessageToDict(reply.message.parts[1].data)["proposalHash"] == approval["proposalHash"]
    still = run(with_client(t, requester, binding, get))
    assert still.status.state == S.TASK_STATE_INPUT_REQUIRED
    assert meta(still)["lastEventSeq"] == meta(waiting)["lastEventSeq"], "nothing happened"
    decide(reviewer)  # a second identity decides

    # Stream the task; drop the stream after its first event and resume after its seq.
    async def first(client: Client) -> tuple[int, list[Any]]:
        stream = client.subscribe(SubscribeToTaskRequest(id=task.id))
        seen = [await anext(stream)]
        await stream.aclose()  # type: ignore[attr-defined]
        return int(meta(seen[0].task)["lastEventSeq"]), seen

    cursor, _ = run(with_client(t, requester, binding, first, streaming=True))
    succeed_with_result(t, task.id)

    async def rest(client: Client) -> list[Any]:
        events: list[Any] = []
        stream = client.subscribe(SubscribeToTaskRequest(id=task.id), context=resume_from(cursor))
        async for event in stream:
            events.append(event)
        return events

    events = run(with_client(t, requester, binding, rest, streaming=True))
    assert events[0].HasField("task")
    seqs = [
        e["seq"]
        for ev in events
        if ev.HasField("status_update")
        for e in meta(ev.status_update)["events"]
    ]
    history = [e["seq"] for e in t.history(task.id) if e["seq"] > cursor]
    assert seqs == history, "every event after the cursor once, in order"
    artifacts = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    assert [MessageToDict(a.parts[0].data) for a in artifacts] == [RESULT]
    assert events[-1].status_update.status.state == S.TASK_STATE_COMPLETED

    done = run(with_client(t, requester, binding, get))
    assert done.status.state == S.TASK_STATE_COMPLETED
    assert MessageToDict(done.artifacts[0].parts[0].data) == RESULT


@pytest.mark.parametrize("binding", BINDINGS)
def test_cancel_is_canceled_only_once_settled(t: TenantView, binding: str) -> None:
    publish_agent(t, signal=False, gate="none")
    token = t.token()

    message = text_message("cancel me")

    async def start(client: Client) -> Any:
        return await send(client, message, immediately=True)

    task = run(with_client(t, token, binding, start))
    # messageId is the idempotency key: the same message again is the same task
    assert run(with_client(t, token, binding, start)).id == task.id
    claim = t.claim(task.id)  # an attempt in flight: the cancel must wait for it

    async def cancel(client: Client) -> Any:
        return await client.cancel_task(CancelTaskRequest(id=task.id))

    cancelling = run(with_client(t, token, binding, cancel))
    assert cancelling.status.state == S.TASK_STATE_WORKING  # intent recorded, not settled
    assert t.run(task.id)["state"] == "Cancelling"
    t.succeed(claim)  # the attempt settles
    t.wait_state(task.id, "Cancelled")

    async def get(client: Client) -> Any:
        return await client.get_task(GetTaskRequest(id=task.id))

    assert run(with_client(t, token, binding, get)).status.state == S.TASK_STATE_CANCELED
    with pytest.raises(TaskNotCancelableError):
        run(with_client(t, token, binding, cancel))


@pytest.mark.parametrize("binding", BINDINGS)
def test_another_tenant_sees_task_not_found(t: TenantView, binding: str, api: Any) -> None:
    publish_agent(t, signal=True)

    async def start(client: Client) -> Any:
        return await send(client, text_message("mine"), immediately=True)

    task = run(with_client(t, t.token(), binding, start))
    other = TenantView(api, t.runtime, new_tenant())
    try:
        other.workflow = t.workflow
        publish_agent(other)  # the same workflow id, its own agent
        token = other.token()
        calls = {
            "get": lambda c: c.get_task(GetTaskRequest(id=task.id)),
            "cancel": lambda c: c.cancel_task(CancelTaskRequest(id=task.id)),
            "reply": lambda c: send(c, data_message({"x": 1}, task_id=task.id)),
        }
        for name, call in calls.items():
            with pytest.raises(TaskNotFoundError):
                run(with_client(other, token, binding, call))
            assert name

        async def listed(client: Client) -> Any:
            return await client.list_tasks(ListTasksRequest())

        assert [x.id for x in run(with_client(other, token, binding, listed)).tasks] == []
    finally:
        other.close()
    mine = run(with_client(t, t.token(), binding, lambda c: c.list_tasks(ListTasksRequest())))
    assert [x.id for x in mine.tasks] == [task.id]


def test_list_tasks_filters_in_the_store_and_limits_history(t: TenantView) -> None:
    """ListTasks' contextId and statusTimestampAfter filter the runs (totalSize counts what
    matches), pageSize is what the page holds; historyLength trims the derived history (the
    submission, then the ask) and a negative one is InvalidParams."""
    publish_agent(t)
    before = datetime.now(UTC)

    async def scenario(client: Client) -> tuple[Any, ...]:
        task = await send(client, text_message("one", context_id="ctx-a"))
        other = await send(client, text_message("two"))
        by_context = await client.list_tasks(ListTasksRequest(context_id="ctx-a"))
        by_own_id = await client.list_tasks(ListTasksRequest(context_id=other.id))
        unknown = await client.list_tasks(ListTasksRequest(context_id="ctx-none"))
        later = ListTasksRequest()
        later.status_timestamp_after.FromDatetime(datetime.now(UTC) + timedelta(hours=1))
        after_now = await client.list_tasks(later)
        earlier = ListTasksRequest()
        earlier.status_timestamp_after.FromDatetime(before)
        after_before = await client.list_tasks(earlier)
        full = await client.get_task(GetTaskRequest(id=task.id))
        last = await client.get_task(GetTaskRequest(id=task.id, history_length=1))
        with pytest.raises(InvalidParamsError):
            await client.get_task(GetTaskRequest(id=task.id, history_length=-1))
        with pytest.raises(InvalidParamsError):
            await client.list_tasks(ListTasksRequest(history_length=-1))
        return task, other, by_context, by_own_id, unknown, after_now, after_before, full, last

    task, other, by_context, by_own_id, unknown, after_now, after_before, full, last = run(
        with_client(t, t.token(), BINDINGS[0], scenario)
    )
    assert [x.id for x in by_context.tasks] == [task.id] and by_context.total_size == 1
    assert by_context.page_size == 1
    assert [x.id for x in by_own_id.tasks] == [other.id]
    assert (unknown.total_size, unknown.page_size, list(unknown.tasks)) == (0, 0, [])
    assert after_now.total_size == 0
    assert {x.id for x in after_before.tasks} == {task.id, other.id}
    # The history: the submission as the run took it, then what the agent asks now.
    assert [m.role for m in full.history] == [A2ARole.ROLE_USER, A2ARole.ROLE_AGENT]
    assert MessageToDict(full.history[0].parts[0].data) == {"question": "one"}
    assert list(last.history) == [full.history[1]]


def test_bad_input_is_invalid_params_and_nothing_is_stored(t: TenantView) -> None:
    publish_agent(t)

    async def bad(client: Client) -> Any:
        return await send(client, data_message({"other": 1}))  # lacks "question"

    with pytest.raises(A2AError, match="(?i)question"):
        run(with_client(t, t.token(), BINDINGS[0], bad))
    assert t.requester().get(f"/factory/runs?workflowId={t.workflow}").json()["items"] == []


def test_list_tasks_with_an_unknown_status_is_invalid_params(t: TenantView) -> None:
    """An unknown ``status`` (the conformance kit's ``INVALID_STATUS``) is InvalidParams on
    both HTTP bindings, not the unfiltered list a2a-sdk's parse would make of it; a known one
    (name or number) still filters."""
    publish_agent(t)
    http = t.requester()
    headers = {"A2A-Version": "1.0"}
    rpc = f"/a2a/{t.workflow}/jsonrpc"
    rest = f"/a2a/{t.workflow}/rest/tasks"
    for status in ("INVALID_STATUS", 99, "working"):
        body = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"status": status}}
        answer = http.post(rpc, json=body, headers=headers).json()
        assert answer["error"]["code"] == -32602, answer
        assert "status must be a task state" in answer["error"]["message"], answer
        refused = http.get(rest, params={"status": status}, headers=headers)
        assert refused.status_code == 400 and "status must be" in refused.text, refused.text
    for status in ("TASK_STATE_WORKING", 3):
        body = {"jsonrpc": "2.0", "id": 2, "method": "ListTasks", "params": {"status": status}}
        assert http.post(rpc, json=body, headers=headers).json()["result"]["tasks"] == []
        listed = http.get(rest, params={"status": status}, headers=headers)
        assert listed.status_code == 200 and listed.json()["tasks"] == [], listed.text

    async def by_number(client: Client) -> Any:
        return await client.list_tasks(ListTasksRequest(status=99))  # type: ignore[arg-type]

    for binding in BINDINGS:  # the SDK's client sends an unknown number as it is
        with pytest.raises(InvalidParamsError):
            run(with_client(t, t.token(), binding, by_number))


def test_malformed_json_rpc_and_unknown_methods_are_errors_not_500(t: TenantView) -> None:
    publish_agent(t)
    http = t.requester()
    url = f"/a2a/{t.workflow}/jsonrpc"
    headers = {"A2A-Version": "1.0"}
    assert http.post(url, content=b"{not json", headers=headers).json()["error"]["code"] == -32700
    body = {"jsonrpc": "2.0", "id": 1, "method": "Nope", "params": {}}
    assert http.post(url, json=body, headers=headers).json()["error"]["code"] == -32601
    body = {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": "not-a-uuid"}}
    assert http.post(url, json=body, headers=headers).json()["error"]["code"] == -32001
    body = {"jsonrpc": "2.0", "id": 3, "method": "SendMessage", "params": {"message": 5}}
    answer = http.post(url, json=body, headers=headers)
    assert answer.status_code == 200 and answer.json()["error"]["code"] == -32602
    assert http.get(f"/a2a/{t.workflow}/rest/tasks/{'0' * 8}", headers=headers).status_code == 404
    assert agent_url(t).endswith(t.workflow)
    assert SendMessageRequest  # the request type the bindings parse


def test_a_rate_limited_submission_is_a_rejected_task_stored_nowhere(
    api: Any, ray_runtime: Any
) -> None:
    limited = TenantView(api, ray_runtime, A2A_RATE_TENANT)  # a burst of 3, then 1 per 20 s
    try:
        publish_agent(limited, signal=False, gate="none")

        async def submit_four(client: Client) -> list[Any]:
            return [await send(client, text_message(f"n{i}"), immediately=True) for i in range(4)]

        answers = run(with_client(limited, limited.token(), BINDINGS[0], submit_four))
        rejected = [a for a in answers if a.status.state == S.TASK_STATE_REJECTED]
        assert rejected, [a.status.state for a in answers]
        assert MessageToDict(rejected[0].status.message.parts[1].data) == {"code": "rate-limited"}

        async def get(client: Client) -> Any:
            return await client.get_task(GetTaskRequest(id=rejected[0].id))

        with pytest.raises(TaskNotFoundError):
            run(with_client(limited, limited.token(), BINDINGS[0], get))
    finally:
        limited.close()
