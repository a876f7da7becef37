"""Worker round trips over gRPC beside the in-cluster client, in the same run (issue 10).

Each driver claims the next dispatched attempt of the benchmark's agent (``AcquireLease`` with
``claim_next``: one RPC that long-polls and leases) and reports it ``Succeeded``
(``ReportAttemptOutcome``), run after run of one step, first through Serve's gRPC ingress with
``GrpcWorkerClient`` (a worker outside the cluster: token, tenant-bound claims), then through
``RunControlClient`` on actor handles (a worker inside it). A round trip is one claim plus one
report: what a worker pays per attempt. The ceiling printed beside them is pgbench's, as for
every commit figure.

Usage: python -m bench.grpc_worker [--runs N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import ray
from ray import serve

from actors.ingress import ACCESS_LOG_OFF, free_port, use_fast_ingress
from actors.run_host import ensure_hosts, host_config, make_router
from runcontrol.api.auth import mint_dev_token
from runcontrol.bootstrap import build, build_database
from runcontrol.client import Claim, RunControlClient
from runcontrol.commands import ReportOutcome, SubmitRequest, SubmitRun
from runcontrol.config import Settings
from runcontrol.domain import (
    AttemptOutcome,
    Principal,
    Role,
    WorkerIdentity,
    WorkflowDefinition,
    canonical_hash,
)
from runcontrol.rpc.client import GrpcWorkerClient

from . import common

OUTCOME = canonical_hash({"ok": True})
Claimer = Callable[[], Awaitable[Claim | None]]
Sender = Callable[[Any], Awaitable[Any]]


async def _round_trips(claim: Claimer, send: Sender, n: int, drivers: int) -> tuple[float, list]:
    """``n`` claim + report round trips by ``drivers`` concurrent workers: (per second, ms)."""
    left = n
    latencies: list[float] = []

    async def driver() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            started = time.perf_counter()
            found = await claim()
            assert found is not None, "a dispatched attempt was not claimed"
            await send(
                ReportOutcome(
                    **found.fenced(), outcome=AttemptOutcome.SUCCEEDED, outcome_hash=OUTCOME
                )
            )
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(driver() for _ in range(drivers)))
    return n / (time.perf_counter() - started), latencies


def run(owner_url: str, *, runs: int, drivers: int) -> dict[str, Any]:
    from actors.grpc_ingress import grpc_options
    from serve_app import RunControlApi

    settings = Settings()
    db = build_database(settings, owner_url=owner_url)
    container = build(settings, db=db, migrate=False)
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    agent = f"a-{tenant}"
    container.releases.publish(
        tenant,
        WorkflowDefinition.from_dict({"workflowId": "bench", "steps": [{"agentId": agent}]}),
        "bench",
        container.env.clock.now(),
    )
    hosts = ensure_hosts(settings, owner_url)  # held: unreferenced, they would be collected
    client = RunControlClient(make_router(host_config(settings, owner_url)))
    grpc_port = free_port()
    os.environ["RUNCONTROL_DATABASE_URL"] = owner_url
    serve.start(
        http_options={"host": "127.0.0.1", "port": free_port()},
        grpc_options=grpc_options(grpc_port),
        logging_config=ACCESS_LOG_OFF,
    )
    secret = secrets.token_urlsafe(48)
    serve.run(
        RunControlApi.bind(database_url=owner_url, settings={"auth": {"hs256_secret": secret}}),
        name="runcontrol",
        route_prefix="/",
    )
    token = mint_dev_token(secret, tenant, "bench", "bench-worker", ["Worker"])
    principal = Principal("bench-user", tenant, "bench", frozenset({Role.REQUESTER}))

    async def submit(n: int) -> None:
        sem = asyncio.Semaphore(drivers)

        async def one(i: int) -> None:
            async with sem:
                request = SubmitRequest("bench", f"g-{uuid.uuid4()}", "bench", "m", {"i": i})
                await client.send(
                    SubmitRun(
                        tenant_id=tenant, run_id=uuid.uuid4(), principal=principal, request=request
                    )
                )

        await asyncio.gather(*(one(i) for i in range(n)))

    async def scenario() -> dict[str, Any]:
        figures: dict[str, Any] = {}
        async with GrpcWorkerClient(f"127.0.0.1:{grpc_port}", token, "bench-0") as grpc_client:
            identity = WorkerIdentity(tenant, "bench-worker", "bench-1")
            ways: dict[str, tuple[Claimer, Sender]] = {
                "grpc": (lambda: grpc_client.claim([agent], timeout_s=10.0), grpc_client.send),
                "in_cluster": (lambda: client.claim([agent], identity, 10.0), client.send),
            }
            for name, (claim, send) in ways.items():
                await submit(runs)
                await _round_trips(claim, send, min(50, runs), drivers)  # warm
                rate, latencies = await _round_trips(claim, send, runs - min(50, runs), drivers)
                figures[name] = {
                    "round_trips_per_s": rate,
                    "p50_ms": common.percentile(latencies, 50),
                    "p99_ms": common.percentile(latencies, 99),
                }
        return figures

    try:
        return asyncio.run(scenario())
    finally:
        serve.shutdown()
        for host in hosts:
            ray.kill(host)
        db.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench.grpc_worker")
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    use_fast_ingress(local_ports=True)
    with common.private_database() as url:
        common.local_ray()
        try:
            ceiling = common.pgbench_tps(url, seconds=10)
            figures = run(url, runs=args.runs, drivers=args.concurrency)
        finally:
            ray.shutdown()
    print(f"{'figure':<48}{'value':>10}{'ceiling':>10}{'ratio':>8}   p50 / p99 ms")
    for name, f in figures.items():
        rate = f["round_trips_per_s"]
        label = f"claim + report round trips/s ({name.replace('_', '-')})"
        print(
            f"{label:<48}{rate:>10.0f}{ceiling:>10.0f}{rate / ceiling:>8.2f}"
            f"   {f['p50_ms']:.1f} / {f['p99_ms']:.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
