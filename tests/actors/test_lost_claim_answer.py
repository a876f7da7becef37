"""A claim whose lease was granted but whose answer was lost: the worker resends it with the
same claim id and gets the same lease back, instead of leaving it to expire unworked
(docs/reliability.md, finding 4).

The answer is lost for real, as in ``test_resend_after_host_death.py``: the test holds a lock
the grant's statement waits on, freezes the claiming host (SIGSTOP), releases the lock so the
grant commits inside PostgreSQL, waits until its answer row is visible, then kills the frozen
host (SIGKILL). The claiming host is not the run's host, so the grant itself is unharmed; the
claim is resent to the next host, which finds the grant by its claim id.

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
from actor_harness import RayHarness, poll, run_async
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from actors.placement import NAMESPACE, host_name
from actors.run_host import make_router
from runcontrol.client import Claim, RunControlClient
from runcontrol.commands import ReportOutcome, SubmitRun
from runcontrol.domain import AttemptOutcome, WorkerIdentity, canonical_hash, errors
from runcontrol.worker import Backoff, EchoExecutor, ReferenceWorker


class RecordingClient:
    """The worker's client, recording each claim's id and what it answered."""

    def __init__(self, inner: RunControlClient) -> None:
        self.inner = inner
        self.claims: list[tuple[str | None, Claim | None]] = []

    async def send(self, command: Any) -> Any:
        return await self.inner.send(command)

    async def claim(
        self,
        agent_ids: list[str],
        holder: str | WorkerIdentity,
        timeout_s: float = 30.0,
        *,
        claim_id: str | None = None,
    ) -> Claim | None:
        found = await self.inner.claim(agent_ids, holder, timeout_s, claim_id=claim_id)
        self.claims.append((claim_id, found))
        return found

    def watch(self, tenant_id: str, run_id: UUID, after_seq: int = 0, *, wait_s: float = 20.0):  # type: ignore[no-untyped-def]
        return self.inner.watch(tenant_id, run_id, after_seq, wait_s=wait_s)


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


def _waiting_on_lock(owner: Any) -> bool:
    with owner.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE '%runcontrol_apply%'"
                )
            ).scalar_one()
        )


def test_a_claim_answer_lost_with_its_host_is_resent_and_gets_the_same_lease(
    h: RayHarness, long_leases: dict[str, Any]
) -> None:
    h.publish({"name": "only", "agentId": "lost"})
    # A fresh client's first claim goes to host 0; the run lives on host 1.
    client = RecordingClient(RunControlClient(make_router(long_leases)))
    worker = ReferenceWorker(
        client,
        "lost-answer",
        {h.agent("lost"): EchoExecutor("lost", seconds=0)},
        concurrency=1,
        claim_timeout_s=5.0,
        backoff=Backoff(base_s=0.05, cap_s=0.5),
    )
    owner = create_engine(h.rt.owner_url, poolclass=NullPool)
    claiming = ray.get_actor(host_name(0), namespace=NAMESPACE)

    async def main() -> None:
        pid = (await claiming.stats.remote())["pid"]
        run_id = await submit_on_host(h, 1)
        await h.wait_type(run_id, "AttemptDispatched")
        task: asyncio.Task[None] | None = None
        try:
            with owner.connect() as lock:
                # The grant writes an outbox row: a SHARE lock makes its statement wait.
                lock.execute(text("LOCK TABLE outbox IN SHARE MODE"))
                task = asyncio.create_task(worker.run())
                await poll(lambda: _waiting_on_lock(owner), "the grant to wait", timeout=30)
                await asyncio.sleep(0.3)  # another command (a sweep) may be the one waiting
                os.kill(pid, signal.SIGSTOP)  # the claiming host can no longer answer
                lock.rollback()  # the grant goes on and commits inside PostgreSQL
            await poll(lambda: _granted(owner, "lost-answer"), "the grant to commit", timeout=30)
            assert client.claims == [], "the claim was answered before its host died"
            os.kill(pid, signal.SIGKILL)
            await h.wait_type(run_id, "RunCompleted", timeout=90)
        finally:
            worker.stop()
            if task is not None:
                await asyncio.wait_for(task, 60)

        claim_id, claim = client.claims[0]
        assert claim is not None and claim_id is not None
        stored = _answer(owner, claim_id)
        assert stored.run_id == run_id
        assert claim.run_id == run_id
        # the resent claim got the very lease the lost answer carried
        assert str(claim.grant.lease_id) == stored.grant["lease_id"]
        assert claim.fencing_token == stored.grant["fencing_token"] == 1
        (lease,) = h.leases(run_id)  # no second lease: nothing expired, nothing re-dispatched
        assert lease.lease_id == claim.grant.lease_id
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
