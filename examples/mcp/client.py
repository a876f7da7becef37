"""``python -m examples.mcp.client``: runcontrol as an MCP server (docs/mcp.md), seen by the
``mcp`` SDK's own client. As the requester (alice) it lists the tools at ``/mcp``, calls the
``demo-review`` workflow's own tool and prints the run's events as they arrive (MCP progress
notifications); when the run waits for approval, the reviewer (bob, a second identity)
decides over the HTTP API; the tool call then answers the run with its result.

Against ``make run`` (tenant and project ``demo``, its demo workers serve ``demo-review``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from examples.repository_assessment.__main__ import arguments, token
from runcontrol.domain import RunState

WORKFLOW_ID = "demo-review"
TOOL = f"workflow.{WORKFLOW_ID}"  # a workflow that opts in (its agent block) is a tool


async def approve(reviewer: httpx.AsyncClient, run_id: str, say: Callable[[str], None]) -> None:
    """The reviewer approves the run's pending requests, each on its version and hash."""
    query = {"runId": run_id, "state": "Pending"}
    pending = (await reviewer.get("/factory/approvals", params=query)).json()["items"]
    for approval in pending:
        body = {
            "decision": "approve",
            "version": approval["version"],
            "proposalHash": approval["proposalHash"],
            "reason": "reviewed over HTTP",
        }
        answer = await reviewer.post(
            f"/factory/approvals/{approval['approvalId']}/decision", json=body
        )
        answer.raise_for_status()
        say(f"  bob approved {approval['approvalId']} (over HTTP)")


async def review(
    url: str,
    requester: str,
    reviewer: str,
    request: str,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Start ``demo-review`` through its MCP tool as ``requester`` (a bearer token), approve
    over HTTP as ``reviewer`` when it waits, and answer the run once it ended."""
    decided: list[asyncio.Future[None]] = []
    seen = {"seq": 0, "position": 0}
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {requester}"}, timeout=120) as http,
        httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {reviewer}"}) as bob,
        Client(streamable_http_client(f"{url}/mcp", http_client=http)) as mcp,
    ):
        tools = [tool.name for tool in (await mcp.list_tools()).tools]
        say(f"tools: {', '.join(tools)}")

        async def progress(count: float, total: float | None, message: str | None) -> None:
            item = json.loads(message or "{}")
            if "event" in item:
                event = item["event"]
                seen["seq"] = event["seq"]
                say(f"  event {event['seq']}: {event['type']}")
                if event["type"] == "ApprovalRequested":
                    decided.append(asyncio.ensure_future(approve(bob, event["runId"], say)))
            elif "output" in item:
                seen["position"] = item["output"]["position"]

        result = await mcp.call_tool(TOOL, {"request": request}, progress_callback=progress)
        view: dict[str, Any] = result.structured_content
        while not result.is_error and not RunState(view["state"]).terminal:
            # The wait is bounded (as Prefer: wait is): wait again after what was seen.
            after = {"after": seen["seq"], "afterPosition": seen["position"]}
            result = await mcp.call_tool(
                "wait_run", {"runId": view["runId"]} | after, progress_callback=progress
            )
            view = result.structured_content
        await asyncio.gather(*decided)
    if result.is_error:
        raise RuntimeError(f"{TOOL} refused: {view}")
    return view


def main(argv: list[str] | None = None) -> int:
    parser = arguments("mcp.client", "run")
    parser.add_argument("--request", default="review example/repo at a1b2c3d")
    args = parser.parse_args(argv)
    alice = token(args.tenant, args.project, "alice", "Requester")
    bob = token(args.tenant, args.project, "bob", "Reviewer")
    run = asyncio.run(review(args.url, alice, bob, args.request))
    print(f"run {run['runId']} {run['state']}: {json.dumps(run.get('result'))}")
    return 0 if run["state"] == "Completed" else 1


if __name__ == "__main__":
    sys.exit(main())
