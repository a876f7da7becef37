"""The worker SDK over gRPC (``GrpcSessionTransport`` through Serve's gRPC ingress), as a
worker outside the cluster runs it: SDK agents complete runs, holders named from the token;
a cancel reaches a running async function as ``CancelledError`` and its attempt settles
``Cancelled`` within 5 s."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from grpc_harness import WORKER_SUB, GrpcTenant
from support import endless_agent

from runcontrol.commands import CancelRun
from runcontrol.domain import canonical_hash
from runcontrol.rpc.exchange import GrpcSessionTransport
from runcontrol.sdk import Backoff, Step, Worker, token_identity


def serve_over_grpc(
    g: GrpcTenant,
    grpc_port: int,
    worker: Worker,
    scenario: Callable[[], Awaitable[None]],
    timeout: float = 90,
) -> None:
    token = g.worker_token()

    async def main() -> None:
        transport = GrpcSessionTransport(f"127.0.0.1:{grpc_port}", token)
        task = asyncio.create_task(worker.run(transport, token_identity(token, "sdk-g")))
        try:
            async with asyncio.timeout(timeout):
                await scenario()
        finally:
            worker.stop()
            await asyncio.wait_for(task, 30)
            await transport.close()

    asyncio.run(main())


def test_sdk_agents_complete_runs_over_grpc(g: GrpcTenant, grpc_port: int) -> None:
    g.view.publish()
    worker = Worker("sdk-grpc", concurrency=2, wait_s=2.0, backoff=Backoff(0.05, 0.5))
    holders: list[str] = []

    @worker.agent(g.view.agent)
    async def only(step: Step) -> dict[str, Any]:
        holders.append(step.holder)
        await step.progress("working", {"input": step.input})
        call = await step.tool_call("note", {"run": str(step.run_id)})
        if call.proceed:
            await call.complete({"noted": True})
        return {"done": str(step.run_id)}

    run_ids: list[str] = []

    async def scenario() -> None:
        for _ in range(3):
            run_ids.append(await asyncio.to_thread(g.view.submit))
        for run_id in run_ids:
            view = await asyncio.to_thread(
                lambda r=run_id: g.view.wait_state(r, "Completed", "Failed", timeout=60)
            )
            assert view["state"] == "Completed", view

    serve_over_grpc(g, grpc_port, worker, scenario)
    assert worker.completed == 3
    assert all(h.startswith(f"{WORKER_SUB}/sdk-g.") for h in holders), holders
    for run_id in run_ids:
        history = g.view.requester().get(f"/factory/runs/{run_id}/events/history").json()
        recorded = [e["payload"] for e in history if e["type"] == "AttemptOutcomeRecorded"]
        assert [r["outcomeHash"] for r in recorded] == [canonical_hash({"done": run_id})]
        assert sum(e["type"] == "ProgressReported" for e in history) == 1


def test_a_step_handed_back_is_retried_at_once_and_completes(g: GrpcTenant, grpc_port: int) -> None:
    """``step.hand_back``: the first attempt gives itself back (no outcome from the function);
    it settles TimedOut without waiting for its lease to expire, and the retry completes."""
    g.view.publish()
    worker = Worker("sdk-grpc", concurrency=2, wait_s=2.0, backoff=Backoff(0.05, 0.5))
    attempts: list[int] = []

    @worker.agent(g.view.agent)
    async def only(step: Step) -> dict[str, Any]:
        attempts.append(step.attempt)
        if step.attempt == 1:
            await step.hand_back("a resource this worker needs is missing")
        return {"attempt": step.attempt}

    async def scenario() -> None:
        run_id = await asyncio.to_thread(g.view.submit)
        view = await asyncio.to_thread(
            lambda: g.view.wait_state(run_id, "Completed", "Failed", timeout=60)
        )
        assert view["state"] == "Completed", view
        history = g.view.requester().get(f"/factory/runs/{run_id}/events/history").json()
        handed = [e["payload"] for e in history if e["type"] == "LeaseHandedBack"]
        assert [h["reason"] for h in handed] == ["a resource this worker needs is missing"]
        outcomes = [
            e["payload"]["outcome"] for e in history if e["type"] == "AttemptOutcomeRecorded"
        ]
        assert outcomes == ["TimedOut", "Succeeded"]

    serve_over_grpc(g, grpc_port, worker, scenario)
    assert attempts == [1, 2] and worker.completed == 1


def test_a_cancel_reaches_an_async_function_over_grpc_within_5s(
    g: GrpcTenant, grpc_port: int
) -> None:
    g.view.publish()
    worker = Worker("sdk-grpc", concurrency=1, wait_s=2.0, backoff=Backoff(0.05, 0.5))
    started, interrupted = endless_agent(worker, g.view.agent)

    async def scenario() -> None:
        run_id = await asyncio.to_thread(g.view.submit)
        await asyncio.wait_for(started.wait(), 30)
        t0 = time.monotonic()
        await g.view.runtime.client.send(
            CancelRun(tenant_id=g.tenant, run_id=UUID(run_id), requested_by="ops", reason="stop")
        )
        await asyncio.wait_for(interrupted.wait(), 5)  # fails if the function ran on
        view = await asyncio.to_thread(lambda: g.view.wait_state(run_id, "Cancelled", timeout=5))
        assert time.monotonic() - t0 < 5
        (step,) = view["steps"]
        assert [a["state"] for a in step["attempts"]] == ["Cancelled"]

    serve_over_grpc(g, grpc_port, worker, scenario)
