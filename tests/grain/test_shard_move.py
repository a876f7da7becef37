"""A virtual shard moved to another database with its runs in flight (issue 41, point 5;
``store/move.py``, docs/sharding.md "Moving a tenant"): its tenants' rows copied and verified,
the database it left fenced (a stale host's write refused there, in its own transaction), the
directory flipped with its epoch bumped, and the runs completed on the new database. A crash
between any two steps resumes to the same end; a copy that differs stops the move before its
flip, the tenant wholly on the database it was on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pytest
from grain_harness import Harness
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.pool import NullPool
from support import SyncGrain, drive, scratch_database, subscribe

from runcontrol import reconcilers
from runcontrol.api import problems
from runcontrol.bootstrap import build
from runcontrol.cli import main
from runcontrol.clock import ManualClock
from runcontrol.commands import SubmitRun
from runcontrol.config import Settings
from runcontrol.domain import LeaseGrant, Limits, RunState, StepSpec, errors, shards
from runcontrol.domain.moves import ORDER, Step
from runcontrol.ids import new_run_id
from runcontrol.store import Database
from runcontrol.store.directory import Directory
from runcontrol.store.move import MoveError, Mover
from runcontrol.store.move_rows import TABLES
from runcontrol.store.tables import outbox, runs, vshards

NOW = datetime.now(UTC)


@pytest.fixture
def pair(owner_url: str) -> Iterator[tuple[Database, Database]]:
    """Two shard databases on the session's server: the first holds the directory."""
    with scratch_database(owner_url) as first, scratch_database(owner_url) as second:
        yield first, second


class Shard:
    """One tenant's runs on one database, through its own grains (a host of that database)."""

    def __init__(self, db: Database, tenant: str, clock: ManualClock) -> None:
        self.h = Harness(build(Settings(), db=db, clock=clock, migrate=False), tenant, clock)

    def close(self) -> None:
        drive(self.h.c.store.close())


@pytest.fixture
def shards_of(pair: tuple[Database, Database]) -> Iterator[Any]:
    made: list[Shard] = []

    def make(position: int, tenant: str) -> Harness:
        made.append(Shard(pair[position], tenant, ManualClock()))
        return made[-1].h

    yield make
    for shard in made:
        shard.close()


def in_flight(h: Harness) -> tuple[SyncGrain, LeaseGrant, SyncGrain]:
    """A run in the tenant's virtual shard, its first step leased (its second waits), and a
    legacy run (a version 4 id, stored as before shards), leased too."""
    h.publish(StepSpec("plan", "agent-a"), StepSpec("write", "agent-b"))
    run_id = new_run_id(h.tenant)
    grain = h.grain(run_id)
    request = h.request(limits=Limits(max_cost_usd=5.0))
    grain.execute(
        SubmitRun(tenant_id=h.tenant, run_id=run_id, principal=h.principal(), request=request)
    )
    grant = h.lease(grain)
    legacy, _ = h.submit()
    h.lease(legacy)
    return grain, grant, legacy


@dataclass
class Flight:
    """The runs of ``in_flight`` on the first database, and the tenant's rows there."""

    h: Harness
    grain: SyncGrain
    grant: LeaseGrant
    legacy: SyncGrain
    before: dict[str, int]

    @property
    def vshard(self) -> int:
        return shards.vshard_of(self.grain.run_id)


@pytest.fixture
def flight(pair: tuple[Database, Database], shards_of: Any, tenant: str) -> Flight:
    h = shards_of(0, tenant)
    grain, grant, legacy = in_flight(h)
    return Flight(h, grain, grant, legacy, rows_of(pair[0], tenant))


def rows_of(db: Database, tenant: str) -> dict[str, int]:
    """Per tenant table, the tenant's rows in ``db`` (those it has)."""
    found = {}
    with db.system.connect() as conn:
        for table in TABLES:
            count = conn.execute(
                select(func.count()).select_from(table).where(table.c.tenant_id == tenant)
            ).scalar_one()
            if count:
                found[table.name] = count
    return found


def shard_row(db: Database, vshard: int) -> tuple[int, int, str]:
    with db.system.connect() as conn:
        found = conn.execute(
            select(vshards.c.database, vshards.c.epoch, vshards.c.state).where(
                vshards.c.vshard == vshard
            )
        ).one()
    return found.database, found.epoch, found.state


