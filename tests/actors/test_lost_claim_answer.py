"""A grant whose answer was lost: the worker resends its credit with the same claim id
(``resent``) and gets the same lease back, instead of leaving it to expire unworked
(docs/reliability.md, finding 4).

The answer is lost for real, as in ``test_resend_after_host_death.py``: the test holds a lock
the grant's statement, and no other, waits on (the run's next outbox row), waits until it
waits, freezes the granting host (SIGSTOP), releases the lock so the
grant commits inside PostgreSQL, waits until its answer row is visible, then kills the frozen
host (SIGKILL). The restarted host knows nothing of the session: the resent credit finds the
grant by its claim id in the store.

The hosts of this module grant two-minute leases (the session's are two seconds, shorter than
a host's restart), so a run completing here did not wait for its lease to expire.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from typing import Any
from uuid import UUID

import pytest
import ray
from actor_harness import RayHarness, hold_next_event, poll, run_async, waiting_on
from reference_worker import Backoff, EchoExecutor, ReferenceWorker
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from actors.placement import NAMESPACE, HostRouter, host_name
from actors.run_host import make_router
from runcontrol.client import RunControlClient
from runcontrol.commands import ReportOutcome, SubmitRun
from runcontrol.domain import AttemptOutcome, canonical_hash, errors
from runcontrol.workers.protocol import Credit, Grant, SessionDown, SessionUp


class RecordingTransport:
    """The worker's session transport, recording each exchange's credits and grants."""

    def __init__(self, inner: HostRouter) -> None:
        self.inner = inner
        self.sent: list[Credit] = []
        self.grants: list[Grant] = []

    async def hosts(self) -> int:
        return await self.inner.hosts()

    async def exchange(self, host: int, up: SessionUp) -> SessionDown:
        self.sent.extend(up.credits)
        down = await self.inner.exchange(host, up)
        self.grants.extend(down.grants)
        return down


async def submit_on_host(h: RayHarness, index: int) -> UUID:
    """Submit a run whose grain lives on host ``index``."""
    run_id = next(r for r in iter(uuid.uuid4, None) if h.host_of(r) == index)
    principal = h.principal()
    await h.client.send(
        SubmitRun(tenant_id=h.tenant, run_id=run_id, principal=principal, request=h.request())
    )
    return run_id


def _answer(owner: Any, claim_id: str) -> Any:
    with owner.connect() as conn:
        return conn.execute(
            text(
                "SELECT run_id, answer->'value' AS grant FROM command_answers"
                " WHERE command_id = :id AND command = 'AcquireLease'"
            ),
            {"id": claim_id},
        ).first()


def test_a_grant_lost_with_its_host_is_found_again_by_the_resent_credit(
    h: RayHarness, long_leases: dict[str, Any]
) -> None:
    h.publish({"name": "only", "agentId": "lost"})
    transport = RecordingTransport(make_router(long_leases))
    worker = ReferenceWorker(
        transport,
        "lost-answer",
        {h.agent("lost"): EchoExecutor("lost", seconds=0)},
        concurrency=1,
        claim_timeout_s=5.0,
        backoff=Backoff(base_s=0.05, cap_s=0.5),
    )
    owner = create_engine(h.rt.owner_url, poolclass=NullPool)
    granting = ray.get_actor(host_name(0), namespace=NAMESPACE)

    async def main() -> None:
        pid = (await granting.stats.remote())["pid"]
        run_id = await submit_on_host(h, 0)
        await h.wait_type(run_id, "AttemptDispatched")
        task: asyncio.Task[None] | None = None
        try:
            with owner.connect() as lock:
                # The grant writes the run's next outbox row: held here, it makes it wait.
                holder = hold_next_event(lock, h.tenant, run_id)
                task = asyncio.create_task(worker.run())
                await poll(lambda: waiting_on(owner, holder), "the grant to wait", timeout=30)
                os.kill(pid, signal.SIGSTOP)  # the granting host can no longer answer
                lock.rollback()  # the grant goes on and commits inside PostgreSQL
            await poll(lambda: _granted(owner, "lost-answer"), "the grant to commit", timeout=30)
            assert transport.grants == [], "the grant came down before its host died"
            os.kill(pid, signal.SIGKILL)
            await h.wait_type(run_id, "RunCompleted", timeout=90)
        finally:
            worker.stop()
            if task is not None:
                await asyncio.wait_for(task, 60)

        (grant,) = {g.claim_id: g for g in transport.grants}.values()
        stored = _answer(owner, grant.claim_id)
        assert stored.run_id == run_id
        # the resent credit got the very lease the lost answer carried
        assert any(c.resent and c.claim_id == grant.claim_id for c in transport.sent)
        assert str(grant.lease.lease_id) == stored.grant["lease_id"]
        assert grant.lease.fencing_token == stored.grant["fencing_token"] == 1
        (lease,) = h.leases(run_id)  # no second lease: nothing expired, nothing re-dispatched
        assert lease.lease_id == grant.lease.lease_id
        assert lease.release_cause == "OutcomeReported"
        assert lease.released_at < lease.expires_at
        (attempt,) = h.attempts(run_id)
        assert attempt.state == "Succeeded"
        types = [e["type"] for e in h.outbox_events(run_id)]
        assert "LeaseExpired" not in types
        assert worker.completed == 1
        h.assert_consistent(run_id)
        fresh = ray.get_actor(host_name(0), namespace=NAMESPACE)
        assert (await fresh.stats.remote())["pid"] != pid

    try:
        run_async(main(), timeout=240)
    finally:
        owner.dispose()


def _granted(owner: Any, holder: str) -> bool:
    """A lease of ``holder`` is committed, with its claim's stored answer."""
    with owner.connect() as conn:
        found = conn.execute(
            text(
                "SELECT count(*) FROM command_answers a JOIN leases l"
                " ON l.lease_id = (a.answer->'value'->>'lease_id')::uuid"
                " WHERE a.command = 'AcquireLease' AND l.holder = :holder"
            ),
            {"holder": holder},
        ).scalar_one()
    return bool(found)


def test_a_claim_id_answers_its_current_lease_to_its_holder_only(
    h: RayHarness, long_leases: dict[str, Any]
) -> None:
    """The resend semantics without a fault: the same claim id gets the same lease while it is
    current; another holder with that id is refused; once the lease is released the id grants
    nothing more for that run."""
    h.publish({"name": "only", "agentId": "resent"})
    agents = [h.agent("resent")]
    client = RunControlClient(make_router(long_leases))

    async def main() -> None:
        run_id = await submit_on_host(h, 0)
        await h.wait_type(run_id, "AttemptDispatched")
        claim_id = str(uuid.uuid4())
        first = await client.claim(agents, "w-1", 10.0, claim_id=claim_id)
        assert first is not None and first.run_id == run_id
        again = await client.claim(agents, "w-1", 10.0, claim_id=claim_id)
        assert again == first
        with pytest.raises(errors.IdempotencyConflict):
            await client.claim(agents, "w-2", 0.0, claim_id=claim_id)
        await client.send(
            ReportOutcome(
                **first.fenced(),
                outcome=AttemptOutcome.SUCCEEDED,
                outcome_hash=canonical_hash({"done": 1}),
            )
        )
        await h.wait_type(run_id, "RunCompleted")
        assert await client.claim(agents, "w-1", 0.0, claim_id=claim_id) is None
        assert len(h.leases(run_id)) == 1

    run_async(main(), timeout=120)
