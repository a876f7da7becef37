"""A rolling upgrade with runs in flight (issue 23, item 4; docs/operations.md).

Runs are open in every way a run waits: leased to a worker mid-step (the holder keeps its claim
and reports only after the upgrade), parked waiting for an approval, and pending (dispatched,
no worker yet). Then every run host is replaced one by one with ``replace_host`` (what
``runcontrol hosts --replace K`` calls), and between the two replacements the next release's
migration is applied to the live database through the real machinery (``Database.migrate``
with ``tests/upgrade_migrations``: a nullable column, declared to keep this release working),
so the second host restarts, and every host serves, on a schema newer than its code. Then
every open run completes: each step has one attempt and one outcome, no lease expired, and
each run's fencing tokens increase strictly in the order they were granted.

The hosts of this module grant two-minute leases (``long_leases``): a lease held across the
upgrade does not run out while a host restarts (the session's are two seconds).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from actor_harness import RayHarness, outcome_hash, proposal_hash, run_async
from reference_worker import Backoff, EchoExecutor, ReferenceWorker
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from actors.run_host import make_router
from actors.service import replace_host
from runcontrol.client import Claim
from runcontrol.commands import ReportOutcome, RequestApproval, SubmitRun
from runcontrol.domain import AttemptOutcome
from runcontrol.store import Database
from runcontrol.store.functions import revisions
from runcontrol.store.schema import SchemaVersion

HEAD = revisions()[-1]
NEXT_RELEASE = Path(__file__).resolve().parent.parent / "upgrade_migrations"
PER_KIND = 2  # runs of each kind on each host


@pytest.fixture
def next_release(db: Database) -> Iterator[Any]:
    """Applies the next release's migrations up to a revision (9001: compatible; 9002: keeps
    no older code) to the session's live database when called; afterwards takes them back out
    (the column dropped, the revision and marker this release's again), so the session's
    other tests run on the schema they ship with."""

    def migrate(revision: str = "9001") -> None:
        newer = Database(db.owner_url)
        try:
            newer.migrate(revision, more_versions=[NEXT_RELEASE])
        finally:
            newer.dispose()

    yield migrate
    owner = create_engine(db.owner_url, poolclass=NullPool)
    try:
        with owner.begin() as conn:
            conn.execute(text("ALTER TABLE runs DROP COLUMN IF EXISTS upgrade_note"))
            conn.execute(text("UPDATE alembic_version SET version_num = :head"), {"head": HEAD})
    finally:
        owner.dispose()
    db.migrate()  # records this release's marker again
    assert db.schema_version().revision == HEAD


def on_host(h: RayHarness, index: int) -> UUID:
    return next(r for r in iter(uuid.uuid4, None) if h.host_of(r) == index)


async def submit(h: RayHarness, run_id: UUID, workflow_id: str) -> UUID:
    result = await h.client.send(
        SubmitRun(
            tenant_id=h.tenant,
            run_id=run_id,
            principal=h.principal(),
            request=h.request(workflow_id=workflow_id),
        )
    )
    assert result.created and result.run_id == run_id
    return run_id


async def report(h: RayHarness, claim: Claim, n: Any) -> str:
    reported = await h.client.send(
        ReportOutcome(
            **claim.fenced(), outcome=AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash(n)
        )
    )
    return str(reported.state)


async def host_pids(h: RayHarness) -> list[int]:
    return [(await host.stats.remote())["pid"] for host in h.rt.hosts]


def test_every_open_run_completes_across_a_rolling_upgrade(
    h: RayHarness, db: Database, long_leases: dict[str, Any], next_release: Any
) -> None:
    h.publish({"name": "work", "agentId": "up-work"}, workflow_id="leased")
    h.publish({"name": "apply", "agentId": "up-apply", "gate": "approval"}, workflow_id="gated")
    h.publish({"name": "queued", "agentId": "up-queued"}, workflow_id="pending")
    hosts = h.rt.settings.grains.host_count
    assert db.schema_version().revision == HEAD

    async def main() -> None:
        # ---- runs open in every way a run waits, on every host
        leased: dict[UUID, Claim] = {}
        parked: dict[UUID, Any] = {}
        pending: list[UUID] = []
        for index in range(hosts):
            for _ in range(PER_KIND):
                run_id = await submit(h, on_host(h, index), "leased")
                claim = await h.claim("up-work", holder=f"w-{run_id.hex[:6]}")
                leased[claim.run_id] = claim
                run_id = await submit(h, on_host(h, index), "gated")
                claim = await h.claim("up-apply", holder=f"g-{run_id.hex[:6]}")
                approval = await h.client.send(
                    RequestApproval(**claim.fenced(), proposal_hash=proposal_hash())
                )
                parked[claim.run_id] = approval
                run_id = await submit(h, on_host(h, index), "pending")
                await h.wait_type(run_id, "AttemptDispatched")
                pending.append(run_id)
        assert len(leased) == len(parked) == hosts * PER_KIND

        # ---- the upgrade: hosts replaced one by one, the migration applied in between
        before = await host_pids(h)
        early = next(iter(leased))
        for index in range(hosts):
            drained = await replace_host(index, grace_s=30.0)
            assert drained["idle"], drained
            if index == 0:
                await asyncio.to_thread(next_release)
                assert db.schema_version() == SchemaVersion("9001", HEAD)
                # Runs move on while old and new hosts serve the migrated schema.
                assert await report(h, leased.pop(early), "early") == "Succeeded"
        after = await host_pids(h)
        assert all(a != b for a, b in zip(after, before, strict=True)), (before, after)
        assert db.schema_version() == SchemaVersion("9001", HEAD)

        # ---- every open run completes
        for n, claim in enumerate(leased.values()):  # the holders report with their tokens
            assert await report(h, claim, n) == "Succeeded"
        for approval in parked.values():
            decided = await h.approve(approval)
            assert str(decided.state) == "Approved"
        for n in range(len(parked)):
            claim = await h.claim("up-apply", holder=f"g2-{n}")
            assert claim.run_id in parked
            assert await report(h, claim, f"apply-{n}") == "Succeeded"
        worker = ReferenceWorker(
            make_router(long_leases),
            "after-upgrade",
            {h.agent("up-queued"): EchoExecutor("queued", seconds=0)},
            concurrency=2,
            claim_timeout_s=5.0,
            backoff=Backoff(base_s=0.05, cap_s=0.5),
        )
        task = asyncio.create_task(worker.run())
        try:
            for run_id in pending:
                await h.wait_type(run_id, "RunCompleted", timeout=60)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 60)
        assert worker.completed == len(pending)

        # ---- no outcome lost, none doubled, tokens strictly increasing per run
        for run_id in [early, *leased, *parked, *pending]:
            assert h.run_row(run_id).state == "Completed"
            (attempt,) = h.attempts(run_id)  # one attempt: nothing expired or re-dispatched
            assert attempt.state == "Succeeded"
            types = [e["type"] for e in h.outbox_events(run_id)]
            assert types.count("AttemptOutcomeRecorded") == 1, types
            assert types.count("RunCompleted") == 1 and "LeaseExpired" not in types, types
            granted = h.leases(run_id)
            tokens = [lease.fencing_token for lease in granted]
            assert all(a < b for a, b in zip(tokens, tokens[1:], strict=False)), tokens
            assert len(tokens) == (2 if run_id in parked else 1), tokens
            assert granted[-1].release_cause == "OutcomeReported"
            h.assert_consistent(run_id)

    run_async(main(), timeout=420)


def test_a_host_replaced_onto_a_schema_that_keeps_no_older_code_refuses_in_one_line(
    h: RayHarness, db: Database, long_leases: dict[str, Any], next_release: Any
) -> None:
    """The other half: a newer schema whose marker excludes this release. The replaced host's
    constructor refuses it, Ray does not restart it, and ``replace_host`` (``runcontrol hosts
    --replace``) says why in one line at once. (The next test starts the hosts again, on the
    schema restored: ``long_leases``.)"""
    next_release("9002")
    assert db.schema_version() == SchemaVersion("9002", "9002")
    with pytest.raises(RuntimeError) as refused:
        run_async(replace_host(1, grace_s=5.0), timeout=100)
    assert str(refused.value) == (
        "runcontrol-host-1 did not serve again (it failed to start):"
        " runcontrol.store.schema.SchemaMismatch: the database schema is at revision 9002,"
        f" which needs code at 9002 or newer; this release is {HEAD}: run the new release here"
        " (a rolling upgrade replaces this process, docs/operations.md)"
    )
