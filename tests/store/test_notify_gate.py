"""NOTIFY only for a listener (issue 33, migration 0026): a commit with events NOTIFYs its run
(``runcontrol_events``) and the agents it dispatched to (``runcontrol_dispatch``) only while a
process's ``Listener`` has registered on the channel; and no wake-up is lost to a listener
that starts while commits happen (its registration waits for every commit that found no
listener, and its waiters re-read after it). Real PostgreSQL, real LISTEN/NOTIFY.

The NOTIFYs are counted by a plain LISTEN connection, which registers nowhere: it hears what
the write path sends, and never makes it send."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from uuid import UUID

import psycopg
import pytest
from support import SyncGrain, acquire, drive, fenced

from runcontrol.bootstrap import Container, build
from runcontrol.clock import ManualClock
from runcontrol.commands import AppendOutput, OpenAttempts, SubmitRequest, SubmitRun
from runcontrol.config import Settings
from runcontrol.domain import Principal, Role, StepSpec, WorkflowDefinition
from runcontrol.domain.output import OutputChunk
from runcontrol.grain import RunGrain
from runcontrol.store import Database
from runcontrol.store.commit import DISPATCH_CHANNEL, EVENTS_CHANNEL
from runcontrol.store.notify import Listener, libpq_url
from runcontrol.store.output import OUTPUT_CHANNEL

CHANNELS = (EVENTS_CHANNEL, DISPATCH_CHANNEL)
AGENT = "agent-gate"


@pytest.fixture
def db(scratch: Database) -> Database:
    """A database of its own: no other test's listener is registered in it (a Serve replica's
    stays registered while its streams idle out)."""
    return scratch


@pytest.fixture
def container(db: Database) -> Iterator[Container]:
    built = build(Settings(), db=db, clock=ManualClock(), migrate=False)
    yield built
    drive(built.store.close())


@pytest.fixture
def counter(db: Database) -> Iterator[psycopg.Connection[object]]:
    """A plain LISTEN on the gated channels, registered nowhere."""
    conn = psycopg.connect(libpq_url(db.owner_url), autocommit=True)
    for channel in CHANNELS:
        conn.execute(f"LISTEN {channel}")
    try:
        yield conn
    finally:
        conn.close()


def _heard(conn: psycopg.Connection[object], wait_s: float = 0.5) -> Counter[str]:
    found: Counter[str] = Counter()
    for note in conn.notifies(timeout=wait_s):
        found[note.channel] += 1
    return found


def _registered(db: Database) -> set[str]:
    with psycopg.connect(libpq_url(db.owner_url), autocommit=True) as conn:
        rows = conn.execute("SELECT channel FROM runcontrol_listeners").fetchall()
    return {str(r[0]) for r in rows} & set(CHANNELS)


async def _submit(container: Container, tenant: str) -> UUID:
    """A run submitted through a real grain: its commit has events and dispatches to AGENT."""
    grain = RunGrain(container.env, tenant, uuid.uuid4())
    await grain.execute(
        SubmitRun(
            tenant_id=tenant,
            run_id=grain.run_id,
            principal=Principal("alice", tenant, "proj-1", frozenset({Role.REQUESTER})),
            request=SubmitRequest(
                project_id="proj-1",
                idempotency_key=uuid.uuid4().hex,
                workflow_id="wf-gate",
                model_profile_id="code-agent",
                input={"n": 1},
                release_alias="latest",
            ),
        )
    )
    return grain.run_id


def _publish(container: Container, tenant: str) -> None:
    definition = WorkflowDefinition("wf-gate", (StepSpec(name="only", agent_id=AGENT),))
    container.releases.publish(tenant, definition, "publisher", container.env.clock.now())


async def _until(check: object, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_commits_notify_only_while_a_listener_is_registered(
    db: Database, container: Container, tenant: str, counter: psycopg.Connection[object]
) -> None:
    _publish(container, tenant)
    assert _registered(db) == set()
    drive(_submit(container, tenant))
    assert _heard(counter) == Counter()  # nobody listens: nothing sent

    async def listened() -> tuple[Counter[str], bool, set[str]]:
        listener = Listener(db.app_url, CHANNELS, idle_s=30.0)
        try:
            listener.start()
            await _until(lambda: listener.listening, "the listener to register")
            registered = await asyncio.to_thread(_registered, db)
            since = listener.generation(DISPATCH_CHANNEL, (AGENT,))
            waiting = asyncio.create_task(listener.wait(DISPATCH_CHANNEL, (AGENT,), since, 10.0))
            await _submit(container, tenant)
            woke = await asyncio.wait_for(waiting, 5.0)
            return await asyncio.to_thread(_heard, counter), woke, registered
        finally:
            await listener.close()

    heard, woke, registered = drive(listened())
    assert registered == set(CHANNELS)
    assert woke  # the dispatch woke the waiter of its agent
    assert heard == Counter({EVENTS_CHANNEL: 1, DISPATCH_CHANNEL: 1})

    assert _registered(db) == set()  # closed: unregistered
    drive(_submit(container, tenant))
    assert _heard(counter) == Counter()


def test_a_listener_starting_during_a_commit_misses_no_wake_up(
    db: Database, container: Container, tenant: str, counter: psycopg.Connection[object]
) -> None:
    """The race, made to happen: a commit checks for a listener (none) and has not committed
    when a listener starts. The listener's registration waits for that commit; its waiter's
    re-read then sees it. (Registered without waiting, the re-read would run before the
    commit, which sends no NOTIFY: the waiter would sleep to its timeout.)"""
    _publish(container, tenant)
    run_id = drive(_submit(container, tenant))
    _heard(counter)
    marker = uuid.uuid4().hex
    doc = psycopg.types.json.Jsonb(
        {"tenant": tenant, "run": {"run_id": str(run_id)}, "wake_run": str(run_id)}
    )
    committing = psycopg.connect(libpq_url(db.owner_url))  # one transaction, left open
    committing.execute("SELECT runcontrol_apply(%s)", (doc,))  # checked: nobody listens
    committing.execute("UPDATE runs SET correlation_id = %s WHERE run_id = %s", (marker, run_id))

    def stored() -> str | None:
        with db.tenant(tenant) as conn:
            found: str | None = conn.exec_driver_sql(
                "SELECT correlation_id FROM runs WHERE run_id = %s", (run_id,)
            ).scalar_one()
            return found

    async def follow(listener: Listener, seen: list[float]) -> None:
        """A stream's loop: the generation, then the read, then the wait."""
        while True:
            since = listener.generation(EVENTS_CHANNEL, (str(run_id),))
            if await asyncio.to_thread(stored) == marker:
                seen.append(time.monotonic())
                return
            await listener.wait(EVENTS_CHANNEL, (str(run_id),), since, 30.0)

    async def main() -> float:
        listener = Listener(db.app_url, (EVENTS_CHANNEL,), idle_s=30.0)
        seen: list[float] = []
        following = asyncio.create_task(follow(listener, seen))
        try:
            await asyncio.sleep(1.0)
            # The registration waits for the open commit; nothing is seen yet.
            assert not listener.listening and not seen
            await asyncio.to_thread(committing.commit)
            committed = time.monotonic()
            await asyncio.wait_for(following, 10.0)
            return seen[0] - committed
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
            await listener.close()

    try:
        took = drive(main())
    finally:
        committing.close()
    assert took < 3.0, f"the follower saw the commit {took:.2f}s after it (its timeout: 30s)"
    assert _heard(counter) == Counter()  # the commit found no listener: it sent nothing


