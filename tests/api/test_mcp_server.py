"""runcontrol as an MCP server (issue 45): the ``mcp`` SDK's own client over streamable HTTP
against the session's real Serve app at ``/mcp``: the tools a token may call, a run started
and watched to its end with progress, an approval decided over HTTP while a tool call waits,
the decision tool only where the tenant's policy offers it (and never for the requester), a
403 for a token without the scope, another tenant's run unseen, bad arguments answered as
the tool's error (never a 5xx), a client gone mid-call losing nothing."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
import httpx2
import pytest
from api_harness import REQUESTER, REVIEWER, TenantView, decision, new_tenant, wait_until
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from runcontrol.domain import Role, WorkflowDefinition
from runcontrol.domain.access import RUNS_READ

T = TypeVar("T")
CALL_TIMEOUT_S = 90.0
FIXED = {
    "start_run",
    "start_run_and_wait",
    "wait_run",
    "get_run",
    "list_runs",
    "read_events",
    "read_output",
    "list_approvals",
    "send_signal",
    "cancel_run",
}


def with_client(
    t: TenantView, token: str, use: Callable[[Client], Awaitable[T]], mode: str = "auto"
) -> T:
    """``use`` with the SDK's client connected to ``/mcp`` as the token's caller (``mode``:
    ``auto``, the 2026 protocol the server offers; ``legacy``, the initialize handshake of
    the clients before it)."""

    async def connected() -> T:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60.0)
        transport = streamable_http_client(f"{t.api.base_url}/mcp", http_client=http)
        async with http, Client(transport, mode=mode) as client:
            return await use(client)

    return asyncio.run(asyncio.wait_for(connected(), CALL_TIMEOUT_S))


def call(t: TenantView, token: str, tool: str, arguments: dict[str, Any]) -> Any:
    """The tool's result, or the ``MCPError`` the client raised for the request."""

    async def use(client: Client) -> Any:
        try:
            return await client.call_tool(tool, arguments)
        except MCPError as exc:
            return exc

    return with_client(t, token, use)


def answer(result: Any) -> dict[str, Any]:
    assert not isinstance(result, BaseException), repr(result)
    assert not result.is_error, result.content
    structured: dict[str, Any] = result.structured_content
    assert json.loads(result.content[0].text) in (structured, structured.get("items"))
    return structured


def start_args(t: TenantView, **overrides: Any) -> dict[str, Any]:
    return t.body() | {"idempotencyKey": f"k-{uuid.uuid4().hex}"} | overrides


def publish_exposed(t: TenantView, workflow_id: str) -> None:
    """A workflow that opts in (its ``agent`` block, with an input schema)."""
    definition = WorkflowDefinition.from_dict(
        {
            "workflowId": workflow_id,
            "steps": [{"name": "only", "agentId": t.agent, "sideEffectClass": "read"}],
            "agent": {
                "name": "Summariser",
                "description": "Summarises a document.",
                "skills": [{"id": "sum", "name": "Summarise", "description": "Summarise."}],
                "modelProfileId": "code-agent",
                "inputSchema": {
                    "properties": {"document": {"type": "string", "minLength": 1}},
                    "required": ["document"],
                },
            },
        }
    )
    t.runtime.container.releases.publish(
        t.tenant, definition, "publisher", datetime.now(UTC), ("latest",)
    )


def test_the_tools_a_token_may_call_and_a_workflow_that_opts_in(t: TenantView) -> None:
    t.publish()
    publish_exposed(t, f"sum-{uuid.uuid4().hex[:6]}")

    async def names(client: Client) -> dict[str, Any]:
        return {tool.name: tool for tool in (await client.list_tools()).tools}

    tools = with_client(t, t.token(), names)
    workflow_tools = {n for n in tools if n.startswith("workflow.")}
    assert set(tools) - workflow_tools == FIXED  # no decision tool by default
    (exposed,) = workflow_tools
    assert tools[exposed].input_schema["required"] == ["document"]
    assert "idempotencyKey" in tools["start_run"].input_schema["properties"]

    # A reviewer reads and decides; it starts nothing. Deciding over MCP is the tenant's choice.
    reviewer = t.token(REVIEWER, Role.REVIEWER)
    assert "start_run" not in with_client(t, reviewer, names)
    assert "decide_approval" not in with_client(t, reviewer, names)
    t.publish_policy(mcp_decisions=True)
    offered = with_client(t, reviewer, names)
    assert "decide_approval" in offered and not any(n.startswith("workflow.") for n in offered)

    # The workflow's own tool: its input checked against its schema, then a run of it,
    # answered once it ended.
    bad = call(t, t.token(), exposed, {"document": ""})
    assert bad.is_error and bad.structured_content["code"] == "validation-failed"
    waiting, outcome = in_background(lambda: call(t, t.token(), exposed, {"document": "text"}))
    run_id = wait_until(lambda: the_run(t, exposed.removeprefix("workflow.")), 30)
    assert t.run(run_id)["input"] == {"document": "text"}
    t.succeed(t.claim(run_id))
    waiting.join(CALL_TIMEOUT_S)
    assert answer(outcome["result"])["state"] == "Completed"


