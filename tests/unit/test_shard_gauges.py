"""The scheduler's gauges over several shard databases (``shard_sweeps.gauges``, ``due``,
``relayed``): each shard's sample merged into one, counts added and ages the oldest."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

from runcontrol import shard_sweeps
from runcontrol.reconcilers import DueRuns, GaugeSample, RelayReport


def test_gauges_add_counts_and_keep_the_oldest_age():
    first = GaugeSample(
        {("a", "Running"): 2},
        {"a": (1, 30.0)},
        5,
        12.0,
        stalled={("a", "agent"): 1},
        flow_waiting={("a", "key", "k"): (2, 9.0)},
        held={("a", "key"): 1},
        rate_tokens={("a", "b"): 3.0},
    )
    second = GaugeSample(
        {("a", "Running"): 1, ("b", "Accepted"): 4},
        {"a": (2, 50.0), "b": (1, 5.0)},
        1,
        40.0,
        flow_waiting={("a", "key", "k"): (1, 20.0)},
        rate_tokens={("b", "b"): 1.0},
    )
    merged = shard_sweeps.gauges([first, second])
    assert merged.runs_active == {("a", "Running"): 3, ("b", "Accepted"): 4}
    assert merged.approvals_pending == {"a": (3, 50.0), "b": (1, 5.0)}
    assert (merged.outbox_unpublished, merged.outbox_oldest_age) == (6, 40.0)
    assert merged.stalled == {("a", "agent"): 1} and merged.held == {("a", "key"): 1}
    assert merged.flow_waiting == {("a", "key", "k"): (3, 20.0)}
    assert merged.rate_tokens == {("a", "b"): 3.0, ("b", "b"): 1.0}
    assert shard_sweeps.gauges([]) == GaugeSample({}, {}, 0, 0.0)


def test_due_runs_and_relay_reports_merge():
    now = datetime.now(UTC)
    one, two = ("a", uuid4()), ("b", uuid4())
    due = shard_sweeps.due(
        [DueRuns([one], now + timedelta(seconds=5)), DueRuns([two], now), DueRuns([], None)]
    )
    assert due.keys == [one, two] and due.next_at == now
    assert shard_sweeps.due([DueRuns([], None)]).next_at is None
    report = shard_sweeps.relayed([RelayReport(2, 1.5, (1.0, 1.5)), RelayReport(1, 3.0, (3.0,))])
    assert report == RelayReport(3, 3.0, (1.0, 1.5, 3.0))
