"""The scheduler's jobs once per shard database (issue 41, ``runcontrol/shard_sweeps.py``): a
lock per database, so each shard's lease expiry and outbox relay run in the one scheduler
holding its lock; a scheduler that stops leaves its shards to another, and the shard it did not
hold goes on as before."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from grain_harness import Harness, placed, submit_placed
from support import drive

from runcontrol import reconcilers, shard_sweeps
from runcontrol.domain import StepSpec
from runcontrol.shard_sweeps import ShardSweep
from runcontrol.store.shards import Shards


class Collected:
    """A sink that keeps what it was given."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def publish(self, events: Sequence[dict[str, Any]]) -> None:
        self.events.extend(events)


def leased_run(shards: Shards, vshard: int) -> tuple[Harness, UUID]:
    """A run of a tenant placed on ``vshard``, its attempt leased (and so to expire)."""
    h = placed(shards, vshard)
    grain = submit_placed(h, StepSpec("only", "agent-a"))
    h.lease(grain)
    return h, grain.run_id


@pytest.fixture
def schedulers(two_shards: Shards) -> Iterator[tuple[list[ShardSweep], list[ShardSweep]]]:
    """Two schedulers' shares of the two shards (locks proven at every ask)."""
    a, b = ShardSweep.of(two_shards.db, verify_s=0.0), ShardSweep.of(two_shards.db, verify_s=0.0)
    yield a, b
    shard_sweeps.close(a + b)


def expired(sweeps: list[ShardSweep], h: Harness) -> dict[int, set[UUID]]:
    """What a lease-expiry pass of the scheduler ``sweeps`` finds, by shard."""
    later = h.clock.now() + timedelta(hours=1)

    def each(s: ShardSweep) -> tuple[int, set[UUID]]:
        return s.index, {r for _, r in reconcilers.lease_expiries(s.db, later, h.env.options)}

    return dict(drive(shard_sweeps.each_held(sweeps, "LeaseExpiryReconciler", each, set())))


def test_each_shard_is_swept_by_the_scheduler_holding_its_lock_and_taken_over(
    two_shards: Shards, schedulers: tuple[list[ShardSweep], list[ShardSweep]]
):
    a, b = schedulers
    h0, run0 = leased_run(two_shards, 5)
    _, run1 = leased_run(two_shards, 700)
    assert a[0].lock.held() and b[1].lock.held()  # each took one shard first
    assert shard_sweeps.held(a) == [0] and shard_sweeps.held(b) == [1]

    found_a, found_b = expired(a, h0), expired(b, h0)
    assert list(found_a) == [0] and run0 in found_a[0] and run1 not in found_a[0]
    assert list(found_b) == [1] and run1 in found_b[1] and run0 not in found_b[1]

    shard_sweeps.close(b)  # the scheduler sweeping shard 1 stops (its lock connection ends)
    found = expired(a, h0)
    assert sorted(found) == [0, 1]  # taken over; shard 0 swept as before
    assert run0 in found[0] and run1 in found[1]


def test_the_relay_publishes_each_shards_events_once(
    two_shards: Shards, schedulers: tuple[list[ShardSweep], list[ShardSweep]]
):
    a, b = schedulers
    h0, run0 = leased_run(two_shards, 6)
    _, run1 = leased_run(two_shards, 701)
    sinks = [Collected(), Collected()]

    def relay(s: ShardSweep) -> tuple[int, int]:
        report = reconcilers.relay_backlog(s.db, [sinks[s.index]], h0.clock.now)
        return s.index, report.published

    passes = [dict(drive(shard_sweeps.each_held(x, "OutboxRelay", relay, set()))) for x in (a, b)]
    assert sorted(passes[0]) == [0, 1] and passes[1] == {}  # a holds both, b none
    runs = [{UUID(e["runId"]) for e in sink.events} for sink in sinks]
    assert run0 in runs[0] and run1 not in runs[0]
    assert run1 in runs[1] and run0 not in runs[1]
    again = dict(drive(shard_sweeps.each_held(a, "OutboxRelay", relay, set())))
    assert again == {0: 0, 1: 0}  # published once
    # a shard whose job still runs is not started again there
    busy = dict(drive(shard_sweeps.each_held(a, "OutboxRelay", relay, {"OutboxRelay@1"})))
    assert list(busy) == [0]
