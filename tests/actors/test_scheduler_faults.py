"""The scheduler actor: reminders live in Postgres, so a killed (restarted) scheduler loses none,
and two schedulers at once neither expire a lease twice nor dispatch an attempt twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import ray
import ray._private.state as ray_state
from actor_harness import RayHarness, outcome_hash, poll, run_async

from actors.scheduler import ensure_scheduler
from runcontrol.commands import ReportOutcome
from runcontrol.domain import AttemptOutcome

JOBS = {
    "LeaseExpiryReconciler",
    "ApprovalExpiryReconciler",
    "RunDispatcher",
    "OutboxRelay",
    "RetentionCleanup",
}


def restarts(handle: Any) -> tuple[str, int]:
    info = ray_state.actors(handle._actor_id.hex())
    return info["State"], int(info["NumRestarts"])


def test_killed_scheduler_restarts_and_loses_no_reminder(h: RayHarness) -> None:
    h.publish({"name": "only", "agentId": "a", "maxAttempts": 3})
    scheduler = h.rt.scheduler

    async def main() -> None:
        run_id = (await h.submit()).run_id
        _, restarts_before = restarts(scheduler)
        stalled = await h.claim("a", holder="w-stalled")
        # Killed right after the grant: the lease expires while the scheduler is down or
        # restarting, and only the scheduler reconciles lease expiries.
        ray.kill(scheduler, no_restart=False)

        expired = await h.wait_type(run_id, "LeaseExpired", timeout=30)
        assert expired["attemptId"] == str(stalled.attempt_id)
        assert expired["payload"]["holder"] == "w-stalled"

        def alive_again() -> int:
            state, count = restarts(scheduler)
            return count if state == "ALIVE" and count > restarts_before else 0

        count = await poll(alive_again, "the scheduler to restart", timeout=30)
        assert count == restarts_before + 1  # the same actor, restarted, not a new one
        status = await scheduler.status.remote()
        assert JOBS <= set(status["jobs"])  # __init__ re-created every job

        # The retry the expiry scheduled is dispatched by the restarted scheduler too.
        await h.wait_event(
            run_id,
            lambda e: e["type"] == "AttemptDispatched" and e["payload"]["attemptNumber"] == 2,
            "re-dispatch",
            after=expired["seq"],
        )
        retry = await h.claim("a", holder="w-ok")
        await h.client.send(
            ReportOutcome(
                **retry.fenced(), outcome=AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash()
            )
        )
        assert (await h.history(run_id))[-1]["type"] == "RunCompleted"
        expiries = [e for e in h.outbox_events(run_id) if e["type"] == "LeaseExpired"]
        assert len(expiries) == 1
        h.assert_consistent(run_id)

    run_async(main(), timeout=90)


def test_two_schedulers_neither_double_expire_nor_double_dispatch(h: RayHarness) -> None:
    h.publish({"name": "only", "agentId": "a", "maxAttempts": 2})
    second = ensure_scheduler(h.rt.settings, h.rt.owner_url, name="runcontrol-scheduler-2")
    schedulers = [h.rt.scheduler, second]
    runs_n = 4

    async def holders() -> list[bool]:
        return [bool((await s.status.remote())["holds_lock"]) for s in schedulers]

    async def main() -> None:
        # One scheduler lock: the first scheduler holds it, the second stays idle.
        assert await holders() == [True, False]
        run_ids = [(await h.submit()).run_id for _ in range(runs_n)]
        claims = [await h.claim("a", holder=f"w-stalled-{i}") for i in range(runs_n)]
        assert {c.run_id for c in claims} == set(run_ids)

        async def hammer() -> None:
            # Both schedulers also run their sweeps on demand, concurrently, while leases
            # expire and retries come due.
            for _ in range(6):
                await asyncio.gather(
                    *(
                        s.run_now.remote(job)
                        for s in schedulers
                        for job in ("LeaseExpiryReconciler", "RunDispatcher")
                    )
                )

        async def retried(run_id: Any) -> None:
            expired = await h.wait_type(run_id, "LeaseExpired", timeout=30)
            await h.wait_event(
                run_id,
                lambda e: e["type"] == "AttemptDispatched" and e["payload"]["attemptNumber"] == 2,
                "re-dispatch",
                after=expired["seq"],
            )

        await asyncio.gather(hammer(), *(retried(r) for r in run_ids))
        await hammer()

        for i in range(runs_n):
            retry = await h.claim("a", holder=f"w-ok-{i}")
            assert retry.grant.attempt_number == 2
            await h.client.send(
                ReportOutcome(
                    **retry.fenced(), outcome=AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash()
                )
            )
        for run_id in run_ids:
            assert (await h.history(run_id))[-1]["type"] == "RunCompleted"

        for run_id in run_ids:
            events = h.outbox_events(run_id)
            expiries = Counter(
                e["payload"]["leaseId"] for e in events if e["type"] == "LeaseExpired"
            )
            assert len(expiries) == 1 and set(expiries.values()) == {1}, expiries
            dispatched = [
                (e["payload"]["stepId"], e["payload"]["attemptNumber"])
                for e in events
                if e["type"] == "AttemptDispatched"
            ]
            assert sorted(n for _, n in dispatched) == [1, 2]
            assert len(dispatched) == len(set(dispatched))
            assert len(h.attempts(run_id)) == 2
            h.assert_consistent(run_id)

        for s in schedulers:
            assert JOBS <= set((await s.status.remote())["jobs"])
        assert await holders() == [True, False]
        # The idle one ran none of the hammered sweeps; its wakes are the holder's alone.
        idle = (await second.status.remote())["counters"]
        assert not idle.get("LeaseExpiryReconciler") and not idle.get("RunDispatcher"), idle

    try:
        run_async(main(), timeout=90)
    finally:
        ray.kill(second, no_restart=True)
