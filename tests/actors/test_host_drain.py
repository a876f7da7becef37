"""A run host drained with commands in flight: they commit, nothing is half-written, and its
runs' next commands are served by another host at once (the drained host's refusal,
``errors.Draining``, re-routes them; leases live in the database, so a lease holder reports
with the token it holds and no lease expires on the way). Then the host is replaced, as a
drained host is, and serves again.

A command is held in flight without timing: the test holds the row lock of the run the command
writes, so its commit waits in PostgreSQL until the test lets it go.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from actor_harness import RayHarness, outcome_hash, poll, proposal_hash, run_async
from ray.exceptions import RayTaskError
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.pool import NullPool
from test_host_faults import restart_host

from actors.service import replace_host
from runcontrol.client import Claim
from runcontrol.commands import ReportOutcome, RequestApproval, SubmitRun
from runcontrol.domain import AttemptOutcome, errors
from runcontrol.store import Database

DRAINED = 0  # the host drained here; the session has two (host 1 takes its runs)


@pytest.fixture
def owner(db: Database) -> Iterator[Any]:
    engine = create_engine(db.owner_url, poolclass=NullPool)
    try:
        yield engine
    finally:
        engine.dispose()


def run_ids_on(h: RayHarness, index: int, n: int) -> list[UUID]:
    found: list[UUID] = []
    while len(found) < n:
        run_id = uuid.uuid4()
        if h.host_of(run_id) == index:
            found.append(run_id)
    return found


async def submit(h: RayHarness, run_id: UUID) -> None:
    principal = h.principal()
    result = await h.client.send(
        SubmitRun(tenant_id=h.tenant, run_id=run_id, principal=principal, request=h.request())
    )
    assert result.run_id == run_id and result.created


async def parked(h: RayHarness, run_id: UUID, holder: str) -> tuple[Claim, Any]:
    """Run ``run_id``'s gated step leased to ``holder`` and waiting for approval (the attempt
    is parked, its lease released, so no lease runs out during the test)."""
    claim = await h.claim("apply", holder=holder)
    assert claim.run_id == run_id, "claimed another run of this test's agent"
    approval = await h.client.send(RequestApproval(**claim.fenced(), proposal_hash=proposal_hash()))
    assert approval is not None
    return claim, approval


def hold_row_lock(conn: Connection, run_id: UUID) -> int:
    """Lock the run's row in ``conn``'s open transaction; answer the backend's pid."""
    conn.execute(text("SELECT 1 FROM runs WHERE run_id = :r FOR UPDATE"), {"r": run_id})
    pid: int = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    return pid


def blocked_by(owner: Any, pid: int) -> int:
    """How many statements wait for a lock the backend ``pid`` holds."""
    with owner.connect() as conn:
        query = text(
            "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"
        )
        return int(conn.execute(query, {"pid": pid}).scalar_one())


