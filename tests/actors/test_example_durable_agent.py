"""The example ``examples/durable_agent`` in the cluster (the SDK over actor-handle sessions,
real run hosts, PostgreSQL): a pydantic-ai agent run by ``runcontrol.integrations.pydantic_ai``
reads a repository, proposes a change through a tool that needs approval, and applies it once a
second identity approved exactly that call. The scripted model words its plan differently on
every call, yet the approval holds on re-entry: the requests before it are replayed from the
journal, not made again. A worker process killed mid-run (SIGKILL) and restarted replays the
model requests it had completed."""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from actor_harness import RayHarness, run_async
from test_integrations_agents import approve_as_the_reviewer
from test_sdk import app_worker, killed_mid_run, outcomes_per_attempt, serving

from examples.durable_agent import agents
from examples.repository_assessment.repository import make_sample
from runcontrol.domain import WorkflowDefinition

APP = "examples.durable_agent.agents:worker"


def publish(h: RayHarness, agent_id: str) -> None:
    definition = WorkflowDefinition.from_dict(agents.workflow(agent_id))
    h.rt.container.releases.publish(
        h.tenant, definition, "publisher", datetime.now(UTC), ("latest",)
    )


async def submit(h: RayHarness, where: Path) -> UUID:
    make_sample(where / "repository")
    data = {"repository": str(where / "repository"), "scratch": str(where / "scratch")}
    request = h.request(input=data, workflow_id=agents.WORKFLOW_ID)
    return (await h.submit(request)).run_id


def check_applied(h: RayHarness, run_id: UUID, where: Path, proposal: dict[str, Any]) -> None:
    h.assert_consistent(run_id)
    events = h.outbox_events(run_id)
    assert sum(e["type"] == "ApprovalRequested" for e in events) == 1  # held on re-entry
    assert set(outcomes_per_attempt(h, run_id).values()) == {1}
    assert proposal["tool"] == "propose_change"
    arguments = proposal["arguments"]
    assert (where / "scratch" / arguments["path"]).read_text() == arguments["content"]
    assert (where / "repository" / arguments["path"]).read_text() != arguments["content"]


def test_an_approval_of_a_model_written_change_holds_on_reentry(
    h: RayHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_AGENT_REQUEST_LOG", str(tmp_path / "requests.jsonl"))
    publish(h, h.agent(agents.AGENT_ID))
    worker = agents.durable_agent_worker(h.agent(agents.AGENT_ID), wait_s=2.0)
    state: dict[str, Any] = {}

    async def scenario() -> None:
        run_id = state["run_id"] = await submit(h, tmp_path)
        state["proposal"] = await approve_as_the_reviewer(h, run_id)
        await h.wait_type(run_id, "RunCompleted", timeout=90)

    run_async(serving(h, worker, scenario)(), timeout=150)
    run_id = state["run_id"]
    check_applied(h, run_id, tmp_path, state["proposal"])
    # Four model requests in all, none made twice: the three before the approval were
    # replayed on re-entry (a fourth would have worded the plan anew and asked again).
    assert [r["turn"] for r in agents.requests_of(str(run_id))] == [1, 2, 3, 4]


def start_worker(
    h: RayHarness, tmp_path: Path, holder: str, pause_s: float
) -> subprocess.Popen[bytes]:
    log = str(tmp_path / "requests.jsonl")
    return app_worker(
        h,
        tmp_path,
        holder,
        APP,
        DURABLE_AGENT_REQUEST_LOG=log,
        DURABLE_AGENT_PAUSE_S=str(pause_s),
    )


def test_a_worker_killed_mid_agent_run_and_restarted_replays_the_completed_model_requests(
    h: RayHarness, tmp_path: Path
) -> None:
    publish(h, agents.AGENT_ID)
    log = tmp_path / "requests.jsonl"

    def second_request(run_id: UUID) -> Callable[[], bool]:
        return lambda: 2 in [r["turn"] for r in agents.requests_of(str(run_id), log)]

    # Killed once the second request has started (the first one's response is in the
    # journal): the killed worker pauses 3 s per request, the restarted one does not.
    run_id, proposal, killed = killed_mid_run(
        h,
        (
            lambda: start_worker(h, tmp_path, "agent-kill-1", pause_s=3.0),
            lambda: start_worker(h, tmp_path, "agent-kill-2", pause_s=0.0),
        ),
        lambda: submit(h, tmp_path),
        second_request,
        "the second model request",
        lambda run_id: approve_as_the_reviewer(h, run_id),
    )
    check_applied(h, run_id, tmp_path, proposal)
    made = agents.requests_of(str(run_id), log)
    per_turn = Counter(r["turn"] for r in made)
    # The first request was replayed by the restarted worker, not made again; the one in
    # flight at the kill had no response to keep and was made again; the rest once each.
    assert per_turn == {1: 1, 2: 2, 3: 1, 4: 1}, made
    assert [r["pid"] for r in made if r["turn"] == 1] == [killed]
