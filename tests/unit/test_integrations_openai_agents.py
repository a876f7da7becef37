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
from agents import RunConfig
from durable_step import MemoryStep
from scripted_agents import OpenAIPlanner, openai_coder

from runcontrol.integrations.openai_agents import run_agent


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