def test_a_drained_host_finishes_its_commands_and_its_runs_move_on_at_once(
    h: RayHarness, owner: Any
) -> None:
    h.publish(
        {"name": "apply", "agentId": "apply", "gate": "approval"},
        {"name": "verify", "agentId": "verify"},
    )
    host = h.rt.hosts[DRAINED]

    async def main() -> None:
        a, b = run_ids_on(h, DRAINED, 2)
        await submit(h, a)
        claim_a, approval_a = await parked(h, a, "w-a")
        await submit(h, b)
        claim_b, approval_b = await parked(h, b, "w-b")

        # A's decision is in flight on the host: its commit waits for the row lock held here.
        lock = owner.connect()
        tx = lock.begin()
        locker = hold_row_lock(lock, a)
        decide_a = asyncio.ensure_future(h.approve(approval_a))

        async def in_flight() -> bool:
            waiting = await asyncio.to_thread(blocked_by, owner, locker)
            return waiting >= 1 and (await host.stats.remote())["in_flight"] >= 1

        try:
            await poll(in_flight, "A's decision to be in flight on the host")
            drain = asyncio.ensure_future(host.drain.remote(60.0))

            async def draining() -> bool:
                return bool((await host.stats.remote())["draining"])

            await poll(draining, "the host to drain")
            # B's commands go to the other host at once: while the drained host still waits
            # for A's commit, B's decision, the claim of its resumed attempt and the new
            # holder's report are served.
            decided_b = await h.approve(approval_b)
            assert str(decided_b.state) == "Approved"
            claim_b = await h.claim("apply", holder="w-b2")
            assert claim_b.run_id == b
            reported_b = await h.client.send(
                ReportOutcome(
                    **claim_b.fenced(),
                    outcome=AttemptOutcome.SUCCEEDED,
                    outcome_hash=outcome_hash("b"),
                )
            )
            assert str(reported_b.state) == "Succeeded"
            assert not decide_a.done() and not drain.done(), "A's commit did not wait"
        finally:
            tx.rollback()
            lock.close()

        # The drain waited for A's decision, which committed; A's resumed attempt is claimed
        # and reported through the other host.
        assert str((await decide_a).state) == "Approved"
        claim_a = await h.claim("apply", holder="w-a2")
        assert claim_a.run_id == a
        reported_a = await h.client.send(
            ReportOutcome(
                **claim_a.fenced(), outcome=AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash()
            )
        )
        assert str(reported_a.state) == "Succeeded"
        report = await drain
        assert report["idle"] and report["in_flight"] == 0, report
        # ended by A's commit, not by its 60 s grace (the commands run on another loop)
        assert report["waited_s"] < 20, report
        served = (await host.stats.remote())["commands"]
        # A command refused by the drained host did nothing: each run finishes normally.
        for holder in ("v-a", "v-b"):
            verify = await h.claim("verify", holder=holder)
            await h.client.send(
                ReportOutcome(
                    **verify.fenced(),
                    outcome=AttemptOutcome.SUCCEEDED,
                    outcome_hash=outcome_hash("verify"),
                )
            )
        for run_id in (a, b):
            history = await h.history(run_id)
            assert history[-1]["type"] == "RunCompleted"
            assert [e["seq"] for e in history] == list(range(1, len(history) + 1))
            assert not [e for e in history if e["type"] == "LeaseExpired"], history
            h.assert_consistent(run_id)
        assert (await host.stats.remote())["commands"] == served, "the drained host served"

        # Replaced (a restart re-runs its constructor): the host serves again.
        await restart_host(h, DRAINED)
        assert not (await h.rt.hosts[DRAINED].stats.remote())["draining"]

    run_async(main(), timeout=120)


def test_a_draining_host_refuses_with_a_typed_retryable_error(h: RayHarness) -> None:
    """Called directly (no router to re-route it), a draining host answers ``Draining``: the
    sender knows the command did nothing and may be sent again."""
    h.publish({"name": "only", "agentId": "a"})

    async def main() -> None:
        (run_id,) = run_ids_on(h, DRAINED, 1)
        host = h.rt.hosts[DRAINED]
        await host.drain.remote(0.0)
        try:
            principal = h.principal()
            command = SubmitRun(
                tenant_id=h.tenant, run_id=run_id, principal=principal, request=h.request()
            )
            with pytest.raises(RayTaskError) as refused:
                await host.command.remote(command)
            cause = refused.value.cause
            assert type(cause) is errors.Draining, type(cause)
            assert cause.retryable and cause.details["retry_after"] >= 1
            with pytest.raises(RayTaskError) as refused:
                await host.claim.remote([h.agent("a")], "w-1", 0.0)
            assert type(refused.value.cause) is errors.Draining
            # Through a router, the same submission is served by the other host.
            result = await h.client.send(command)
            assert result.run_id == run_id and result.created
        finally:
            before = await host.stats.remote()
            replaced = await replace_host(DRAINED, 0.0)  # what `runcontrol hosts --replace` does
            assert replaced["idle"], replaced

        async def serving_again() -> bool:
            try:
                stats = await host.stats.remote()
            except Exception:  # restarting: not answering yet
                return False
            return stats["pid"] != before["pid"] and not stats["draining"]

        await poll(serving_again, "the replaced host to serve", timeout=30, interval=0.1)

    run_async(main(), timeout=90)
