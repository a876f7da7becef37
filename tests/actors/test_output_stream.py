"""Streamed output from SDK agents against the real run hosts (Ray, PostgreSQL), in-cluster
session transport (issue 30, docs/streaming.md): what an async and a sync function stream is
stored in order, once, in a few writes per second, before the outcome; a worker process killed
mid-stream keeps every chunk it had acknowledged."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from uuid import UUID

from actor_harness import RayHarness, run_async
from test_sdk import sdk_worker, serving

from runcontrol.sdk import Step, SyncStep
from runcontrol.store.output import output_after

HERE = Path(__file__).resolve().parent


def output(h: RayHarness, run_id: UUID) -> list[dict[str, Any]]:
    with h.db.tenant(h.tenant) as conn:
        return output_after(conn, run_id, 0, 100_000)


def test_what_a_step_streams_is_stored_in_order_once_in_few_writes(h: RayHarness) -> None:
    h.publish({"name": "talk", "agentId": "talk"}, {"name": "sum", "agentId": "sum"})
    worker = sdk_worker()
    streams: list[Any] = []

    @worker.agent(h.agent("talk"))
    async def talk(step: Step) -> dict[str, Any]:
        streams.append(step._attempt.output)
        for i in range(300):  # ~100 tokens a second
            await step.stream(f"token {i} ")
            if i % 10 == 9:
                await asyncio.sleep(0.1)
        await step.stream({"done": True, "tokens": 300})
        return {"said": 300}

    @worker.agent(h.agent("sum"))
    def total(step: SyncStep) -> int:
        for i in range(5):
            step.stream(f"line {i}\n")
        return 5

    async def scenario() -> None:
        run_id = (await h.submit(h.request())).run_id
        await h.wait_type(run_id, "RunCompleted", timeout=60)
        found = output(h, run_id)
        assert [c["position"] for c in found] == list(range(1, 307))
        texts = [c.get("text") for c in found]
        assert texts[:300] == [f"token {i} " for i in range(300)]
        assert found[300]["data"] == {"done": True, "tokens": 300}
        assert texts[301:] == [f"line {i}\n" for i in range(5)]
        assert len({c["attemptId"] for c in found}) == 2
        # 3 s of tokens in a few writes a second, not one per token
        assert streams[0].writes <= 25, streams[0].writes
        h.assert_consistent(run_id)

    run_async(serving(h, worker, scenario)(), timeout=120)
