"""Step graphs on the real hosts (issue 22): a fan-out of three steps, each on its own
worker, runs at once (their attempt intervals overlap) and the fan-in step starts only after
all three succeeded; a terminal failure of one branch stops the others, which settle through
their holders, and the run ends Failed with every attempt settled."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from actor_harness import RayHarness, run_async
from reference_worker import Backoff, EchoExecutor, ReferenceWorker
from test_host_faults import restart_host

from runcontrol.store.tables import outbox, steps

FAN = [
    {"name": "plan", "agentId": "plan"},
    {"name": "a", "agentId": "branch-a", "dependsOn": ["plan"]},
    {"name": "b", "agentId": "branch-b", "dependsOn": ["plan"]},
    {"name": "c", "agentId": "branch-c", "dependsOn": ["plan"]},
    {"name": "join", "agentId": "join", "dependsOn": ["a", "b", "c"]},
]


class UntilStopped:
    """Works until its attempt is cancelled (the worker cancels the executor's task)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def propose(self, input: dict[str, Any] | None) -> dict[str, Any]:
        return {}

    async def execute(self, input: dict[str, Any] | None) -> dict[str, Any]:
        self.started.set()
        await asyncio.sleep(3600)
        return {}


class FailsOnceOthersRun:
    """Fails permanently, once its siblings are working (so they are held, not just
    dispatched, when the run fails)."""

    def __init__(self, *siblings: UntilStopped) -> None:
        self.siblings = siblings

    async def propose(self, input: dict[str, Any] | None) -> dict[str, Any]:
        return {}

    async def execute(self, input: dict[str, Any] | None) -> dict[str, Any]:
        await asyncio.wait_for(asyncio.gather(*(s.started.wait() for s in self.siblings)), 30)
        raise RuntimeError("this branch cannot succeed")  # any other exception: permanent


def workers(h: RayHarness, executors: dict[str, Any]) -> list[ReferenceWorker]:
    """One worker (one slot) per agent: a fan-out can only overlap across workers."""
    return [
        ReferenceWorker(
            h.client,
            f"{agent}-worker",
            {h.agent(agent): executor},
            renew_every_s=0.5,
            claim_timeout_s=1.0,
            lease_grace_s=5.0,
            backoff=Backoff(base_s=0.05, cap_s=0.5),
            concurrency=1,
        )
        for agent, executor in executors.items()
    ]


async def running(ws: list[ReferenceWorker], body: Any) -> Any:
    tasks = [asyncio.create_task(w.run()) for w in ws]
    try:
        return await body
    finally:
        for w in ws:
            w.stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)


def intervals(h: RayHarness, run_id: Any) -> dict[str, tuple[Any, Any, int, int]]:
    """Per step name: (lease granted, outcome recorded, their event seqs) from the events."""
    by_step = {r.step_id: r.name for r in h.rows(steps, run_id)}
    start: dict[Any, tuple[Any, int]] = {}
    end: dict[Any, tuple[Any, int]] = {}
    for row in h.rows(outbox, run_id, outbox.c.seq):
        if row.event_type == "LeaseGranted":
            start[row.step_id] = (row.occurred_at, row.seq)
        elif row.event_type == "AttemptOutcomeRecorded":
            end[row.step_id] = (row.occurred_at, row.seq)
        elif row.event_type == "AttemptDispatched" and row.step_id not in start:
            start.setdefault(row.step_id, (row.occurred_at, row.seq))
    return {by_step[s]: (start[s][0], end[s][0], start[s][1], end[s][1]) for s in start if s in end}


def test_a_fan_out_runs_at_once_and_the_fan_in_waits_for_all(h: RayHarness) -> None:
    h.publish(*FAN)
    ws = workers(
        h,
        {
            "plan": EchoExecutor("plan", 0.0),
            "branch-a": EchoExecutor("a", 2.0),
            "branch-b": EchoExecutor("b", 2.0),
            "branch-c": EchoExecutor("c", 2.0),
            "join": EchoExecutor("join", 0.0),
        },
    )

    async def scenario() -> Any:
        run_id = (await h.submit()).run_id
        await h.wait_type(run_id, "RunCompleted", timeout=60)
        return run_id

    run_id = run_async(running(ws, scenario()), timeout=90)
    spans = intervals(h, run_id)
    branches = [spans[n] for n in ("a", "b", "c")]
    # Overlap: every branch started before any of them ended.
    assert max(s for s, _, _, _ in branches) < min(e for _, e, _, _ in branches)
    holders = {a.holder for a in h.attempts(run_id)}
    assert len(holders) == 5  # each step on its own worker
    join_start_seq = spans["join"][2]
    assert all(end_seq < join_start_seq for _, _, _, end_seq in branches)
    assert spans["plan"][3] < min(start_seq for _, _, start_seq, _ in branches)
    assert h.run_row(run_id).state == "Completed"


