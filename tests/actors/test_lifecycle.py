"""The agent-run lifecycle with real hosts, scheduler and reference workers (issue 11):
a cancellation reaches the worker holding the lease, which stops its executor and reports
``Cancelled`` itself; runs waiting for a human do not starve the others."""

from __future__ import annotations

import asyncio
from typing import Any

from actor_harness import RayHarness, run_async
from reference_worker import Backoff, ReferenceWorker

from runcontrol.commands import CancelRun


class Forever:
    """Works until stopped: only a cancellation ends its attempt."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()

    async def propose(self, input: dict[str, Any] | None) -> dict[str, Any]:
        return {}

    async def execute(self, input: dict[str, Any] | None) -> dict[str, Any]:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.stopped.set()
            raise
        return {}


class Quick:
    async def propose(self, input: dict[str, Any] | None) -> dict[str, Any]:
        return {"plan": (input or {}).get("n")}

    async def execute(self, input: dict[str, Any] | None) -> dict[str, Any]:
        return {"done": True}


def worker(h: RayHarness, name: str, executors: dict[str, Any], **kw: Any) -> ReferenceWorker:
    return ReferenceWorker(
        h.client,
        name,
        executors,
        renew_every_s=kw.pop("renew_every_s", 0.5),
        claim_timeout_s=1.0,
        lease_grace_s=5.0,
        backoff=Backoff(base_s=0.05, cap_s=0.5),
        **kw,
    )


def test_a_cancel_stops_the_holders_executor_and_the_holder_reports_cancelled(
    h: RayHarness,
) -> None:
    """The worker learns of the cancellation from the run's events (not from its lease
    expiring: renewals keep the lease alive), stops its executor, and settles its own
    attempt ``Cancelled``; the run ends ``Cancelled``."""
    h.publish({"name": "long", "agentId": "long"})
    executor = Forever()
    w = worker(h, "stopper", {h.agent("long"): executor}, concurrency=1)

    async def scenario() -> None:
        task = asyncio.create_task(w.run())
        try:
            submitted = await h.submit()
            await asyncio.wait_for(executor.started.wait(), 30)
            await h.client.send(
                CancelRun(
                    tenant_id=h.tenant,
                    run_id=submitted.run_id,
                    requested_by="ops",
                    reason="changed my mind",
                )
            )
            await asyncio.wait_for(executor.stopped.wait(), 30)
            await h.wait_type(submitted.run_id, "RunCancelled", timeout=30)
        finally:
            w.stop()
            await asyncio.wait_for(task, 30)
        (attempt,) = h.attempts(submitted.run_id)
        assert attempt.state == "Cancelled"
        assert attempt.settled_by == attempt.holder  # the holder reported it, no reconciler
        assert h.run_row(submitted.run_id).state == "Cancelled"

    run_async(scenario(), timeout=90)


def test_runs_waiting_for_approval_do_not_starve_the_others(h: RayHarness) -> None:
    """Ten runs wait for a human decision while two reference workers have one slot each: the
    waits hold no slot (each attempt is parked and its lease released), so an eleventh run,
    which needs no approval, still completes; and an approved run is resumed by whichever
    worker claims it, with a new lease, and completes."""
    h.publish({"name": "apply", "agentId": "gated", "sideEffectClass": "shared-write"})
    h.publish({"name": "read", "agentId": "free"}, workflow_id="plain")
    executors = {h.agent("gated"): Quick(), h.agent("free"): Quick()}
    workers = [worker(h, f"w{n}", executors, concurrency=1) for n in (1, 2)]

    async def scenario() -> None:
        tasks = [asyncio.create_task(w.run()) for w in workers]
        try:
            gated = [await h.submit(h.request(input={"n": i})) for i in range(10)]
            requested = [await h.wait_type(r.run_id, "AttemptParked", timeout=60) for r in gated]
            plain = await h.submit(h.request(workflow_id="plain"))
            await h.wait_type(plain.run_id, "RunCompleted", timeout=60)
            assert all(h.run_row(r.run_id).state == "WaitingForApproval" for r in gated)
            assert all(not [x for x in h.leases(r.run_id) if x.released_at is None] for r in gated)

            first = gated[0].run_id
            (approval,) = [
                e["payload"] for e in h.outbox_events(first) if e["type"] == "ApprovalRequested"
            ]
            await h.approve_requested(approval)
            await h.wait_type(first, "RunCompleted", timeout=60)
        finally:
            for w in workers:
                w.stop()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        (attempt,) = h.attempts(first)
        leases = sorted(h.leases(first), key=lambda x: x.fencing_token)
        assert [x.release_cause for x in leases][0] == "ParkedForApproval"
        assert len(leases) == 2 and leases[1].fencing_token > leases[0].fencing_token
        assert attempt.state == "Succeeded" and attempt.settled_by == leases[1].holder
        assert requested[0]["payload"]["holder"] == leases[0].holder
        # The other nine still wait, parked, and hold nothing.
        assert {a.state for r in gated[1:] for a in h.attempts(r.run_id)} == {"Parked"}

    run_async(scenario(), timeout=150)
