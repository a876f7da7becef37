"""The dispatch sweep's signal (issue 24, migration 0020): a run made due by a plain SQL update
of ``runs.next_due_at`` (what a flow-control release does for its waiters) is swept within
about a second, with the periodic sweep a minute away; a reminder set a moment ahead is swept
when it comes, not at the next periodic sweep. Real PostgreSQL, real LISTEN/NOTIFY, the
scheduler's own ``DispatchSignal`` and sweep."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from uuid import UUID

from sqlalchemy import Engine, text

from runcontrol import reconcilers
from runcontrol.store import Database
from runcontrol.store.commit import EVENTS_CHANNEL
from runcontrol.store.notify import Listener

PERIODIC_S = 60.0  # the backstop: far beyond every bound below


def _now() -> datetime:
    return datetime.now(UTC)


def _set_due(owner: Engine, run_id: UUID, ahead_s: float) -> None:
    """What a flow-control release does: one statement, nothing else sent."""
    with owner.begin() as conn:
        conn.execute(
            text(
                "UPDATE runs SET next_due_at = now() + make_interval(secs => :s) WHERE run_id = :r"
            ),
            {"s": ahead_s, "r": run_id},
        )


def _reminder(owner: Engine, run_id: UUID) -> datetime | None:
    with owner.begin() as conn:
        found: datetime | None = conn.execute(
            text("SELECT next_due_at FROM runs WHERE run_id = :r"), {"r": run_id}
        ).scalar_one()
        return found


async def _swept_at(
    db: Database, owner: Engine, run_id: UUID, make_due: float, deadline_s: float
) -> float:
    """Run the scheduler's sweep loop; once it waits, make the run due ``make_due`` seconds
    ahead by SQL; answer how long after that statement a sweep found the run due."""
    await asyncio.to_thread(_set_due, owner, run_id, 3600.0)  # not due, nor near (no NOTIFY)
    due = Listener(db.system_url, (reconcilers.DUE_CHANNEL,))
    events = Listener(db.system_url, (EVENTS_CHANNEL,), idle_s=1.0)
    due.start()
    signal = reconcilers.DispatchSignal(due, events, _now, PERIODIC_S)
    found_at: list[float] = []
    sweeps = 0

    async def loop() -> None:
        nonlocal sweeps
        while True:
            mark = signal.mark()
            found = await asyncio.to_thread(reconcilers.due_dispatches, db, _now())
            sweeps += 1
            signal.observe(found)
            if any(k[1] == run_id for k in found.keys):
                found_at.append(time.monotonic())
                return
            await signal.wait(mark)
            await asyncio.sleep(0.2)  # the scheduler's debounce

    task = asyncio.create_task(loop())
    try:
        start = time.monotonic() + 10.0
        while not due.listening or sweeps == 0:  # the loop has swept once and waits
            assert time.monotonic() < start, "the sweep loop never started"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert not found_at
        made = time.monotonic()
        await asyncio.to_thread(_set_due, owner, run_id, make_due)
        await asyncio.wait_for(task, deadline_s)
        return found_at[0] - made
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await due.close()
        await events.close()


def test_a_run_made_due_by_sql_is_swept_within_a_second(db, owner_engine, make_leased_run, tenant):
    run = make_leased_run(tenant)
    before = _reminder(owner_engine, run.run_id)
    try:
        took = asyncio.run(_swept_at(db, owner_engine, run.run_id, make_due=0.0, deadline_s=5.0))
        assert took < 1.5, f"swept {took:.2f}s after the statement made it due"
    finally:
        with owner_engine.begin() as conn:
            conn.execute(
                text("UPDATE runs SET next_due_at = :t WHERE run_id = :r"),
                {"t": before, "r": run.run_id},
            )


def test_a_reminder_set_a_moment_ahead_is_swept_when_it_comes(
    db, owner_engine, make_leased_run, tenant
):
    run = make_leased_run(tenant)
    before = _reminder(owner_engine, run.run_id)
    try:
        took = asyncio.run(_swept_at(db, owner_engine, run.run_id, make_due=2.0, deadline_s=8.0))
        assert 1.5 < took < 3.5, f"swept {took:.2f}s after the statement, due after 2s"
    finally:
        with owner_engine.begin() as conn:
            conn.execute(
                text("UPDATE runs SET next_due_at = :t WHERE run_id = :r"),
                {"t": before, "r": run.run_id},
            )
