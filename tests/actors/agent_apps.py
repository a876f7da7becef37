"""The worker app for the agent-adapter tests that start ``runcontrol worker --app``
processes (``test_integrations_agents.py``): an OpenAI Agents SDK coder run by
``runcontrol.integrations.openai_agents``, its scripted model logging each call to
``AGENTS_TEST_LOG`` and pausing ``AGENTS_TEST_PAUSE_S`` per call; the agent id comes from the
environment, so each test's is its tenant's own. No tests here."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from agents import RunConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the scripted agents
from scripted_agents import OpenAIPlanner, openai_coder  # noqa: E402

from runcontrol.integrations import openai_agents  # noqa: E402
from runcontrol.sdk import Step, Worker  # noqa: E402

TASK = "add a docstring to app.py"
worker = Worker("agents-test", concurrency=1, wait_s=2.0)


@worker.agent(os.environ.get("AGENTS_TEST_AGENT", "openai-coder"))
async def coder(step: Step) -> dict[str, Any]:
    log = Path(os.environ.get("AGENTS_TEST_LOG", "/tmp/agents-test.jsonl"))
    planner = OpenAIPlanner(log=log, pause_s=float(os.environ.get("AGENTS_TEST_PAUSE_S", "0")))
    agent = openai_coder(planner, [])
    config = RunConfig(tracing_disabled=True)
    result = await openai_agents.run_agent(step, agent, TASK, run_config=config)
    return {"answer": result.final_output}
