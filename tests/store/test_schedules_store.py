"""Schedules in PostgreSQL: a fire time is recorded once, row-level security keeps tenants
apart, and a sweep decides a due schedule's fire times from the store alone."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from runcontrol import schedules as rules
from runcontrol.domain import Principal, Role, errors
from runcontrol.edge.auth import Caller
from runcontrol.store import Database
from runcontrol.store import schedules as store

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def make(db: Database, tenant: str, **timing: object) -> uuid.UUID:
    caller = Caller(
        Principal("alice", tenant, "proj-1", frozenset({Role.REQUESTER})),
        frozenset({"factory.runs.write"}),
    )
    doc = {"run": {"workflowId": "wf", "modelProfileId": "m"}, "intervalSeconds": 2, **timing}
    row = rules.new_row(caller, doc, False, None, NOW)
    with db.tenant(tenant) as conn:
        store.insert_schedule(conn, row)
    return row["schedule_id"]


def test_a_fire_time_is_recorded_once(db: Database, tenant: str) -> None:
    sid = make(db, tenant, startAt=(NOW - timedelta(hours=1)).isoformat())
    with db.tenant(tenant) as conn:
        row = store.get_row(conn, sid, lock=True)
        first = rules.backfill(conn, row, NOW - timedelta(seconds=10), NOW, None, NOW)
    with db.tenant(tenant) as conn:
        row = store.get_row(conn, sid, lock=True)
        again = rules.backfill(conn, row, NOW - timedelta(seconds=10), NOW, None, NOW)
    assert first == {"started": 1, "skipped": 4, "buffered": 0, "alreadyFired": 0}
    assert again == {"started": 0, "skipped": 0, "buffered": 0, "alreadyFired": 5}
    with db.tenant(f"{tenant}-other") as conn:
        assert store.get_row(conn, sid) is None
        assert store.last_fires(conn, sid) == []


def test_the_sweep_counts_misses_past_the_catch_up_window(db: Database, tenant: str) -> None:
    sid = make(db, tenant, catchUpWindowSeconds=5, overlap="allow-all")
    later = NOW + timedelta(seconds=20)  # fire times at +2 .. +20: +16 .. +20 within 5 s
    with db.system_tx() as conn:
        row = next(r for r in store.due_schedules(conn, later, 1000) if r.schedule_id == sid)
        tally = rules.advance(conn, row, later)
    assert (tally.started, tally.missed, tally.skipped) == (3, 7, 0)
    with db.system_tx() as conn:
        assert sid not in {r.schedule_id for r in store.due_schedules(conn, later, 1000)}
        row = next(
            r
            for r in store.due_schedules(conn, later + timedelta(seconds=2), 1000)
            if r.schedule_id == sid
        )
        assert rules.advance(conn, row, later + timedelta(seconds=2)).started == 1
    with db.tenant(tenant) as conn:
        row = store.get_row(conn, sid)
        assert (row.started, row.missed) == (4, 7)
        assert row.last_nominal_at == NOW + timedelta(seconds=22)


def test_a_past_start_is_decided_by_the_catch_up_window(db: Database, tenant: str) -> None:
    """Created at NOW with startAt a minute before: its fire times since are the sweep's as
    after an outage (issue 46: they were neither fired nor counted)."""
    sid = make(
        db,
        tenant,
        startAt=(NOW - timedelta(seconds=60)).isoformat(),
        catchUpWindowSeconds=5,
        overlap="allow-all",
    )
    with db.system_tx() as conn:  # -60, -58 .. 0: within 5 s are -4, -2, 0
        row = next(r for r in store.due_schedules(conn, NOW, 1000) if r.schedule_id == sid)
        tally = rules.advance(conn, row, NOW)
    assert (tally.started, tally.missed) == (3, 28)
    too_far = {"startAt": (NOW - timedelta(days=1)).isoformat(), "intervalSeconds": 1}
    with pytest.raises(errors.ValidationFailed, match="startAt must be") as refused:
        make(db, tenant, **too_far)
    assert refused.value.details["field"] == "startAt"
