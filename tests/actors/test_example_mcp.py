"""MCP tool calls from a step in the cluster (the example examples/mcp: a pydantic-ai agent
whose ``MCPToolset`` is the notes MCP server, a real process over streamable HTTP counting its
tool bodies' runs in a file), run by ``runcontrol worker`` processes.

The agent's ``write`` is an ``approval`` tool: the approval asks for exactly
``{"server", "tool", "arguments"}`` (its hash the request's); the run's requester may not
decide it, a reviewer does; the worker is SIGKILLed right after the write ran (the model's
next request pauses) and another worker re-enters the step: the write ran once, the ``read``
lookup once (answered from the journal on re-entry), and the run completes.
(The same calls on a step in memory, over stdio too: tests/unit/test_integrations_mcp.py.)"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from actor_harness import REQUESTER, RayHarness
from mcp_servers import http_server, runs
from test_sdk import app_worker, killed_mid_run, outcomes_per_attempt

from examples.mcp import agents
from runcontrol.domain import Decision, Role, WorkflowDefinition, canonical_hash, errors

APP = "examples.mcp.agents:worker"


def start_worker(
    h: RayHarness, tmp_path: Path, url: str, holder: str, pause_s: float
) -> subprocess.Popen[bytes]:
    return app_worker(
        h,
        tmp_path,
        holder,
        APP,
        MCP_NOTES_URL=url,
        MCP_EXAMPLE_AGENT=h.agent(agents.AGENT_ID),
        MCP_EXAMPLE_PAUSE_S=str(pause_s),
    )


def test_an_approved_mcp_write_runs_once_across_a_killed_worker(
    h: RayHarness, tmp_path: Path
) -> None:
    definition = WorkflowDefinition.from_dict(agents.workflow(h.agent(agents.AGENT_ID)))
    h.rt.container.releases.publish(
        h.tenant, definition, "publisher", datetime.now(UTC), ("latest",)
    )
    counter, target = tmp_path / "runs.jsonl", tmp_path / "copy.txt"
    asked: dict[str, Any] = {}

    async def submit_and_approve() -> UUID:
        """Submitted; the requester's decision refused, the reviewer's taken."""
        request = h.request(input={"path": str(target)}, workflow_id=agents.WORKFLOW_ID)
        run_id = (await h.submit(request)).run_id
        asked.update((await h.wait_type(run_id, "ApprovalRequested", timeout=90))["payload"])
        approval_id, proposal_hash = UUID(asked["approvalId"]), asked["proposalHash"]
        requester = h.principal(REQUESTER, Role.REQUESTER, Role.REVIEWER)
        with pytest.raises(errors.SeparationOfDuties):  # however many roles it holds
            await h.decide(requester, approval_id, Decision.APPROVE, 1, proposal_hash)
        await h.approve_requested(asked)
        return run_id

    async def approved(run_id: UUID) -> None:
        return None  # before the kill

    with http_server(counter) as url:
        # Killed right after the write ran: the model's next request pauses in the first.
        run_id, _, _ = killed_mid_run(
            h,
            (
                lambda: start_worker(h, tmp_path, url, "mcp-kill-1", pause_s=60.0),
                lambda: start_worker(h, tmp_path, url, "mcp-kill-2", pause_s=0.0),
            ),
            submit_and_approve,
            lambda run_id: lambda: runs(counter)["write"],
            "the approved write",
            approved,
        )
    h.assert_consistent(run_id)
    arguments = {"path": str(target), "content": "hello from the notes server"}
    proposal = {"server": "notes", "tool": "write", "arguments": arguments}
    assert asked["proposalHash"] == canonical_hash(proposal)
    shown = [
        e["payload"]["payload"]["proposal"]
        for e in h.outbox_events(run_id)
        if e["type"] == "ProgressReported" and (e["payload"]["payload"] or {}).get("proposal")
    ]
    assert shown and all(p == proposal for p in shown)
    assert target.read_text() == arguments["content"]
    assert runs(counter) == {"lookup": 1, "write": 1}
    assert set(outcomes_per_attempt(h, run_id).values()) == {1}
