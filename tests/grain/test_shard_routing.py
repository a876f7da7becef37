"""A run on two shard databases (issue 41, ``store/shards.py``): routed by the virtual shard
its id carries, every row of a tenant placed on the second database is there and none in the
first, its transitions committed by the second database's statements, row-level security
inside each, and a fencing token compared within its own shard only."""

from __future__ import annotations

import asyncio
import time
import uuid
from uuid import UUID

import pytest
from grain_harness import Harness, edge_submission, placed, submit_placed, tenant_rows
from sqlalchemy import text
from support import SECOND_HALF, acquire, drive

from runcontrol.domain import StepSpec, errors
from runcontrol.domain.shards import hashed_vshard, vshard_of
from runcontrol.ids import new_run_id
from runcontrol.store.directory import Directory
from runcontrol.store.shards import Shards

# The tables a run's rows are in (its events and journal among them), and a tenant's own.
RUN_TABLES = ("runs", "steps", "attempts", "leases", "outbox", "recovery_journal")
TENANT_TABLES = ("releases", "release_aliases")


@pytest.fixture
def routed(two_shards: Shards) -> Harness:
    """A harness whose container serves both shard databases; its tenant placed on the
    second (virtual shard 700)."""
    return placed(two_shards, 700)


def run(h: Harness) -> UUID:
    """A run submitted as the edge does (its id minted in the tenant's placement), its first
    attempt leased and succeeded."""
    grain = submit_placed(h, StepSpec("plan", "agent-a"), StepSpec("write", "agent-b"))
    h.succeed(grain, h.lease(grain))
    return grain.run_id


def test_a_tenant_placed_on_the_second_database_has_every_row_there(
    routed: Harness, two_shards: Shards
):
    first, second = two_shards.all()
    sent = (first.store.statements_sent, second.store.statements_sent)
    run_id = run(routed)

    assert vshard_of(run_id) == 700 and two_shards.for_run(run_id) is second
    for table in RUN_TABLES + TENANT_TABLES:
        assert tenant_rows(first.db, table, routed.tenant) == 0, table
        assert tenant_rows(second.db, table, routed.tenant) > 0, table
    # each transition committed with its event and journal entry, by the second database's
    # statements alone (one runcontrol_apply document each)
    assert first.store.statements_sent == sent[0]
    assert second.store.statements_sent > sent[1]
    events, journal = routed.outbox(run_id), routed.journal(run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # gap-free, in shard 2
    assert {r.entity for r in journal} >= {"Run", "Step", "Attempt"}
    assert routed.load(run_id).run.state == "Running"


def test_every_process_derives_a_runs_database_from_its_id(two_shards: Shards):
    """Two processes' own ``Shards`` (a host's, the edge's) route the same ids alike, with no
    lookup; an id minted before shards (version 4) is the first database's."""
    first, second = two_shards.all()
    elsewhere = Shards([first.db, second.db])  # another process's cache of the directory
    for vshard, index in ((3, 0), (SECOND_HALF - 1, 0), (SECOND_HALF, 1), (1023, 1)):
        run_id = new_run_id("any", lambda _tenant, v=vshard: v)
        assert two_shards.for_run(run_id).index == elsewhere.for_run(run_id).index == index
    assert elsewhere.for_run(uuid.uuid4()).index == 0
    tenant = next(f"t{n}" for n in range(1000) if hashed_vshard(f"t{n}") >= SECOND_HALF)
    assert elsewhere.for_tenant(tenant) is elsewhere.all()[1]  # not placed: by its hash


def test_row_level_security_holds_inside_each_shard(routed: Harness, two_shards: Shards):
    run_id = run(routed)
    second = two_shards.all()[1].db
    other = f"t-{uuid.uuid4().hex[:10]}"
    with second.tenant(other) as conn:  # another tenant, in the same database
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM outbox")).scalar_one() == 0
    with second.tenant(routed.tenant) as conn:
        assert conn.execute(text("SELECT run_id FROM runs")).scalar_one() == run_id


def test_a_fencing_token_is_compared_within_its_own_shard(two_shards: Shards):
    """Two tenants, one per database, each with a leased attempt: a lease holder's report
    naming the other shard's attempt is refused in its own run, and each shard's lease stands."""
    harnesses = []
    for vshard in (5, 700):
        h = placed(two_shards, vshard)
        grain = submit_placed(h, StepSpec("only", "agent-a"))
        harnesses.append((h, grain, acquire(grain, h.open_attempt(grain.run_id).attempt_id)))
    (h0, grain0, grant0), (h1, grain1, grant1) = harnesses
    assert two_shards.for_run(grain0.run_id).index == 0
    assert two_shards.for_run(grain1.run_id).index == 1
    assert grant0.fencing_token == grant1.fencing_token  # each shard counts its own

    with pytest.raises(errors.RunControlError):
        acquire(grain1, grant0.attempt_id)  # the first shard's attempt is not the run's
    h1.succeed(grain1, grant1)
    h0.succeed(grain0, grant0)
    assert h0.load(grain0.run_id).run.state == h1.load(grain1.run_id).run.state


def test_the_edge_mints_a_run_in_its_tenants_placement(routed: Harness, two_shards: Shards):
    """``POST /factory/runs``' builder (both doors, the schedules too): the new run's id in
    the directory's placement of its tenant, not the hash of its id."""
    command = edge_submission(routed, two_shards.db)
    assert vshard_of(command.run_id) == 700 != hashed_vshard(routed.tenant)
    assert two_shards.for_run(command.run_id).index == 1


def test_a_process_follows_the_directory_as_it_changes(two_shards: Shards):
    """A tenant placed by another process (its own ``Directory``): this process's cache
    reloads on the ``runcontrol_directory`` notification and routes the tenant's new runs to
    its placement at once, long before the timer's reload."""
    first, second = two_shards.all()
    here = Shards([first.db, second.db])
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    # (not 100, 101 nor 110: test_shard_move_routed, _legacy and _writes move those)
    vshard = 900 if hashed_vshard(tenant) < SECOND_HALF else 300
    assert here.for_tenant(tenant).index == int(hashed_vshard(tenant) >= SECOND_HALF)

    async def follow() -> float:
        task = asyncio.get_running_loop().create_task(here.follow_directory(interval_s=60.0))
        try:
            await asyncio.sleep(1.0)  # listening
            began = time.monotonic()
            await asyncio.to_thread(Directory(first.db.system).place, tenant, vshard)
            while here.vshard_for(tenant) != vshard:
                assert time.monotonic() - began < 10.0, "the directory was not reloaded"
                await asyncio.sleep(0.05)
            return time.monotonic() - began
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    drive(follow())
    assert here.for_tenant(tenant).index == int(vshard >= SECOND_HALF)