def test_a_terminal_failure_of_one_branch_stops_the_others_and_fails(h: RayHarness) -> None:
    h.publish(*FAN)
    b, c = UntilStopped(), UntilStopped()
    ws = workers(
        h,
        {
            "plan": EchoExecutor("plan", 0.0),
            "branch-a": FailsOnceOthersRun(b, c),
            "branch-b": b,
            "branch-c": c,
            "join": EchoExecutor("join", 0.0),
        },
    )

    async def scenario() -> Any:
        run_id = (await h.submit(h.request())).run_id
        await h.wait_type(run_id, "RunFailed", timeout=60)
        return run_id

    run_id = run_async(running(ws, scenario()), timeout=90)
    assert h.run_row(run_id).state == "Failed"
    types = [e["type"] for e in h.outbox_events(run_id)]
    assert "CancellationRequested" in types and "RunCancelled" not in types
    attempts = {a.step_id: a for a in h.attempts(run_id)}
    by_name = {s.name: s for s in h.rows(steps, run_id)}
    assert all(a.settled_at is not None for a in attempts.values())
    assert attempts[by_name["a"].step_id].state == "Failed"
    for name in ("b", "c"):
        attempt = attempts[by_name[name].step_id]
        assert attempt.state == "Cancelled"
        assert attempt.settled_by == attempt.holder  # observed from its holder, as a cancel
    assert by_name["join"].state == "Cancelled" and by_name["join"].step_id not in attempts


def test_a_wait_step_fires_once_after_every_host_was_killed_during_the_wait(
    h: RayHarness,
) -> None:
    """The timer is the run's durable reminder (a row's due time), not a host's memory: with
    every run host killed (and restarted by Ray, empty) while the step waits, the scheduler's
    sweep wakes the run from Postgres and the step succeeds exactly once."""
    h.publish(
        {"name": "plan", "agentId": "plan"},
        {"name": "pause", "kind": "wait", "seconds": 8, "agentId": "unused"},  # ignored
        {"name": "after", "agentId": "after"},
    )
    ws = workers(h, {"plan": EchoExecutor("plan", 0.0), "after": EchoExecutor("after", 0.0)})

    async def scenario() -> Any:
        run_id = (await h.submit()).run_id
        waiting = await h.wait_type(run_id, "StepWaiting", timeout=30)
        killing = datetime.now(UTC)
        # every host killed at once (each restarts empty), well before the timer is due
        await asyncio.gather(*(restart_host(h, i) for i in range(len(h.rt.hosts))))
        pause = next(s for s in h.rows(steps, run_id) if s.name == "pause")
        assert killing + timedelta(seconds=5) < pause.due_at
        await h.wait_type(run_id, "RunCompleted", after=waiting["seq"], timeout=60)
        return run_id

    run_id = run_async(running(ws, scenario()), timeout=120)
    types = [e["type"] for e in h.outbox_events(run_id)]
    assert types.count("StepWaiting") == 1 and types.count("StepWaitEnded") == 1
    by_name = {s.name: s for s in h.rows(steps, run_id)}
    assert by_name["pause"].state == "Succeeded"
    assert by_name["pause"].step_id not in {a.step_id for a in h.attempts(run_id)}  # no worker
    ended = next(e for e in h.outbox(run_id) if e.event_type == "StepWaitEnded")
    assert ended.occurred_at >= by_name["pause"].due_at


def test_a_fan_out_runs_at_once_on_sdk_workers_through_the_sessions(h: RayHarness) -> None:
    """The same fan-out with the worker SDK over the hosts' sessions: several attempts of one
    run open at once, each granted (fused with its dispatch, or claimed) to its own worker."""
    from actors.run_host import make_router
    from runcontrol.sdk import Backoff, Step, Worker

    h.publish(*FAN)
    workers: dict[str, Worker] = {}
    for agent in ("plan", "branch-a", "branch-b", "branch-c", "join"):
        worker = Worker(
            "sdk-fan", concurrency=1, wait_s=2.0, backoff=Backoff(base_s=0.05, cap_s=0.5)
        )
        seconds = 2.0 if agent.startswith("branch") else 0.0

        async def work(step: Step, seconds: float = seconds) -> dict[str, Any]:
            await asyncio.sleep(seconds)
            return {"done": True}

        worker.agent(h.agent(agent))(work)
        workers[agent] = worker

    async def scenario() -> Any:
        router = make_router(h.rt.config)
        tasks = [asyncio.create_task(w.run(router, f"{agent}-sdk")) for agent, w in workers.items()]
        try:
            run_id = (await h.submit()).run_id
            await h.wait_type(run_id, "RunCompleted", timeout=60)
            return run_id
        finally:
            for w in workers.values():
                w.stop()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)

    run_id = run_async(scenario(), timeout=120)
    spans = intervals(h, run_id)
    branches = [spans[n] for n in ("a", "b", "c")]
    assert max(s for s, _, _, _ in branches) < min(e for _, e, _, _ in branches)
    assert all(end_seq < spans["join"][2] for _, _, _, end_seq in branches)
    assert len({a.holder for a in h.attempts(run_id)}) == 5
