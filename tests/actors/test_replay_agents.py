"""Replay against a newer release in the cluster (docs/replay.md): a run of two pydantic-ai
agents on ``FunctionModel``s (the SDK over actor-handle sessions, real run hosts and PostgreSQL)
completes on release 1 (a change approved by a reviewer and pushed as a side effect, then a
summary written under a prompt); release 2 changes only the summary's prompt.

- Replayed on release 2: the unchanged step's four model requests, its approval and its push
  are answered from the original's journal (no live model call, no approval asked, nothing
  pushed: the tool-call table holds the original's claim only); the changed step's request
  differs from the original's, so it fails ``replay-diverged`` and the report says so.
- Replayed with ``liveCalls``: the changed step's request is made live and its different
  result is in the report (a JSON diff); still no other live call and no second push.
- Replayed with ``liveCalls`` on release 3, whose change step's prompt makes the model propose
  another patch: the replay asks for approval of it and waits for a human (the report names
  the changed approval); nothing is pushed."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any
from uuid import UUID

from actor_harness import PROJECT, RayHarness, run_async
from pydantic_ai import Agent
from pydantic_ai import messages as pm
from pydantic_ai.models.function import AgentInfo, FunctionModel
from test_sdk import sdk_worker, serving

from runcontrol.commands import ReplayRun
from runcontrol.domain import Principal, Role
from runcontrol.integrations import pydantic_ai
from runcontrol.sdk import Step
from runcontrol.store import replays
from runcontrol.store.tables import tool_calls

PATCH = {"patch": "add a docstring"}
CHANGE = {
    "name": "change",
    "agentId": "changer",
    "gate": "approval",
    "sideEffectClass": "local-write",
}


def summary(agent: str) -> dict[str, Any]:
    return {"name": "summary", "agentId": agent, "dependsOn": ["change"]}


class Agents:
    """The agents of the workflow, their model requests counted per agent and prompt."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.pushed: list[str] = []
        self.changer = self.changing()

    def changing(self, instructions: str | None = None) -> Agent[None, str]:
        changer = Agent(FunctionModel(self.change), name="changer", instructions=instructions)
        changer.tool_plain(requires_approval=True)(self.propose)
        changer.tool_plain(self.push)
        return changer

    def change(self, messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        """propose (approved), push (a side effect), then done; instructed, it proposes
        another patch."""
        told = info.instructions
        self.requests["changer" if told is None else f"changer ({told})"] += 1
        patch = PATCH if told is None else {"patch": f"add a docstring, {told}"}
        turn = sum(isinstance(m, pm.ModelRequest) for m in messages)
        if turn == 1:
            return pm.ModelResponse(parts=[pm.ToolCallPart("propose", patch, tool_call_id="p1")])
        if turn == 2:
            return pm.ModelResponse(parts=[pm.ToolCallPart("push", patch, tool_call_id="u1")])
        return pm.ModelResponse(parts=[pm.TextPart("changed")])

    def propose(self, patch: str) -> str:
        return f"proposed {patch}"

    def push(self, patch: str) -> str:
        self.pushed.append(patch)
        return "pushed"

    def writer(self, prompt: str) -> Agent[None, str]:
        def write(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
            self.requests[prompt] += 1
            return pm.ModelResponse(parts=[pm.TextPart(f"summary ({info.instructions})")])

        return Agent(FunctionModel(write), name="writer", instructions=prompt)


def test_a_replay_on_a_release_changing_one_prompt(h: RayHarness) -> None:
    agents = Agents()
    worker = sdk_worker()

    for version, changer in (("changer", agents.changer), ("changer-2", agents.changing("v2"))):

        @worker.agent(h.agent(version))
        async def change(step: Step, changer: Agent[None, str] = changer) -> dict[str, Any]:
            found = await pydantic_ai.run_agent(
                step, changer, "change app.py", stream=False, side_effects={"push"}
            )
            return {"answer": found.output}

    for version, prompt in (("writer-1", "be brief"), ("writer-2", "be thorough")):
        writer = agents.writer(prompt)

        @worker.agent(h.agent(version))
        async def write(step: Step, writer: Agent[None, str] = writer) -> dict[str, Any]:
            found = await pydantic_ai.run_agent(step, writer, "summarise", stream=False)
            return {"answer": found.output}

    h.publish(CHANGE, summary("writer-1"))
    runs: dict[str, UUID] = {}

    async def replay(of: UUID, **options: Any) -> UUID:
        operator = Principal("olga", h.tenant, PROJECT, frozenset({Role.OPERATOR}))
        command = ReplayRun(
            tenant_id=h.tenant,
            run_id=uuid.uuid4(),
            principal=operator,
            reason="before moving latest",
            replay_of=of,
            **options,
        )
        return (await h.client.send(command)).run_id

    async def scenario() -> None:
        original = runs["original"] = (await h.submit()).run_id
        requested = (await h.wait_type(original, "ApprovalRequested", timeout=90))["payload"]
        await h.approve_requested(requested)
        await h.wait_type(original, "RunCompleted", timeout=60)
        assert agents.requests == {"changer": 3, "be brief": 1}
        h.publish(CHANGE, summary("writer-2"))  # release 2: `latest` now
        refused = runs["refused"] = await replay(original)
        await h.wait_type(refused, "RunFailed", timeout=60)
        assert agents.requests == {"changer": 3, "be brief": 1}  # not one live call
        live = runs["live"] = await replay(original, live_calls=True)
        await h.wait_type(live, "RunCompleted", timeout=60)
        # release 3 changes the change step's prompt: its live request proposes another patch
        h.publish(dict(CHANGE, agentId="changer-2"), summary("writer-2"))
        parked = runs["parked"] = await replay(original, live_calls=True)
        await h.wait_type(parked, "ApprovalRequested", timeout=60)

    run_async(serving(h, worker, scenario)(), timeout=240)
    # Only the changed steps' requests were made live: the summary's once, the changed
    # proposal's once (it waits for a human: no push).
    assert agents.requests == {"changer": 3, "be brief": 1, "be thorough": 1, "changer (v2)": 1}
    assert agents.pushed == ["add a docstring"]  # the side effect ran once, in the original
    assert len(h.rows(tool_calls, runs["original"])) == 1
    assert h.rows(tool_calls, runs["refused"]) == h.rows(tool_calls, runs["live"]) == []
    for replayed in ("refused", "live"):  # the approval reused: nobody was asked again
        types = [e["type"] for e in h.outbox_events(runs[replayed])]
        assert "ApprovalRequested" not in types
    with h.db.tenant(h.tenant) as conn:
        refused = replays.replay_report(conn, runs["refused"])
        live = replays.replay_report(conn, runs["live"])
    steps = {s["step"]: s for s in refused["steps"]}
    assert steps["change"]["equal"]
    assert not steps["summary"]["equal"]
    assert steps["summary"]["replayFailureClass"] == "replay-diverged"
    assert [c["name"] for c in refused["originalCallsNotMade"]] == ["writer:model"]
    steps = {s["step"]: s for s in live["steps"]}
    assert steps["change"]["equal"] and live["replayState"] == "Completed"
    assert steps["summary"]["diff"] == [
        {"path": "$.answer", "before": "summary (be brief)", "after": "summary (be thorough)"}
    ]
    assert [c["name"] for c in live["callsNotInOriginal"]] == ["writer:model"]
    with h.db.tenant(h.tenant) as conn:
        parked = replays.replay_report(conn, runs["parked"])
    assert parked["replayState"] == "WaitingForApproval"
    (changed,) = parked["approvalsChanged"]  # the proposal changed: a human decides
    assert changed["step"] == "change"
    assert h.rows(tool_calls, runs["parked"]) == []
