"""``runcontrol.integrations.openai_agents`` on a step kept in memory (durable_step.py): model
responses and function tools are journaled and replayed, a ``needs_approval`` interruption
becomes an approval of exactly that call, side effects are claimed, text is streamed once,
tokens are consumed once, a cancel stops the run. On a real cluster:
tests/actors/test_integrations_agents.py."""

from __future__ import annotations

import asyncio
from typing import Any

import agent_scenarios as scenarios
import httpx2
import openai
import pytest
from agent_scenarios import Subject
from agents import Agent, RunConfig
from agents.testing import ScriptedModel, function_call
from durable_step import MemoryStep
from scripted_agents import OpenAIPlanner, openai_coder

from runcontrol.domain import canonical_hash
from runcontrol.integrations.openai_agents import run_agent
from runcontrol.sdk._step import Parked


def subject(tool: str = "propose") -> Subject:
    planner, ran = OpenAIPlanner(tool), []
    agent = openai_coder(planner, ran)
    config = RunConfig(tracing_disabled=True)

    def run(step: MemoryStep, **options: Any) -> Any:
        answer = run_agent(step, agent, "add a docstring to app.py", run_config=config, **options)
        return asyncio.run(answer).final_output

    return Subject(
        planner,
        ran,
        run,
        openai.APIConnectionError(request=httpx2.Request("POST", "https://api.invalid/v1")),
    )


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


def test_a_provider_failure_is_transient_and_the_retry_replays_the_requests_before_it() -> None:
    scenarios.provider_failure_is_transient_and_the_retry_replays(subject())


def test_an_agent_handed_off_to_is_journaled_too() -> None:
    planner, ran = OpenAIPlanner(), []
    coder = openai_coder(planner, ran)
    # The triage model answers once: a second call would raise (UnexpectedModelCall).
    triage_model = ScriptedModel([[function_call("transfer_to_coder", {}, call_id="handoff")]])
    triage = Agent(name="triage", model=triage_model, handoffs=[coder])
    config, step = RunConfig(tracing_disabled=True), MemoryStep()

    def run() -> Any:
        answer = run_agent(step, triage, "add a docstring", run_config=config, stream=False)
        return asyncio.run(answer).final_output

    with pytest.raises(Parked):  # the coder proposes (the handoff's output counts as one)
        run()
    step.reenter(approved=canonical_hash(step.asked[-1]))
    assert run() == "done"
    assert planner.calls == 2 and ran == [("propose", "plan #1: add a docstring")]
