"""``runcontrol.integrations.openai_agents`` on a step kept in memory (durable_step.py): model
responses and function tools are journaled and replayed, a ``needs_approval`` interruption
becomes an approval of exactly that call, side effects are claimed, text is streamed once,
tokens are consumed once, a cancel stops the run. On a real cluster:
tests/actors/test_integrations_agents.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import agent_scenarios as scenarios
import pytest
from agent_scenarios import Subject
from agents import Agent, RunConfig, function_tool
from agents.items import ModelResponse, TResponseInputItem, TResponseOutputItem
from agents.items import TResponseStreamEvent as StreamEvent
from agents.models.interface import Model
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.usage import Usage
from durable_step import MemoryStep

from runcontrol.integrations.openai_agents import run_agent

USAGE = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)


class Planner(Model):
    """A scripted model: reads a file, proposes a patch worded differently on every call
    (the n-th call's wording), then says it is done; counts its calls."""

    def __init__(self, tool: str = "propose") -> None:
        self.calls = 0
        self.tool = tool

    def respond(self, input: str | list[TResponseInputItem]) -> list[TResponseOutputItem]:
        self.calls += 1
        items = [] if isinstance(input, str) else input
        returned = [i for i in items if dict(i).get("type") == "function_call_output"]
        if not returned:
            return [function_call("read_file", {"path": "app.py"}, call_id="read-1")]
        if len(returned) == 1:
            wording = f"plan #{self.calls}: add a docstring"
            return [
                assistant_message(wording),
                function_call(self.tool, {"patch": wording}, call_id="propose-1"),
            ]
        return [assistant_message("done", item_id="done")]

    def respond_to(self, request: tuple[Any, ...], options: dict[str, Any]) -> list[Any]:
        """The output for a request, its ``input`` passed by position or by name."""
        return self.respond(options["input"] if "input" in options else request[1])

    async def get_response(self, *request: Any, **options: Any) -> ModelResponse:
        output = self.respond_to(request, options)
        return ModelResponse(output=output, usage=USAGE, response_id=None)

    async def stream_response(self, *request: Any, **options: Any) -> AsyncIterator[StreamEvent]:
        one = ScriptedModel([ModelStep(output=self.respond_to(request, options), usage=USAGE)])
        async for event in one.stream_response(*request, **options):
            yield event


def coder(planner: Planner, ran: list[tuple[str, str]]) -> Agent[Any]:
    @function_tool
    def read_file(path: str) -> str:
        """Read a file."""
        ran.append(("read_file", path))
        return "print('hello')\n"

    @function_tool(needs_approval=True)
    def propose(patch: str) -> str:
        """Apply a patch."""
        ran.append(("propose", patch))
        return "applied"

    @function_tool
    def push(patch: str) -> str:
        """Push a patch."""
        ran.append(("push", patch))
        return "pushed"

    return Agent(name="coder", model=planner, tools=[read_file, propose, push])


def subject(tool: str = "propose") -> Subject:
    planner, ran = Planner(tool), []
    agent = coder(planner, ran)
    config = RunConfig(tracing_disabled=True)

    def run(step: MemoryStep, **options: Any) -> Any:
        answer = run_agent(step, agent, "add a docstring to app.py", run_config=config, **options)
        return asyncio.run(answer).final_output

    return Subject(lambda: planner.calls, ran, run)


@pytest.mark.parametrize("stream", [False, True])
def test_an_approval_parks_and_the_reentered_step_replays_instead_of_asking_again(
    stream: bool,
) -> None:
    scenarios.approval_parks_and_the_reentered_step_replays(subject(), stream=stream)


def test_an_approval_binds_to_the_exact_arguments_of_the_call() -> None:
    scenarios.approval_binds_to_the_exact_arguments(subject())


def test_tokens_are_consumed_once_per_model_response() -> None:
    scenarios.tokens_are_consumed_once_per_model_request(subject())


def test_a_side_effecting_tool_is_claimed_and_never_runs_twice() -> None:
    scenarios.side_effecting_tool_never_runs_twice(subject("push"), side_effects={"push"})


def test_a_cancelled_run_stops_before_its_next_model_request() -> None:
    scenarios.cancelled_run_stops_before_its_next_model_request(subject())