def test_output_is_notified_only_while_a_listener_is_registered(
    db: Database, container: Container, tenant: str
) -> None:
    """The output writer (migration 0029) NOTIFYs ``runcontrol_output`` per stored write only
    while a listener has registered on it: none before, one per write with one, none after."""
    _publish(container, tenant)
    run_id = drive(_submit(container, tenant))
    grain = SyncGrain(RunGrain(container.env, tenant, run_id))
    (attempt_id,) = grain.execute(OpenAttempts(tenant_id=tenant, run_id=run_id))
    grant = acquire(grain, attempt_id)
    seq = iter(range(1, 100))
    counter = psycopg.connect(libpq_url(db.owner_url), autocommit=True)
    counter.execute(f"LISTEN {OUTPUT_CHANNEL}")

    async def write() -> None:
        command = AppendOutput(**fenced(grant, tenant), chunks=(OutputChunk(next(seq), "x"),))
        await container.env.output.append(command)

    async def listened() -> Counter[str]:
        listener = Listener(db.app_url, (OUTPUT_CHANNEL,), idle_s=30.0)
        try:
            listener.start()
            await _until(lambda: listener.listening, "the listener to register")
            await write()
            await write()
            return await asyncio.to_thread(_heard, counter)
        finally:
            await listener.close()

    try:
        drive(write())
        assert _heard(counter) == Counter()  # nobody listens: nothing sent
        assert drive(listened()) == Counter({OUTPUT_CHANNEL: 2})
        drive(write())
        assert _heard(counter) == Counter()
    finally:
        counter.close()
