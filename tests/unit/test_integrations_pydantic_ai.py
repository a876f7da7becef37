"""``runcontrol.integrations.pydantic_ai`` on a step kept in memory (durable_step.py): model
requests and tool calls are journaled and replayed, an approval binds to the exact tool call,
side effects are claimed, text is streamed once, tokens are consumed once, a cancel stops the
run. The same adapter on a real cluster: tests/actors/test_integrations_agents.py."""

from __future__ import annotations

import asyncio
from typing import Any

import agent_scenarios as scenarios
import pytest
from agent_scenarios import Subject
from durable_step import MemoryStep
from pydantic_ai import Agent, ModelRetry
from pydantic_ai import messages as pm
from pydantic_ai.exceptions import ModelConnectionError
from pydantic_ai.models.function import AgentInfo, FunctionModel
from scripted_agents import PydanticPlanner, pydantic_coder

from runcontrol.domain import canonical_hash
from runcontrol.integrations.pydantic_ai import run_agent
from runcontrol.sdk._step import Parked


def subject(tool: str = "propose", push_metadata: dict[str, Any] | None = None) -> Subject:
    planner, ran = PydanticPlanner(tool), []
    agent = pydantic_coder(planner, ran, push_metadata)

    def run(step: MemoryStep, **options: Any) -> str:
        return asyncio.run(run_agent(step, agent, "add a docstring to app.py", **options)).output

    return Subject(planner, ran, run, ModelConnectionError("scripted", "connection refused"))


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

    def respond(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        retried = sum(
            1
            for m in messages
            if isinstance(m, pm.ModelRequest)
            for p in m.parts
            if getattr(p, "outcome", None) == "retried"
        )
        done = any(
            isinstance(p, pm.ToolReturnPart) and getattr(p, "outcome", None) != "retried"
            for m in messages
            if isinstance(m, pm.ModelRequest)
            for p in m.parts
        )
        if done:
            return pm.ModelResponse(parts=[pm.TextPart(f"retried {retried}")])
        return pm.ModelResponse(
            parts=[pm.ToolCallPart("flaky", {"n": retried}, tool_call_id=f"f{retried}")]
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


def test_a_provider_failure_is_transient_and_the_retry_replays_the_requests_before_it() -> None:
    scenarios.provider_failure_is_transient_and_the_retry_replays(subject())


def test_two_approvals_in_one_step_each_asked_once() -> None:
    """The lease carries the last approved hash only; the earlier decision is journaled."""
    applied: list[str] = []

    def respond(messages: list[pm.ModelMessage], info: AgentInfo) -> pm.ModelResponse:
        done = sum(
            isinstance(p, pm.ToolReturnPart)
            for m in messages
            if isinstance(m, pm.ModelRequest)
            for p in m.parts
        )
        if done == 2:
            return pm.ModelResponse(parts=[pm.TextPart("both applied")])
        patch = f"patch {'AB'[done]}"
        return pm.ModelResponse(
            parts=[pm.ToolCallPart("apply", {"patch": patch}, tool_call_id=f"apply-{done}")]
        )

    agent = Agent(FunctionModel(respond), name="two")

    @agent.tool_plain(requires_approval=True)
    def apply(patch: str) -> str:
        applied.append(patch)
        return "ok"

    def run(step: MemoryStep) -> str:
        return asyncio.run(run_agent(step, agent, "go", stream=False)).output

    step = MemoryStep()
    with pytest.raises(Parked):  # asks for A
        run(step)
    step.reenter(approved=canonical_hash(step.asked[-1]))
    with pytest.raises(Parked):  # A approved and applied; asks for B
        run(step)
    step.reenter(approved=canonical_hash(step.asked[-1]))
    assert run(step) == "both applied"  # A's approval replayed, B's matched
    assert [p["arguments"]["patch"] for p in step.asked] == ["patch A", "patch B"]
    assert applied == ["patch A", "patch B"]
