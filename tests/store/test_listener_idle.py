"""A Listener with ``idle_s`` (issue 24): it listens only while someone waits. The first wait
opens its connection; once nobody has waited for ``idle_s`` the connection closes (no more
NOTIFYs reach the process); a wait after that opens it again, and a waiter whose ``since`` was
taken while nothing listened wakes at once to re-query instead of missing a commit."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from sqlalchemy import text

from runcontrol.store import Database
from runcontrol.store.notify import Listener

CHANNEL = "runcontrol_test_idle"


def _sessions(db: Database, name: str) -> int:
    with db.system_tx() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"),
                {"n": name},
            ).scalar_one()
        )


def _notify(db: Database, payload: str) -> None:
    with db.system_tx() as conn:
        conn.execute(text("SELECT pg_notify(:c, :p)"), {"c": CHANNEL, "p": payload})


async def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_it_listens_only_while_someone_waits(db: Database) -> None:
    name = f"idle-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        listener = Listener(db.system_url, (CHANNEL,), application_name=name, idle_s=0.5)
        try:
            assert _sessions(db, name) == 0  # made, not started: nothing listens
            # A waiter whose since predates the connection wakes once it listens (re-query).
            since = listener.generation(CHANNEL, ("a",))
            assert await listener.wait(CHANNEL, ("a",), since, 10.0)
            assert listener.listening and _sessions(db, name) == 1

            since = listener.generation(CHANNEL, ("a",))
            waiting = asyncio.create_task(listener.wait(CHANNEL, ("a",), since, 10.0))
            await asyncio.sleep(0.1)
            await asyncio.to_thread(_notify, db, "a")
            assert await waiting  # a NOTIFY while listening wakes it

            # Nobody waits now: the connection closes after idle_s.
            await _until(lambda: _sessions(db, name) == 0, "the idle connection to close")
            assert not listener.listening
            stale = listener.generation(CHANNEL, ("a",))
            await asyncio.to_thread(_notify, db, "a")  # sent while nothing listened: lost
            # ... so a waiter with a since from then wakes at once when listening resumes.
            assert await listener.wait(CHANNEL, ("a",), stale, 10.0)
            assert _sessions(db, name) == 1
        finally:
            await listener.close()

    asyncio.run(main())