def other_tenant(tenant: str) -> str:
    """A tenant on another virtual shard than ``tenant``'s."""
    other = f"{tenant}-other"
    while shards.hashed_vshard(other) == shards.hashed_vshard(tenant):
        other += "x"
    return other


def finish(h: Harness, run_id: UUID, grant: LeaseGrant) -> None:
    """The run's leased step succeeds with ``grant``, then every step after it."""
    grain = h.grain(run_id)
    h.succeed(grain, grant)
    while h.open_attempts(run_id):
        h.succeed(grain, h.lease(grain))


def test_a_tenant_moves_with_its_runs_in_flight_and_they_complete_on_the_new_database(
    pair: tuple[Database, Database], shards_of: Any, tenant: str, flight: Flight
):
    source, target = pair
    h, grain, grant, legacy, before, vshard = (
        flight.h,
        flight.grain,
        flight.grant,
        flight.legacy,
        flight.before,
        flight.vshard,
    )
    bystander = shards_of(0, other_tenant(tenant))
    kept, _, _ = in_flight(bystander)
    bystanders_rows = rows_of(source, bystander.tenant)
    events = [(r.seq, r.event_id) for r in h.outbox(grain.run_id)]

    moved = Mover(pair, quiet_s=0.05).start(vshard, 1)

    assert moved.step is Step.DONE and moved.error is None and moved.tenants == (tenant,)
    assert shard_row(source, vshard) == (1, 1, "serving")  # flipped, the epoch bumped
    assert Directory(source.system).database_for(vshard) == 1
    assert rows_of(target, tenant) == before  # every row, the legacy run's too
    assert rows_of(target, bystander.tenant) == {}  # nothing of another tenant
    assert rows_of(source, tenant) == {}  # the source's copy cleaned
    assert rows_of(source, bystander.tenant) == bystanders_rows

    # A host whose directory is stale commits nothing where the tenant was: the fence.
    with pytest.raises(errors.ShardMoved, match="moved with virtual shard"):
        h.succeed(grain, grant)

    # On the new database the runs go on with the worker's lease, without a lost or doubled
    # event: the events before the move kept, numbered on without a gap.
    there = shards_of(1, tenant)
    finish(there, grain.run_id, grant)
    assert there.load(grain.run_id).run.state is RunState.COMPLETED
    after = [(r.seq, r.event_id) for r in there.outbox(grain.run_id)]
    assert after[: len(events)] == events
    assert [seq for seq, _ in after] == list(range(1, len(after) + 1))
    assert there.load(legacy.run_id).run.state is RunState.RUNNING
    # The bystander's runs go on where they were.
    finish(bystander, kept.run_id, bystander.lease(kept))


class Crash(Exception):
    """A process lost between a step's effect and its journal entry."""


def test_a_crash_between_any_two_steps_resumes_to_the_same_end(
    pair: tuple[Database, Database], shards_of: Any, tenant: str, flight: Flight
):
    source, target = pair
    grain, grant, before, vshard = flight.grain, flight.grant, flight.before, flight.vshard
    crashed: list[Step] = []

    def crash_once(step: Step) -> None:  # after the step's effect, before its journal entry
        if step not in crashed:
            crashed.append(step)
            raise Crash(step.value)

    mover = Mover(pair, quiet_s=0.05, hook=crash_once)
    with pytest.raises(Crash):
        mover.start(vshard, 1)
    [move] = mover.moves()
    while True:
        # Wholly on the side the directory names, whichever step was lost.
        named = shard_row(source, vshard)[0]
        assert rows_of(pair[named], tenant) == before
        if move.step is Step.FLIPPING and named == 1:  # flipped, its journal entry lost
            with pytest.raises(MoveError, match="has flipped: it can only be resumed"):
                mover.abort(move.move_id)
        try:
            move = mover.resume(move.move_id)
            break
        except Crash:
            move = mover.get(move.move_id)
    mover.close()

    assert crashed == list(ORDER[:-1])  # every step ran twice: once lost, once journaled
    assert move.step is Step.DONE
    assert shard_row(source, vshard) == (1, 1, "serving")  # one flip, one epoch
    assert rows_of(target, tenant) == before and rows_of(source, tenant) == {}
    finish(shards_of(1, tenant), grain.run_id, grant)


