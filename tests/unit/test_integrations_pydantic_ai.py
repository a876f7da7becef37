"""``runcontrol.integrations.pydantic_ai`` on a step kept in memory (durable_step.py): model
requests and tool calls are journaled and replayed, an approval binds to the exact tool call,
side effects are claimed, text is streamed once, tokens are consumed once, a cancel stops the
run. The same adapter on a real cluster: tests/actors/test_integrations_agents.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from durable_step import MemoryStep
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.usage import RequestUsage

from runcontrol.domain import canonical_hash
from runcontrol.integrations.pydantic_ai import run_agent
from runcontrol.sdk import Uncertain
from runcontrol.sdk._step import Parked


class Planner:
    """A scripted model: reads a file, proposes a patch worded differently on every call
    (the n-th call's wording), then says it is done; counts its calls."""

    def __init__(self, tool: str = "propose") -> None:
        self.calls = 0
        self.tool = tool

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        returned = [
            part
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        usage = RequestUsage(input_tokens=10, output_tokens=5)
        if not returned:
            call = ToolCallPart("read_file", {"path": "app.py"}, tool_call_id="read-1")
            return ModelResponse(parts=[call], usage=usage)
        if len(returned) == 1:
            wording = f"plan #{self.calls}: add a docstring"
            call = ToolCallPart(self.tool, {"patch": wording}, tool_call_id="propose-1")
            return ModelResponse(parts=[TextPart(wording), call], usage=usage)
        return ModelResponse(parts=[TextPart("done")], usage=usage)

    async def stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        for part in self.respond(messages, info).parts:
            if isinstance(part, TextPart):
                yield part.content
            elif isinstance(part, ToolCallPart):
                args = part.args_as_json_str()
                yield {0: DeltaToolCall(part.tool_name, args, tool_call_id=part.tool_call_id)}

    def model(self) -> FunctionModel:
        return FunctionModel(self.respond, stream_function=self.stream)


def coder(planner: Planner, ran: list[tuple[str, str]]) -> Agent[None, str]:
    agent = Agent(planner.model(), name="coder")

    @agent.tool_plain
    def read_file(path: str) -> str:
        ran.append(("read_file", path))
        return "print('hello')\n"

    @agent.tool_plain(requires_approval=True)
    def propose(patch: str) -> str:
        ran.append(("propose", patch))
        return "applied"

    @agent.tool_plain(metadata={"side_effect": True})
    def push(patch: str) -> str:
        ran.append(("push", patch))
        return "pushed"

    return agent


def run(step: MemoryStep, agent: Agent[None, str], **kw: Any) -> str:
    return asyncio.run(run_agent(step, agent, "add a docstring to app.py", **kw)).output


def test_an_approval_parks_and_the_reentered_step_replays_instead_of_asking_again() -> None:
    planner, ran = Planner(), []
    agent, step = coder(planner, ran), MemoryStep()
    with pytest.raises(Parked):
        run(step, agent)
    (proposal,) = step.asked
    assert proposal == {"tool": "propose", "arguments": {"patch": "plan #2: add a docstring"}}
    assert step.progress_data == [{"proposal": proposal}]  # what the reviewer is shown
    assert (planner.calls, ran) == (2, [("read_file", "app.py")])

    step.reenter(approved=canonical_hash(proposal))  # approved: the step runs from the start
    assert run(step, agent) == "done"
    # The two requests before the approval were replayed: the plan kept its first wording,
    # so the approval matched; only the request after the tool's result was new.
    assert planner.calls == 3
    assert ran == [("read_file", "app.py"), ("propose", "plan #2: add a docstring")]
    assert step.asked == [proposal] and step.progress_data == [{"proposal": proposal}]

    step.reenter()  # a retry of the finished step: nothing runs again
    assert run(step, agent) == "done"
    assert planner.calls == 3 and len(ran) == 2


def test_an_approval_binds_to_the_exact_arguments_of_the_call() -> None:
    planner, ran = Planner(), []
    agent, step = coder(planner, ran), MemoryStep()
    with pytest.raises(Parked):
        run(step, agent)
    other = {"tool": "propose", "arguments": {"patch": "plan #3: add a docstring"}}
    step.reenter(approved=canonical_hash(other))  # approved: a call with other arguments
    with pytest.raises(Parked):
        run(step, agent)
    assert step.asked[0] == step.asked[1] != other  # asked again for the call made
    assert ("propose", "plan #2: add a docstring") not in ran


def test_streamed_text_goes_to_the_step_once_and_tokens_are_consumed_once() -> None:
    planner, ran = Planner(), []
    agent, step = coder(planner, ran), MemoryStep()
    step.auto_approve = True  # the policy needs no human
    assert run(step, agent, token_limit="model-tokens") == "done"
    assert step.chunks == ["plan #2: add a docstring", "done"]
    assert [name for name, units in step.consumed if units > 0] == ["model-tokens"] * 3
    step.reenter()
    run(step, agent, token_limit="model-tokens")
    assert len(step.chunks) == 2 and len(step.consumed) == 3 and planner.calls == 3


def test_without_streaming_the_requests_are_journaled_too() -> None:
    planner, ran = Planner(), []
    agent, step = coder(planner, ran), MemoryStep()
    step.auto_approve = True
    assert run(step, agent, stream=False, token_limit="model-tokens") == "done"
    step.reenter()
    assert run(step, agent, stream=False, token_limit="model-tokens") == "done"
    assert planner.calls == 3 and step.chunks == []
    assert step.consumed == [("model-tokens", 15.0)] * 3  # the model's usage, once each
    assert step.calls_run["coder:model"] == 3


def test_a_side_effecting_tool_is_claimed_and_never_runs_twice() -> None:
    planner, ran = Planner(tool="push"), []
    agent, step = coder(planner, ran), MemoryStep()
    assert run(step, agent) == "done"
    assert ran[-1] == ("push", "plan #2: add a docstring")
    (call_id,) = step.claims
    assert call_id.startswith(f"{step.step_id}:coder:tool:push:")
    # A crash after the push and before its journal record: the claim holds, it is not re-run.
    del step.journal[("coder:tool:push:propose-1", 1)]
    step.reenter()
    with pytest.raises(Uncertain):
        run(step, agent)
    assert [r for r in ran if r[0] == "push"] == [("push", "plan #2: add a docstring")]


def test_a_tool_asking_for_a_retry_is_replayed_as_a_retry() -> None:
    attempts: list[str] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        retried = sum(
            1
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if getattr(p, "outcome", None) == "retried"
        )
        done = any(
            isinstance(p, ToolReturnPart) and getattr(p, "outcome", None) != "retried"
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
        )
        if done:
            return ModelResponse(parts=[TextPart(f"retried {retried}")])
        return ModelResponse(
            parts=[ToolCallPart("flaky", {"n": retried}, tool_call_id=f"f{retried}")]
        )

    agent = Agent(FunctionModel(respond), name="flaky-agent")

    @agent.tool_plain
    def flaky(n: int) -> str:
        attempts.append(f"try {n}")
        if n == 0:
            raise ModelRetry("try again with n=1")
        return "ok"

    step = MemoryStep()
    assert run(step, agent, stream=False) == "retried 1"
    step.reenter()
    assert run(step, agent, stream=False) == "retried 1"
    assert attempts == ["try 0", "try 1"]


def test_a_cancelled_run_stops_before_its_next_model_request() -> None:
    planner, ran = Planner(), []
    agent, step = coder(planner, ran), MemoryStep()
    step.cancelled = True
    with pytest.raises(asyncio.CancelledError):
        run(step, agent)
    assert planner.calls == 0
