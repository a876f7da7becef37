"""A worker SDK app for the journaled-call tests that start ``runcontrol worker --app``
processes (``test_sdk_journal.py``, ``tests/api/test_sdk_journal_grpc.py``): its agent id
comes from the environment (each test's tenant's own). No tests here."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

from runcontrol.sdk import Step, Worker

worker = Worker("journal-test", concurrency=1, wait_s=2.0)
MARKS = Path(os.environ.get("JOURNAL_TEST_MARKS", "/tmp"))


def plan(topic: str) -> dict[str, Any]:
    """The costly call (a model's, say): counted in a file, a different answer each time."""
    with (MARKS / "plan-calls").open("a") as calls:
        calls.write(f"{topic}\n")
    return {"topic": topic, "plan": uuid.uuid4().hex}


@worker.agent(os.environ.get("JOURNAL_TEST_AGENT", "planner"))
async def planner(step: Step) -> dict[str, Any]:
    """Records its plan, then marks it (the test kills the process then) and takes a while."""
    made = await step.run("plan", plan, "release notes")
    (MARKS / f"recorded-{step.attempt_id}").write_text(made["plan"])
    await asyncio.sleep(float(os.environ.get("JOURNAL_TEST_SECONDS", "3")))
    return made
