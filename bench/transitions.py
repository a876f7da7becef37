"""Committed commands and state transitions per second through run hosts, cold activation,
idle memory.

The driver sends a lease grant and an outcome report per step, the outcome also dispatching the
next step. Each command commits its rows, outbox events and journal entries together,
version-guarded (alone, or as one subtransaction of a group). A command commits one or more
state transitions of the run, its steps and attempts, each with its own recovery-journal entry
(the spec's "journal of transitions"): a lease grant is one (attempt Dispatched -> Leased); an
outcome is four (attempt Leased -> Succeeded, step Running -> Succeeded, next attempt ->
Dispatched, next step Pending -> Running) or three on the last step (the attempt, its step, and
the run Running -> Completed): 19 per run of 4 steps and 8 commands. Both rates are printed
beside pgbench's rate for the bare UPDATE + outbox INSERT on the same server, in the same run.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

import ray

from actors.placement import HostRouter
from actors.run_host import ensure_hosts, host_config, make_router
from runcontrol.bootstrap import Container, build, build_database
from runcontrol.client import RunControlClient
from runcontrol.commands import AcquireLease, OpenAttempts, ReportOutcome, SubmitRequest, SubmitRun
from runcontrol.config import Settings
from runcontrol.domain import AttemptOutcome, Principal, Role, WorkflowDefinition, canonical_hash

from .common import mean, percentile

STEPS = 4
OUTCOME = canonical_hash({"ok": True})


@dataclass
class Figures:
    commands_per_s: float
    transitions_per_s: float  # recovery-journal entries committed per second
    commands: int
    transitions: int
    seconds: float
    cold_p50_ms: float
    cold_p99_ms: float
    idle_bytes_per_activation: float
    commands_per_actor_call: float
    commands_per_commit: float
    # SubmitRun through the hosts (no HTTP), the same concurrent drivers: what a user counts
    submissions_per_s: float
    submission_p50_ms: float
    submission_p95_ms: float


async def _drive_run(router: HostRouter, tenant: str, run_id: uuid.UUID, holder: str) -> int:
    """Lease + outcome for every step of one run; returns the commands committed."""
    commands = 0
    for _ in range(STEPS):  # each step succeeds at once, so the run has STEPS attempts
        open_ids = await router.send(OpenAttempts(tenant_id=tenant, run_id=run_id))
        if not open_ids:
            break
        attempt_id = open_ids[0]
        grant = await router.send(
            AcquireLease(tenant_id=tenant, run_id=run_id, attempt_id=attempt_id, holder=holder)
        )
        await router.send(
            ReportOutcome(
                tenant_id=tenant,
                run_id=run_id,
                attempt_id=attempt_id,
                holder=holder,
                fencing_token=grant.fencing_token,
                outcome=AttemptOutcome.SUCCEEDED,
                outcome_hash=OUTCOME,
            )
        )
        commands += 2
    return commands


async def _submit_many(
    client: RunControlClient,
    principal: Principal,
    n: int,
    concurrency: int,
    latencies: list[float] | None = None,
) -> list[uuid.UUID]:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> uuid.UUID:
        async with sem:
            started = time.perf_counter()
            result = await client.send(
                SubmitRun(
                    tenant_id=principal.tenant_id,
                    run_id=uuid.uuid4(),
                    principal=principal,
                    request=SubmitRequest(
                        principal.project_id, f"bench-{uuid.uuid4()}", "bench", "m", {"i": i}
                    ),
                )
            )
            if latencies is not None:
                latencies.append((time.perf_counter() - started) * 1000)
            return result.run_id

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def _throughput(
    router: HostRouter, tenant: str, runs: list[uuid.UUID], concurrency: int
) -> tuple[int, float]:
    queue: asyncio.Queue[uuid.UUID] = asyncio.Queue()
    for run_id in runs:
        queue.put_nowait(run_id)
    total = 0

    async def worker(k: int) -> None:
        nonlocal total
        while not queue.empty():
            run_id = queue.get_nowait()
            done = await _drive_run(router, tenant, run_id, f"bench-worker-{k}")
            total += done  # not `total += await ...`: that reads total before awaiting

    started = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return total, time.perf_counter() - started


async def _cold_activations(
    router: HostRouter, handles: list[Any], tenant: str, runs: list[uuid.UUID]
) -> list[float]:
    await asyncio.gather(*(h.deactivate_all.remote() for h in handles))
    latencies = []
    for run_id in runs:
        started = time.perf_counter()
        await router.send(OpenAttempts(tenant_id=tenant, run_id=run_id))
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


async def _idle_memory(
    router: HostRouter, handles: list[Any], tenant: str, runs: list[uuid.UUID]
) -> float:
    """Bytes per idle activation: every run activated (loaded from Postgres), then the deep
    size of what the hosts cache for them."""
    await asyncio.gather(*(h.deactivate_all.remote() for h in handles))
    sem = asyncio.Semaphore(32)

    async def touch(run_id: uuid.UUID) -> None:
        async with sem:
            await router.send(OpenAttempts(tenant_id=tenant, run_id=run_id))

    await asyncio.gather(*(touch(r) for r in runs))
    sizes = [await h.activation_bytes.remote() for h in handles]
    return sum(s["bytes"] for s in sizes) / max(sum(s["activations"] for s in sizes), 1)


def _tenant_with_workflow(settings: Settings, owner_url: str) -> tuple[Container, str, Principal]:
    """A fresh tenant with the benchmark workflow published, and its requester."""
    db = build_database(settings, owner_url=owner_url)
    container = build(settings, db=db, migrate=False)
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    container.releases.publish(
        tenant,
        WorkflowDefinition.from_dict(
            {"workflowId": "bench", "steps": [{"agentId": f"a{i}"} for i in range(STEPS)]}
        ),
        "bench",
        container.env.clock.now(),
    )
    return container, tenant, Principal("bench-user", tenant, "bench", frozenset({Role.REQUESTER}))


def _journal_entries(db: Any, tenant: str) -> int:
    with db.tenant(tenant) as conn:
        return int(conn.exec_driver_sql("SELECT count(*) FROM recovery_journal").scalar_one())


def run(
    owner_url: str, *, runs: int, concurrency: int, placement: str = "hosted", host_count: int = 2
) -> Figures:
    settings = Settings.model_validate(
        {
            "grains": {"host_count": host_count, "placement": placement, "idle_seconds": 600},
            "pool_size": 16,
        }
    )
    container, tenant, principal = _tenant_with_workflow(settings, owner_url)
    db = container.db
    handles = ensure_hosts(settings, owner_url)
    router = make_router(host_config(settings, owner_url))
    client = RunControlClient(router)

    async def scenario() -> Figures:
        latencies: list[float] = []
        started = time.perf_counter()
        run_ids = await _submit_many(client, principal, runs, concurrency, latencies)
        submitting = time.perf_counter() - started
        # warm every activation first so the figure is steady-state command throughput
        await asyncio.gather(
            *(router.send(OpenAttempts(tenant_id=tenant, run_id=r)) for r in run_ids[:concurrency])
        )
        before = [await h.stats.remote() for h in handles]
        calls_before = router.batches_sent
        journal_before = _journal_entries(db, tenant)
        commands, seconds = await _throughput(router, tenant, run_ids, concurrency)
        transitions = _journal_entries(db, tenant) - journal_before
        after = [await h.stats.remote() for h in handles]
        sent = sum(a["commands"] - b["commands"] for a, b in zip(after, before, strict=True))
        groups = sum(
            a["commit_groups"] - b["commit_groups"] for a, b in zip(after, before, strict=True)
        )
        docs = sum(
            a["commit_documents"] - b["commit_documents"]
            for a, b in zip(after, before, strict=True)
        )
        batching = sent / max(router.batches_sent - calls_before, 1)
        # Idle activations are of runs still open (terminal runs deactivate at once).
        idle_ids = await _submit_many(client, principal, min(runs, 500), concurrency)
        cold = await _cold_activations(router, handles, tenant, idle_ids[:200])
        memory = await _idle_memory(router, handles, tenant, idle_ids)
        return Figures(
            commands / seconds,
            transitions / seconds,
            commands,
            transitions,
            seconds,
            percentile(cold, 50),
            percentile(cold, 99),
            memory,
            batching,
            docs / max(groups, 1),
            runs / submitting,
            percentile(latencies, 50),
            percentile(latencies, 95),
        )

    try:
        return asyncio.run(scenario())
    finally:
        for h in handles:
            ray.kill(h)
        db.dispose()


def dedicated(owner_url: str, *, runs: int) -> dict[str, float]:
    """Dedicated placement: one named actor per run (process isolation), same grain code."""
    settings = Settings.model_validate({"grains": {"placement": "dedicated"}, "pool_size": 2})
    container, tenant, principal = _tenant_with_workflow(settings, owner_url)
    db = container.db
    router = make_router(host_config(settings, owner_url))
    client = RunControlClient(router)

    async def scenario() -> dict[str, float]:
        activation = []
        run_ids = []
        for i in range(runs):
            run_id = uuid.uuid4()
            started = time.perf_counter()
            await client.send(
                SubmitRun(
                    tenant_id=tenant,
                    run_id=run_id,
                    principal=principal,
                    request=SubmitRequest(
                        "bench", f"bench-d-{i}-{uuid.uuid4()}", "bench", "m", {"i": i}
                    ),
                )
            )
            activation.append((time.perf_counter() - started) * 1000)
            run_ids.append(run_id)
        rss = [(await router._handle(f"run-{r}").stats.remote())["rss_bytes"] for r in run_ids]
        journal_before = _journal_entries(db, tenant)
        commands, seconds = await _throughput(router, tenant, run_ids, min(runs, 8))
        transitions = _journal_entries(db, tenant) - journal_before
        for r in run_ids:
            ray.kill(router._handle(f"run-{r}"))
        return {
            "commands_per_s": commands / seconds,
            "transitions_per_s": transitions / seconds,
            "activation_p50_ms": percentile(activation, 50),
            "activation_p99_ms": percentile(activation, 99),
            "bytes_per_run": mean(rss),
        }

    try:
        return asyncio.run(scenario())
    finally:
        db.dispose()


@ray.remote(num_cpus=0, max_concurrency=1000)
class _Noop:
    async def call(self, *args: Any) -> Any:
        return args[0]


def ray_noop_calls(concurrency: int, total: int = 3000) -> float:
    """Ray's own ceiling here: async actor calls/s that do nothing, same argument shape."""
    actor = _Noop.remote()  # type: ignore[attr-defined]
    ray.get(actor.call.remote(0))

    async def scenario() -> float:
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with sem:
                await actor.call.remote(i, "tenant", uuid.uuid4(), "report_outcome")

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(total)))
        return total / (time.perf_counter() - started)

    try:
        return asyncio.run(scenario())
    finally:
        ray.kill(actor)
