"""Streamed output from SDK agents against the real run hosts (Ray, PostgreSQL), in-cluster
session transport (issue 30, docs/streaming.md): what an async and a sync function stream is
stored in order, once, in a few writes per second, before the outcome; a worker process killed
mid-stream keeps every chunk it had acknowledged."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path
from typing import Any
from uuid import UUID

from actor_harness import RayHarness, poll, run_async
from support import stop_processes
from test_sdk import sdk_worker, serving, worker_process

from runcontrol.sdk import Step, SyncStep
from runcontrol.store.output import output_after


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


def test_a_worker_killed_mid_stream_keeps_what_was_acknowledged(
    h: RayHarness, tmp_path: Path
) -> None:
    h.publish({"name": "talk", "agentId": "stream"})
    marks = {"SDK_TEST_MARKS": str(tmp_path), "SDK_TEST_STREAM": h.agent("stream")}
    first = worker_process(h, tmp_path, "out-kill-1", "test_sdk_apps:worker", **marks)
    second: subprocess.Popen[bytes] | None = None

    def acked() -> int:
        found = list(tmp_path.glob("acked-*"))
        return int(found[0].read_text()) if found else 0

    async def scenario() -> tuple[UUID, int]:
        nonlocal second
        run_id = (await h.submit()).run_id
        await poll(lambda: acked() >= 100, "100 chunks acknowledged", timeout=60)
        first.send_signal(signal.SIGKILL)  # mid-stream: chunks queued and in flight are lost
        first.wait(10)
        seen = acked()
        second = worker_process(h, tmp_path, "out-kill-2", "test_sdk_apps:worker", **marks)
        await h.wait_type(run_id, "RunCompleted", timeout=90)
        return run_id, seen

    try:
        run_id, seen = run_async(scenario(), timeout=150)
    finally:
        stop_processes(first, second)
    found = output(h, run_id)
    attempts = list(dict.fromkeys(c["attemptId"] for c in found))
    assert len(attempts) == 2  # the killed attempt's output, then its retry's
    killed = [c["text"] for c in found if c["attemptId"] == attempts[0]]
    assert len(killed) >= seen  # every chunk acknowledged before the kill stayed
    assert killed == [f"1:{i}" for i in range(len(killed))]  # in order, no gap
    retried = [c["text"] for c in found if c["attemptId"] == attempts[1]]
    assert retried == [f"2:{i}" for i in range(50)]
    assert [c["position"] for c in found] == list(range(1, len(found) + 1))
    h.assert_consistent(run_id)
