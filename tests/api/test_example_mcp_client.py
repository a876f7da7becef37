"""The example ``examples/mcp/client.py`` against the session's Serve app: the ``mcp`` SDK's
client starts ``demo-review`` through the workflow's own tool at ``/mcp``, receives its events
as progress, sees it wait for approval, a reviewer decides over HTTP, and the call answers the
completed run with its result (the demo's echo agents, over gRPC)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from api_harness import REVIEWER
from grpc_harness import GrpcTenant
from test_sdk_grpc import serve_over_grpc

from examples.mcp.client import review
from runcontrol.cli.demo import DEMO_WORKFLOW
from runcontrol.domain import Role, WorkflowDefinition
from runcontrol.sdk.echo import echo_worker


def test_an_mcp_client_starts_demo_review_and_gets_its_result_after_an_approval(
    g: GrpcTenant, grpc_port: int
) -> None:
    demo = copy.deepcopy(DEMO_WORKFLOW)
    for step in demo["steps"]:  # this test's own agents: no other test's worker takes them
        step["agentId"] = f"{step['agentId']}-{g.view.agent}"
    g.view.runtime.container.releases.publish(
        g.tenant, WorkflowDefinition.from_dict(demo), "publisher", datetime.now(UTC), ("latest",)
    )
    worker = echo_worker([s["agentId"] for s in demo["steps"]], 0.2, wait_s=2.0)
    said: list[str] = []
    runs: list[dict[str, Any]] = []

    async def scenario() -> None:
        requester, reviewer = g.view.token(), g.view.token(REVIEWER, Role.REVIEWER)
        runs.append(await review(g.view.api.base_url, requester, reviewer, "PR 7", said.append))

    serve_over_grpc(g, grpc_port, worker, scenario)
    (run,) = runs
    assert run["state"] == "Completed" and run["input"] == {"request": "PR 7"}, run
    assert run["result"] is not None
    assert said[0].startswith("tools: ") and "workflow.demo-review" in said[0]
    events = [line.split(": ", 1)[1] for line in said if line.startswith("  event ")]
    assert events[0] == "RunAccepted" and events[-1] == "RunCompleted", said
    approved = [i for i, line in enumerate(said) if "bob approved" in line]
    assert approved and events.index("ApprovalRequested") < events.index("ApprovalDecided")
