"""Worker SDK apps for the tests that start ``runcontrol worker --app`` processes
(``test_sdk.py``): agent ids come from the environment, so each test's are its tenant's own.
No tests here."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from runcontrol.sdk import Step, Worker

worker = Worker("sdk-test", concurrency=1, wait_s=2.0)
MARKS = Path(os.environ.get("SDK_TEST_MARKS", "/tmp"))


@worker.agent(os.environ.get("SDK_TEST_SLOW", "slow"))
async def slow(step: Step) -> dict[str, Any]:
    """Marks its start (attempt id) and takes a while: a test kills its process meanwhile."""
    (MARKS / f"started-{step.attempt_id}").write_text(str(step.attempt))
    await asyncio.sleep(float(os.environ.get("SDK_TEST_SLOW_SECONDS", "3")))
    return {"slow": step.attempt}


@worker.agent(os.environ.get("SDK_TEST_QUICK", "quick"))
async def quick(step: Step) -> dict[str, Any]:
    return {"quick": True}


@worker.agent(os.environ.get("SDK_TEST_STREAM", "stream"))
async def stream(step: Step) -> int:
    """Streams a chunk every 10 ms and marks how many the store acknowledged (every 20): a
    test kills its process meanwhile. A retry streams 50 and ends."""
    output = step._attempt.output  # its flush answers once the store has every chunk queued
    for i in range(50 if step.attempt > 1 else 100_000):
        await step.stream(f"{step.attempt}:{i}")
        if i % 20 == 19:
            await output.flush()
            # written aside, then renamed: a reader never sees the file half written
            aside = MARKS / f"writing-{step.attempt_id}"
            aside.write_text(str(i + 1))
            aside.replace(MARKS / f"acked-{step.attempt_id}")
        await asyncio.sleep(0.01)
    return step.attempt


not_a_worker = object()