def test_a_copy_that_differs_stops_the_move_before_its_flip(
    pair: tuple[Database, Database], tenant: str, flight: Flight
):
    source, target = pair
    h, grain, grant, before, vshard = (
        flight.h,
        flight.grain,
        flight.grant,
        flight.before,
        flight.vshard,
    )

    def tamper(step: Step) -> None:  # an event lost from the copy
        if step is Step.COPYING:
            owner = create_engine(target.owner_url, poolclass=NullPool)
            with owner.begin() as conn:
                conn.execute(
                    text("DELETE FROM outbox WHERE run_id = :r AND seq = 2"), {"r": grain.run_id}
                )
            owner.dispose()

    mover = Mover(pair, quiet_s=0.05, hook=tamper)
    with pytest.raises(MoveError, match="outbox: .* rows on the source") as stopped:
        mover.start(vshard, 1)
    assert f"run {grain.run_id}: its events" in str(stopped.value)
    [move] = mover.moves()
    assert move.step is Step.VERIFYING and "differs" in (move.error or "")
    assert shard_row(source, vshard) == (0, 0, "moving")  # not flipped
    assert rows_of(source, tenant) == before  # wholly on the source still

    # Meanwhile a submission is answered 503 with Retry-After (the edge mints its run in the
    # placement the directory answers), and nothing is stored.
    directory = Directory(source.system)
    assert directory.state_of(vshard) == "moving" and directory.state_of(vshard + 1) == "serving"
    with pytest.raises(errors.ShardMoving) as refused:
        new_run_id(tenant, directory.placement)
    answer = problems.from_error(refused.value)
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "5"
    assert answer.media_type == "application/problem+json"

    mover.abort(move.move_id)  # the copy removed, the fence lifted, serving on the source
    assert shard_row(source, vshard) == (0, 0, "serving")
    assert rows_of(target, tenant) == {}
    assert mover.get(move.move_id).step is Step.ABORTED
    mover.close()
    directory.refresh()
    assert directory.placement(tenant) == vshard
    finish(h, grain.run_id, grant)  # the run goes on where it was
    with source.system.connect() as conn:
        state = conn.execute(select(runs.c.state).where(runs.c.run_id == grain.run_id))
        assert state.scalar_one() == RunState.COMPLETED.value
        gaps = conn.execute(
            select(func.count()).select_from(outbox).where(outbox.c.run_id == grain.run_id)
        ).scalar_one()
        assert gaps == max(r.seq for r in h.outbox(grain.run_id))


def test_a_shard_already_on_the_target_or_unknown_database_is_refused(
    pair: tuple[Database, Database],
):
    mover = Mover(pair)
    with pytest.raises(MoveError, match="on database 0 already"):
        mover.start(5, 0)
    with pytest.raises(MoveError, match="database 2 is not configured"):
        mover.start(5, 2)
    assert mover.moves() == []
    mover.close()


def test_the_command_moves_a_tenant_and_shows_the_move(
    pair: tuple[Database, Database], tenant: str, flight: Flight, monkeypatch: Any, capsys: Any
):
    monkeypatch.delenv("RUNCONTROL_DATABASE_URL", raising=False)
    monkeypatch.setenv("RUNCONTROL_SHARDS__DATABASES", ",".join(d.owner_url for d in pair))

    assert main(["shards", "move", "--tenant", tenant, "--to", "1", "--quiet", "0.05"]) == 0
    said = capsys.readouterr().out
    assert f"tenant {tenant} is on virtual shard {flight.vshard}" in said
    assert [line.split()[0] for line in said.splitlines() if line.endswith(" done")] == [
        s.value for s in ORDER[:-1]
    ]
    assert rows_of(pair[1], tenant) == flight.before

    assert main(["shards", "status"]) == 0
    said = capsys.readouterr().out
    assert "2 shard databases" in said and f" {flight.vshard} " in said and " done " in said

    assert main(["shards", "move", "--vshard", str(flight.vshard), "--to", "7"]) == 1
    assert "database 7 is not configured" in capsys.readouterr().err


