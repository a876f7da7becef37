"""A run host's side of the worker sessions (``runcontrol.workers.sessions.HostSessions``)
without Ray: real grains on the session database, in mailboxes as a run host keeps them
(``actors.run_host.Activation``), and the host's book, drain and fused grants."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

import pytest
from grain_harness import Harness
from support import drive

from actors.run_host import Activation
from runcontrol.commands import AcquireLease, Command, SubmitResult, SubmitRun
from runcontrol.domain import LeaseGrant, RunAggregate, StepSpec
from runcontrol.drain import Drain
from runcontrol.grain import RunGrain
from runcontrol.workers import sessions
from runcontrol.workers.book import CreditBook
from runcontrol.workers.protocol import Credit, Grant, SessionDown, SessionUp
from runcontrol.workers.sessions import SESSION_TTL_S, FusedGrants, HostSessions

T = TypeVar("T")
AGENT = "agent-a"
INPUT = {"repo": "sessions"}


class Mailboxes(sessions.Mailboxes):
    """The host's runs as ``RunHost`` keeps them: one activation and mailbox per run."""

    def __init__(self, h: Harness) -> None:
        self.env = h.env
        self.activations: dict[UUID, Activation] = {}
        self.sent: list[str] = []  # the commands' types, in the order they ran

    def _activation(self, tenant_id: str, run_id: UUID) -> Activation:
        act = self.activations.get(run_id)
        if act is None:
            act = self.activations[run_id] = Activation(RunGrain(self.env, tenant_id, run_id))
        return act

    async def command(self, command: Command[T]) -> T:
        act = self._activation(command.tenant_id, command.run_id)
        self.sent.append(type(command).__name__)
        async with act.mailbox():
            return await act.grain.execute(command)

    async def lease(self, command: AcquireLease) -> tuple[LeaseGrant, RunAggregate]:
        lease = await self.command(command)
        return lease, await self.committed(command.tenant_id, command.run_id)

    async def committed(self, tenant_id: str, run_id: UUID) -> RunAggregate:
        act = self._activation(tenant_id, run_id)
        async with act.mailbox():
            return await act.grain.load_cached()