def in_background(work: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """``work`` on a thread of its own (a tool call that waits while the test acts)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = work()
        except BaseException as exc:  # a test's ``answer`` shows it
            outcome["result"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_start_watch_and_finish_with_progress_and_an_approval_decided_over_http(
    t: TenantView, mode: str
) -> None:
    t.publish(gate="approval")
    progress: list[str] = []
    key = f"k-{uuid.uuid4().hex}"

    async def start_and_wait(client: Client) -> Any:
        async def seen(count: float, total: float | None, message: str | None) -> None:
            progress.append(message or "")

        return await client.call_tool(
            "start_run_and_wait",
            start_args(t, idempotencyKey=key, waitSeconds=60),
            progress_callback=seen,
        )

    caller, outcome = in_background(lambda: with_client(t, t.token(), start_and_wait, mode))
    try:
        run_id = wait_until(lambda: the_run(t, t.workflow) or ended(caller, outcome), 30)
        t.request_approval(t.claim(run_id))
        (pending,) = t.wait_state(run_id, "WaitingForApproval")["pendingApprovals"]
        wait_until(lambda: any('"ApprovalRequested"' in p for p in progress), 30)
        # The requester may never approve its own run; a reviewer decides over HTTP.
        path = f"/factory/approvals/{pending['approvalId']}/decision"
        refused = t.user(REQUESTER, Role.REQUESTER, Role.REVIEWER).post(
            path, json=decision(pending)
        )
        assert refused.status_code == 403, refused.text
        decided = t.reviewer().post(path, json=decision(pending))
        assert decided.status_code == 200, decided.text
        t.succeed(t.claim(run_id))
    finally:
        caller.join(CALL_TIMEOUT_S)
    view = answer(outcome["result"])
    assert view["runId"] == run_id and view["state"] == "Completed"
    kinds = [json.loads(p)["event"]["type"] for p in progress if '"event"' in p]
    assert kinds[0] == "RunAccepted" and "ApprovalDecided" in kinds and kinds[-1] == "RunCompleted"

    # The same key answers the same run (an idempotent start), then reads of it.
    again = answer(call(t, t.token(), "start_run", start_args(t, idempotencyKey=key)))
    assert again["runId"] == run_id
    events = answer(call(t, t.token(), "read_events", {"runId": run_id, "after": 0}))["items"]
    assert [e["type"] for e in events] == [
        json.loads(p)["event"]["type"] for p in progress if '"event"' in p
    ]
    assert answer(call(t, t.token(), "get_run", {"runId": run_id}))["state"] == "Completed"


def ended(thread: threading.Thread, outcome: dict[str, Any]) -> None:
    """Fails the test when the call on ``thread`` ended before the test expected."""
    if not thread.is_alive():
        pytest.fail(f"the call ended: {outcome.get('result')!r}")


def the_run(t: TenantView, workflow_id: str) -> str | None:
    """The newest run of ``workflow_id``, once there is one."""
    page = t.requester().get("/factory/runs", params={"workflowId": workflow_id}).json()
    return page["items"][0]["runId"] if page["items"] else None


def test_a_token_without_the_scope_is_403_and_the_decision_keeps_every_rule(t: TenantView) -> None:
    t.publish()
    base = f"{t.api.base_url}/mcp"
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "start_run", "arguments": start_args(t)},
    }
    headers = {"Accept": "application/json, text/event-stream"}
    anonymous = httpx.post(base, json=body, headers=headers)
    assert anonymous.status_code == 401
    read_only = t.token(REQUESTER, Role.REQUESTER, scopes=[RUNS_READ])
    refused = httpx.post(
        base, json=body, headers=headers | {"Authorization": f"Bearer {read_only}"}
    )
    assert refused.status_code == 403, refused.text
    assert "insufficient_scope" in refused.headers["WWW-Authenticate"]
    assert refused.json()["code"] == "insufficient-scope"
    # the SDK's client sees the refusal as an error
    assert isinstance(call(t, read_only, "start_run", start_args(t)), MCPError)

    # The decision tool, offered by the tenant's policy: never the requester's; a reviewer's.
    t.publish_policy(mcp_decisions=True)
    run_id, claim, pending = t.waiting_for_approval()
    arguments = {
        "approvalId": pending["approvalId"],
        "decision": "approve",
        "version": pending["version"],
        "proposalHash": pending["proposalHash"],
    }
    own = call(t, t.token(REQUESTER, Role.REQUESTER, Role.REVIEWER), "decide_approval", arguments)
    assert own.is_error and own.structured_content["status"] == 403
    stale = call(t, t.token(REVIEWER, Role.REVIEWER), "decide_approval", arguments | {"version": 9})
    assert stale.is_error and stale.structured_content["status"] in (409, 410)
    decided = answer(call(t, t.token(REVIEWER, Role.REVIEWER), "decide_approval", arguments))
    assert decided["state"] == "Approved" and decided["approvalId"] == pending["approvalId"]


def test_bad_arguments_another_tenants_run_and_a_client_gone_mid_call(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    other = t.api.token(new_tenant(), REQUESTER, (Role.REQUESTER,))
    unseen = call(t, other, "get_run", {"runId": run_id})
    assert unseen.is_error and unseen.structured_content["code"] == "run-not-found"

    async def read_resource(client: Client) -> Any:
        try:
            return await client.read_resource(f"runcontrol://runs/{run_id}")
        except MCPError as exc:
            return exc

    assert isinstance(with_client(t, other, read_resource), MCPError)
    (content,) = with_client(t, t.token(), read_resource).contents
    assert json.loads(content.text)["runId"] == run_id

    for tool, arguments in [
        ("get_run", {"runId": "not-a-uuid"}),
        ("start_run", {"workflowId": t.workflow}),  # no modelProfileId
        ("list_runs", {"limit": 0}),
        ("list_runs", {"cursor": "forged"}),
        ("read_events", {"runId": run_id, "after": -1}),
        ("cancel_run", {"runId": run_id}),  # no reason
        ("send_signal", {"runId": run_id, "name": "x", "body": None, "extra": 1}),
    ]:
        bad = call(t, t.token(), tool, arguments)
        assert bad.is_error, (tool, arguments)
        assert 400 <= bad.structured_content["status"] < 500, bad.structured_content
    assert isinstance(call(t, t.token(), "no_such_tool", {}), MCPError)

    t.succeed(t.claim(run_id))

    # A client that goes away while its call waits: the run goes on, and the same key finds it.
    key = f"k-{uuid.uuid4().hex}"

    async def gone(client: Client) -> None:
        waiting = asyncio.ensure_future(
            client.call_tool("start_run_and_wait", start_args(t, idempotencyKey=key))
        )
        await asyncio.sleep(1.0)
        waiting.cancel()

    with_client(t, t.token(), gone)
    started = answer(call(t, t.token(), "start_run", start_args(t, idempotencyKey=key)))
    t.succeed(t.claim(started["runId"]))
    done = answer(call(t, t.token(), "wait_run", {"runId": started["runId"], "waitSeconds": 20}))
    assert done["state"] == "Completed"


def test_a_subscription_to_a_run_tells_its_changes_until_it_ends(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    uri = f"runcontrol://runs/{run_id}"
    listening = threading.Event()

    async def subscribe(client: Client) -> list[Any]:
        async with client.listen(resource_subscriptions=[uri]) as subscription:
            listening.set()
            return [event async for event in subscription]  # until the server ends it

    waiting, outcome = in_background(lambda: with_client(t, t.token(), subscribe))
    assert listening.wait(CALL_TIMEOUT_S), outcome
    t.succeed(t.claim(run_id))
    waiting.join(CALL_TIMEOUT_S)
    changes = outcome["result"]
    assert isinstance(changes, list) and changes, changes
    assert {change.uri for change in changes} == {uri}

    # Another tenant's run: refused before anything is acknowledged.
    async def foreign(client: Client) -> Any:
        try:
            async with client.listen(resource_subscriptions=[uri]):
                return None
        except MCPError as exc:
            return exc

    other = t.api.token(new_tenant(), REQUESTER, (Role.REQUESTER,))
    assert isinstance(with_client(t, other, foreign), MCPError)