def test_a_shard_whose_runs_keep_changing_is_not_fenced(
    pair: tuple[Database, Database], tenant: str, flight: Flight
):
    """The quiet window is bounded: a host still committing for the shard stops the move at
    quiescing, with a clear error, before any fence; aborting it puts the shard back."""
    source = pair[0]
    stop = threading.Event()

    def committing() -> None:  # a run's version bumped, as a host's commit does
        owner = create_engine(source.owner_url, poolclass=NullPool)
        while not stop.wait(0.05):
            with owner.begin() as conn:
                conn.execute(
                    text("UPDATE runs SET version = version + 1 WHERE run_id = :r"),
                    {"r": flight.grain.run_id},
                )
        owner.dispose()

    busy = threading.Thread(target=committing)
    busy.start()
    mover = Mover(pair, quiet_s=0.5, quiesce_timeout_s=1.5)
    try:
        with pytest.raises(MoveError, match="rows kept changing for 1.5 s"):
            mover.start(flight.vshard, 1)
    finally:
        stop.set()
        busy.join()
    [move] = mover.moves()
    assert move.step is Step.QUIESCING and shard_row(source, flight.vshard)[2] == "moving"
    mover.abort(move.move_id)
    mover.close()
    assert shard_row(source, flight.vshard) == (0, 0, "serving")
    assert rows_of(source, tenant) == flight.before


def test_the_tenants_feed_and_deliveries_keep_their_positions_across_a_move(
    pair: tuple[Database, Database], shards_of: Any, tenant: str, flight: Flight
):
    """A tenant's feed positions are its own (0039): its pages move as they are (their event
    ids mapped), so a feed cursor, each delivery and each subscription's start name the same
    events in the target; the target's relay publishes none of them again, and the tenant's
    next events come after them."""
    source, target = pair
    first = subscribe(source, tenant, NOW)  # before every event: starts after 0
    resident = shards_of(1, other_tenant(tenant))  # the target's own feed
    in_flight(resident)
    for db in pair:
        while reconcilers.relay_outbox(db, [], NOW).published:
            pass
    later = subscribe(source, tenant, NOW)  # after every event so far
    fed_before = feed_of(source, tenant)
    assert len(fed_before) >= 4 and later["startsAfter"] >= fed_before[-1][0]

    Mover(pair, quiet_s=0.05).start(flight.vshard, 1)

    fed = feed_of(target, tenant)
    assert fed == fed_before  # the same events at the same positions
    assert reconcilers.relay_outbox(target, [], NOW).published == 0  # arrived published
    with target.tenant(tenant) as conn:
        starts = dict(
            conn.execute(
                text("SELECT subscription_id::text, starts_after FROM webhook_subscriptions")
            ).all()
        )
        delivered = conn.execute(
            text(
                "SELECT d.run_id, d.seq FROM webhook_deliveries d"
                " JOIN event_feed f ON f.position = d.position"
                " WHERE f.run_id = d.run_id AND f.seq = d.seq ORDER BY d.position"
            )
        ).all()
    assert starts == {first["subscriptionId"]: 0, later["subscriptionId"]: later["startsAfter"]}
    assert [tuple(d) for d in delivered] == [event for _, event in fed]  # one per event

    finish(shards_of(1, tenant), flight.grain.run_id, flight.grant)  # it goes on in the target
    while reconcilers.relay_outbox(target, [], NOW).published:
        pass
    after = feed_of(target, tenant)
    assert after[: len(fed)] == fed and len(after) > len(fed)  # the next ones after them
    assert [p for p, _ in after] == list(range(after[0][0], after[0][0] + len(after)))


def feed_of(db: Database, tenant: str) -> list[tuple[int, tuple[UUID, int]]]:
    """The tenant's feed: (position, (run, seq)) in position order."""
    with db.tenant(tenant) as conn:
        rows = conn.execute(text("SELECT position, run_id, seq FROM event_feed ORDER BY position"))
        return [(p, (r, s)) for p, r, s in rows]


def test_a_move_lost_after_its_fence_is_aborted_with_the_fence_lifted(
    pair: tuple[Database, Database], flight: Flight
):
    def crash_after_fencing(step: Step) -> None:
        if step is Step.FENCING:
            raise Crash(step.value)

    mover = Mover(pair, quiet_s=0.05, hook=crash_after_fencing)
    with pytest.raises(Crash):
        mover.start(flight.vshard, 1)
    [move] = mover.moves()
    assert move.step is Step.FENCING and move.tenants == ()  # fenced, not journaled
    with pytest.raises(errors.ShardMoved):  # the fence holds meanwhile
        flight.h.succeed(flight.grain, flight.grant)
    mover.abort(move.move_id)
    mover.close()
    finish(flight.h, flight.grain.run_id, flight.grant)  # served where it was again
    assert rows_of(pair[1], flight.h.tenant) == {}