async def _read(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(fn, *args)


class Host:
    """One run host's sessions over the harness's grains (a new ``Host``: a restarted one)."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.drain = Drain()
        self.runs = Mailboxes(h)
        self.sessions = HostSessions(
            book=CreditBook(),
            runs=self.runs,
            drain=self.drain,
            db=h.db,
            read=_read,
            clock=h.clock,
            options=h.env.options,
            hosts=1,
            sweep_interval=0.05,
            own=lambda run_id: True,
        )
        h.env.observers[:] = [self.sessions.observe]
        h.env.credits = FusedGrants(self.sessions, self.drain)

    async def submit(self) -> SubmitResult:
        run_id = uuid.uuid4()
        return await self.runs.command(
            SubmitRun(
                tenant_id=self.h.tenant,
                run_id=run_id,
                principal=self.h.principal(),
                request=self.h.request(input=INPUT),
            )
        )

    async def exchange(self, up: SessionUp) -> SessionDown:
        return await self.sessions.exchange(up)


def credit(claim_id: str | None = None, *, resent: bool = False) -> Credit:
    """Claim ids are unique in the store (a resent credit is looked up by its id alone)."""
    return Credit(claim_id or f"claim-{uuid.uuid4()}", "worker-1", (AGENT,), resent=resent)


@pytest.fixture
def host(h: Harness) -> Host:
    h.publish(StepSpec("only", AGENT))
    return Host(h)


def _grant_of_the_run(host: Host, grant: Grant, c: Credit, run_id: UUID) -> None:
    assert grant.claim_id == c.claim_id and grant.tenant_id == host.h.tenant
    assert grant.lease.run_id == run_id and grant.lease.holder == "worker-1"
    assert grant.input == INPUT and grant.results == {}


def test_a_waiting_credit_is_granted_by_the_commit_that_dispatches_its_attempt(
    host: Host,
) -> None:
    """The fused grant: the submission's commit leases the first step to the waiting credit,
    and the waiting exchange answers with it (the run's input and deadline)."""

    c = credit()

    async def scenario() -> tuple[SessionDown, SubmitResult]:
        waiting = asyncio.create_task(host.exchange(SessionUp("s", (c,), wait_s=10)))
        await asyncio.sleep(0.05)
        submitted = await host.submit()
        return await asyncio.wait_for(waiting, 5), submitted

    down, submitted = drive(scenario())
    (grant,) = down.grants
    _grant_of_the_run(host, grant, c, submitted.run_id)
    assert grant.deadline_at == host.h.load(submitted.run_id).deadline(host.h.env.options)
    assert host.sessions.exchanges == 1 and host.runs.sent == ["SubmitRun"]  # one commit


def test_a_credit_offered_after_the_dispatch_is_granted_through_the_runs_mailbox(
    host: Host,
) -> None:
    """An attempt waiting in the book: the credit's exchange leases it (an ``AcquireLease``
    by the credit's claim id in the run's mailbox) and answers with the grant."""

    c = credit()

    async def scenario() -> tuple[SessionDown, SubmitResult]:
        submitted = await host.submit()
        assert host.sessions.book.backlog() == {AGENT: 1}
        return await host.exchange(SessionUp("s", (c,), wait_s=5)), submitted

    down, submitted = drive(scenario())
    (grant,) = down.grants
    _grant_of_the_run(host, grant, c, submitted.run_id)
    assert grant.deadline_at == host.h.load(submitted.run_id).deadline(host.h.env.options)
    assert down.backlog == {} and host.runs.sent == ["SubmitRun", "AcquireLease"]
    # sent again until acked
    again = drive(host.exchange(SessionUp("s", acks=(), wait_s=0)))
    assert again.grants == [grant]
    acked = drive(host.exchange(SessionUp("s", acks=(c.claim_id,), wait_s=0)))
    assert acked.grants == []


def test_a_late_exchange_is_answered_at_once_and_its_credits_do_not_count(host: Host) -> None:
    drive(host.exchange(SessionUp("s", (), wait_s=0, seq=2)))
    started = time.monotonic()
    late = drive(host.exchange(SessionUp("s", (credit(),), wait_s=5, seq=1)))
    assert time.monotonic() - started < 1.0 and late.grants == []
    assert host.sessions.late_exchanges == 1
    assert host.sessions.book.credits("s") == {}


def test_a_newer_exchange_answers_the_waiting_one_at_once(host: Host) -> None:
    c = credit()

    async def scenario() -> float:
        waiting = asyncio.create_task(host.exchange(SessionUp("s", (c,), wait_s=10)))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await host.exchange(SessionUp("s", (c,), wait_s=0))
        await asyncio.wait_for(waiting, 2)
        return time.monotonic() - started

    assert drive(scenario()) < 1.0
    assert host.sessions.late_exchanges == 0 and host.sessions.exchanges == 2
    assert set(host.sessions.book.credits("s")) == {c.claim_id}


def test_a_drain_ends_every_wait_and_takes_no_credit(host: Host) -> None:
    async def scenario() -> tuple[SessionDown, SessionDown]:
        waiting = asyncio.create_task(host.exchange(SessionUp("s", (credit(),), wait_s=10)))
        await asyncio.sleep(0.05)
        host.drain.begin()
        host.sessions.wake_all()
        first = await asyncio.wait_for(waiting, 2)
        later = await host.exchange(SessionUp("s", (credit(),), wait_s=10))
        return first, later

    first, later = drive(scenario())
    assert first.draining and later.draining
    assert host.sessions.book.credits("s") == {}


def test_a_gone_session_is_forgotten(host: Host) -> None:
    drive(host.exchange(SessionUp("s", (credit(),), wait_s=0, seq=5)))
    host.sessions.expire(time.monotonic() + SESSION_TTL_S + 1)
    assert host.sessions.book.credits("s") == {}
    # a session of the same id starting over is not late
    c = credit()
    drive(host.exchange(SessionUp("s", (c,), wait_s=0, seq=1)))
    assert host.sessions.late_exchanges == 0
    assert set(host.sessions.book.credits("s")) == {c.claim_id}


def test_a_resent_credit_finds_its_grant_again_on_a_restarted_host(host: Host) -> None:
    """The grant's answer was lost and the host restarted: the credit, resent, is answered
    the lease its claim id was granted (the stored ``AcquireLease`` answer), with no
    deadline (docs/sessions.md)."""

    c = credit()

    async def granted() -> tuple[Grant, UUID]:
        submitted = await host.submit()
        (grant,) = (await host.exchange(SessionUp("s", (c,), wait_s=5))).grants
        return grant, submitted.run_id

    first, run_id = drive(granted())
    restarted = Host(host.h)
    resent = credit(c.claim_id, resent=True)
    (again,) = drive(restarted.exchange(SessionUp("s", (resent,), wait_s=0))).grants
    _grant_of_the_run(restarted, again, c, run_id)
    assert again.lease == first.lease and again.deadline_at is None
    assert restarted.sessions.book.credits("s") == {}


def test_the_sweep_finds_an_attempt_no_commit_of_this_host_gave_its_book(h: Harness) -> None:
    """Dispatched before this host's sessions existed (another host, or before a restart):
    the sweep, started by a credit waiting, reads it from the store and grants it. The store
    is shared with other tests: this test's agent is its own."""
    agent = f"agent-{uuid.uuid4().hex[:8]}"
    h.publish(StepSpec("only", agent))
    before = Host(h)
    submitted = drive(before.submit())
    host = Host(h)  # a fresh book: it never saw the dispatch
    h.clock.advance(10)

    c = dataclasses.replace(credit(), agent_ids=(agent,))

    async def scenario() -> SessionDown:
        sweep = asyncio.create_task(host.sessions.sweep())
        try:
            # other tests' attempts the sweep finds begin backlogs here: that news answers the
            # exchange early, and the worker exchanges again (as the SDK does)
            for seq in range(1, 6):
                down = await host.exchange(SessionUp("s", (c,), wait_s=5, seq=seq))
                if down.grants:
                    break
            return down
        finally:
            sweep.cancel()

    (grant,) = drive(scenario()).grants
    _grant_of_the_run(host, grant, c, submitted.run_id)
