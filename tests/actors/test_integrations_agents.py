"""The agent adapters (``runcontrol.integrations``) in the cluster: the SDK over actor-handle
sessions, real run hosts and PostgreSQL, the frameworks' scripted models (tests/
scripted_agents.py: the plan is worded anew on every model call).

- For both adapters, an approval binds to the exact tool call (its name and arguments) and a
  second identity's approval holds on re-entry: the re-entered step replays the model requests
  before it instead of asking the model again (three calls in all, not four), and the approved
  tool runs once. The model's text is the run's streamed output, each piece once.
- A worker process running an OpenAI Agents SDK agent, SIGKILLed during its second model
  request and restarted, replays the first (made once) and makes the second again.
(``test_example_durable_agent.py`` does the same for pydantic-ai, through the example.)"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from actor_harness import RayHarness, run_async
from agents import RunConfig
from scripted_agents import (
    OpenAIPlanner,
    PydanticPlanner,
    openai_coder,
    pydantic_coder,
    turns_made,
)
from test_sdk import killed_mid_run, outcomes_per_attempt, sdk_worker, serving, worker_process

from runcontrol.domain import canonical_hash
from runcontrol.integrations import openai_agents, pydantic_ai
from runcontrol.sdk import Step
from runcontrol.store.output import output_after

TASK = "add a docstring to app.py"
CODER = {"name": "code", "agentId": "coder", "gate": "approval", "sideEffectClass": "local-write"}


def pydantic_runner(ran: list[tuple[str, str]]) -> tuple[PydanticPlanner, Callable[..., Any]]:
    planner = PydanticPlanner()
    agent = pydantic_coder(planner, ran)

    async def run(step: Step) -> Any:
        return (await pydantic_ai.run_agent(step, agent, TASK)).output

    return planner, run


def openai_runner(ran: list[tuple[str, str]]) -> tuple[OpenAIPlanner, Callable[..., Any]]:
    planner = OpenAIPlanner()
    agent = openai_coder(planner, ran)
    config = RunConfig(tracing_disabled=True)

    async def run(step: Step) -> Any:
        return (await openai_agents.run_agent(step, agent, TASK, run_config=config)).final_output

    return planner, run


async def approve_as_the_reviewer(h: RayHarness, run_id: UUID) -> dict[str, Any]:
    """The call the progress showed is the one whose hash the reviewer (not the requester)
    approves."""
    requested = (await h.wait_type(run_id, "ApprovalRequested", timeout=90))["payload"]
    shown = [
        e["payload"]["payload"]["proposal"]
        for e in h.outbox_events(run_id)
        if e["type"] == "ProgressReported" and (e["payload"]["payload"] or {}).get("proposal")
    ]
    # Shown again by an execution that asked again (a retry after a crash, before the
    # request was decided): the same call each time, the model's response being replayed.
    assert [canonical_hash(p) for p in shown] == [requested["proposalHash"]] * len(shown)
    await h.approve_requested(requested)
    return dict(shown[-1])


@pytest.mark.parametrize("runner", [pydantic_runner, openai_runner], ids=["pydantic-ai", "openai"])
def test_an_approval_binds_to_the_tool_call_and_holds_on_reentry(
    h: RayHarness, runner: Callable[..., Any]
) -> None:
    h.publish(CODER)
    ran: list[tuple[str, str]] = []
    planner, run = runner(ran)
    worker = sdk_worker()
    entries: list[str | None] = []

    @worker.agent(h.agent("coder"))
    async def code(step: Step) -> dict[str, Any]:
        entries.append(step.approved_proposal_hash)
        return {"answer": await run(step)}

    state: dict[str, Any] = {}

    async def scenario() -> None:
        run_id = state["run_id"] = (await h.submit()).run_id
        state["proposal"] = await approve_as_the_reviewer(h, run_id)
        await h.wait_type(run_id, "RunCompleted", timeout=60)

    run_async(serving(h, worker, scenario)(), timeout=120)
    run_id, proposal = state["run_id"], state["proposal"]
    h.assert_consistent(run_id)
    # Exactly the call the model made on its second request, its wording of then.
    assert proposal == {"tool": "propose", "arguments": {"patch": "plan #2: add a docstring"}}
    assert entries == [None, canonical_hash(proposal)]  # parked, then re-entered approved
    assert planner.calls == 3  # the two requests before the approval were replayed
    assert ran == [("read_file", "app.py"), ("propose", "plan #2: add a docstring")]
    events = h.outbox_events(run_id)
    assert sum(e["type"] == "ApprovalRequested" for e in events) == 1
    assert set(outcomes_per_attempt(h, run_id).values()) == {1}
    with h.db.tenant(h.tenant) as conn:
        streamed = [chunk.get("text") for chunk in output_after(conn, run_id, 0, 1000)]
    # Streamed by the requests made (the replayed ones stream nothing again).
    assert "".join(filter(None, streamed)) == "plan #2: add a docstringdone"


def start_worker(
    h: RayHarness, tmp_path: Path, holder: str, pause_s: float
) -> subprocess.Popen[bytes]:
    return worker_process(
        h,
        tmp_path,
        holder,
        "agent_apps:worker",
        f"--tenant={h.tenant}",
        AGENTS_TEST_AGENT=h.agent("coder"),
        AGENTS_TEST_LOG=str(tmp_path / "calls.jsonl"),
        AGENTS_TEST_PAUSE_S=str(pause_s),
    )


def test_a_worker_killed_mid_agent_run_and_restarted_replays_the_completed_model_requests(
    h: RayHarness, tmp_path: Path
) -> None:
    h.publish(CODER)
    log = tmp_path / "calls.jsonl"

    async def submit() -> UUID:
        return (await h.submit()).run_id

    def second_request(run_id: UUID) -> Callable[[], bool]:
        return lambda: any(c["turn"] == 2 for c in turns_made(log))

    # Killed once the second request has started (the first one's response is in the
    # journal): the killed worker pauses 3 s per request, the restarted one does not.
    run_id, _, killed = killed_mid_run(
        h,
        (
            lambda: start_worker(h, tmp_path, "openai-kill-1", pause_s=3.0),
            lambda: start_worker(h, tmp_path, "openai-kill-2", pause_s=0.0),
        ),
        submit,
        second_request,
        "the second model request",
        lambda run_id: approve_as_the_reviewer(h, run_id),
    )
    h.assert_consistent(run_id)
    assert set(outcomes_per_attempt(h, run_id).values()) == {1}
    made = turns_made(log)
    # The first request was replayed by the restarted worker, not made again; the one in
    # flight at the kill had no response to keep and was made again; the last once.
    assert Counter(c["turn"] for c in made) == {1: 1, 2: 2, 3: 1}, made
    assert [c["pid"] for c in made if c["turn"] == 1] == [killed]
