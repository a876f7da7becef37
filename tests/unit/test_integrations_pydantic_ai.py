"""``runcontrol.integrations.pydantic_ai`` on a step kept in memory (durable_step.py): model
requests and tool calls are journaled and replayed, an approval binds to the exact tool call,
side effects are claimed, text is streamed once, tokens are consumed once, a cancel stops the
run. The same adapter on a real cluster: tests/actors/test_integrations_agents.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import agent_scenarios as scenarios
import pytest
from agent_scenarios import Subject
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

from runcontrol.integrations.pydantic_ai import run_agent


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


def coder(
    planner: Planner, ran: list[tuple[str, str]], push_metadata: dict[str, Any] | None = None
) -> Agent[None, str]:
    agent = Agent(planner.model(), name="coder")

    @agent.tool_plain
    def read_file(path: str) -> str:
        ran.append(("read_file", path))
        return "print('hello')\n"

    @agent.tool_plain(requires_approval=True)
    def propose(patch: str) -> str:
        ran.append(("propose", patch))
        return "applied"

    @agent.tool_plain(metadata=push_metadata)
    def push(patch: str) -> str:
        ran.append(("push", patch))
        return "pushed"

    return agent


def subject(tool: str = "propose", push_metadata: dict[str, Any] | None = None) -> Subject:
    planner, ran = Planner(tool), []
    agent = coder(planner, ran, push_metadata)

    def run(step: MemoryStep, **options: Any) -> str:
        return asyncio.run(run_agent(step, agent, "add a docstring to app.py", **options)).output

    return Subject(lambda: planner.calls, ran, run)


@pytest.mark.parametrize("stream", [False, True])
def test_an_approval_parks_and_the_reentered_step_replays_instead_of_asking_again(
    stream: bool,
) -> None:
    step = scenarios.approval_parks_and_the_reentered_step_replays(subject(), stream=stream)
    assert step.calls_run["coder:model"] == 3


def test_an_approval_binds_to_the_exact_arguments_of_the_call() -> None:
    scenarios.approval_binds_to_the_exact_arguments(subject())


def test_tokens_are_consumed_once_per_model_request() -> None:
    scenarios.tokens_are_consumed_once_per_model_request(subject())


def test_a_streamed_request_consumes_its_tokens_once() -> None:
    s, step = subject(), MemoryStep()
    step.auto_approve = True
    assert s.run(step, token_limit="model-tokens") == "done"
    step.reenter()
    s.run(step, token_limit="model-tokens")
    assert [name for name, units in step.consumed if units > 0] == ["model-tokens"] * 3


@pytest.mark.parametrize("declared", ["metadata", "side_effects"])
def test_a_side_effecting_tool_is_claimed_and_never_runs_twice(declared: str) -> None:
    if declared == "metadata":  # on the tool
        s, options = subject("push", {"side_effect": True}), {}
    else:  # by the caller
        s, options = subject("push"), {"side_effects": {"push"}}
    scenarios.side_effecting_tool_never_runs_twice(s, **options)


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
    for _ in range(2):  # the first execution, then a retry
        step.reenter()
        assert asyncio.run(run_agent(step, agent, "go", stream=False)).output == "retried 1"
    assert attempts == ["try 0", "try 1"]


def test_a_cancelled_run_stops_before_its_next_model_request() -> None:
    scenarios.cancelled_run_stops_before_its_next_model_request(subject())
