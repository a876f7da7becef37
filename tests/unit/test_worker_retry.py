"""The reference worker keeps working through transient failures: a fenced command that meets
one is resent as the same command (same ``command_id``) after a backoff until it is answered,
refused for good, or its lease is certainly gone; the claim loop never ends on an error.

The worker runs against the real ``RunControlClient`` over an in-process router (the client's
port to the hosts) that stands in for the grain: it answers a repeated ``command_id`` with the
stored answer and refuses a second outcome for an attempt, as the grain does."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

import pytest

from runcontrol.client import RunControlClient
from runcontrol.clock import ManualClock
from runcontrol.commands import Command, ReportOutcome
from runcontrol.domain import LeaseGrant, SideEffectClass, errors
from runcontrol.worker import Backoff, ReferenceWorker

T = TypeVar("T")
T0 = datetime(2026, 3, 1, 9, 0, 0, tzinfo=UTC)
LEASE_S = 60.0
AGENT = "agent-1"


class FakeHosts:
    """The router behind the client: hands out leases, fails the first ``fail_reports`` sends
    of a report with ``failure``, then commits each command once, keyed by its command id."""

    def __init__(self, clock: ManualClock, attempts: int, fail_reports: int = 0) -> None:
        self.clock = clock
        self.to_claim = [uuid.uuid4() for _ in range(attempts)]
        self.claimed: list[UUID] = []
        self.fail_reports = fail_reports
        self.failure: Exception = errors.Unavailable("the database restarted")
        self.claim_failures: list[Exception] = []
        self.claim_ids: list[str] = []
        self.sent: list[Command[Any]] = []
        self.answers: dict[str, Any] = {}
        self.outcomes: dict[UUID, list[str]] = {}  # attempt -> command ids that took effect
        self.changed = asyncio.Event()

    def grant(self, attempt_id: UUID) -> LeaseGrant:
        return LeaseGrant(
            run_id=uuid.uuid4(),
            step_id=uuid.uuid4(),
            attempt_id=attempt_id,
            lease_id=uuid.uuid4(),
            fencing_token=1,
            holder="worker-1",
            expires_at=self.clock.now() + timedelta(seconds=LEASE_S),
            agent_id=AGENT,
            skill_id=None,
            attempt_number=1,
            side_effect_class=SideEffectClass.READ,
        )

    async def send(self, command: Command[T]) -> T:
        self.sent.append(command)
        self.changed.set()
        assert isinstance(command, ReportOutcome), command
        if len(self.sent) <= self.fail_reports:
            raise self.failure
        if command.command_id in self.answers:
            return self.answers[command.command_id]  # type: ignore[no-any-return]
        if self.outcomes.get(command.attempt_id):
            raise errors.OutcomeAlreadyRecorded("a second outcome")
        self.outcomes[command.attempt_id] = [command.command_id]
        self.answers[command.command_id] = answer = object()
        return answer  # type: ignore[return-value]

    async def call(self, run_id: UUID, method: str, *args: Any, **kwargs: Any) -> Any:
        assert method == "events", method  # the worker follows its run for a cancellation
        await asyncio.sleep(3600)  # a long poll that finds nothing; the attempt's end cancels it

    async def call_any(self, method: str, *args: Any, **kwargs: Any) -> Any:
        assert method == "claim"
        self.claim_ids.append(kwargs["claim_id"])
        if self.claim_failures:
            raise self.claim_failures.pop(0)
        if not self.to_claim:
            await asyncio.sleep(args[2])  # a long poll (timeout_s) that finds nothing
            return None
        attempt_id = self.to_claim.pop(0)
        self.claimed.append(attempt_id)
        return {"grant": self.grant(attempt_id), "tenant_id": "t-1", "input": {"n": 1}}


class Instant:
    async def propose(self, input: dict[str, Any] | None) -> dict[str, Any]:
        return {}

    async def execute(self, input: dict[str, Any] | None) -> dict[str, Any]:
        return {"done": True}


class Pauses:
    """The injected backoff: records each delay and its ceiling, moves the clock, never sleeps."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.ceilings: list[float] = []
        self.delays: list[float] = []

    def uniform(self, lo: float, hi: float) -> float:
        self.ceilings.append(hi)
        return hi / 2

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.clock.advance(seconds)
        await asyncio.sleep(0)


def worker_for(hosts: FakeHosts, pauses: Pauses, **kw: Any) -> ReferenceWorker:
    kw.setdefault("concurrency", 1)  # one slot: the sequence of sends is the test's subject
    kw.setdefault("claim_timeout_s", 0.01)  # a stopping worker waits out its claim in flight
    return ReferenceWorker(
        RunControlClient(hosts),
        "worker-1",
        {AGENT: Instant()},
        lease_grace_s=kw.pop("lease_grace_s", 5.0),
        backoff=Backoff(base_s=0.5, cap_s=4.0, uniform=pauses.uniform, sleep=pauses.sleep),
        clock=hosts.clock,
        **kw,
    )


async def run_until(worker: ReferenceWorker, done: Callable[[], bool]) -> None:
    """Run the worker until ``done()``, then stop it; it must still be running at that point."""
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(5):
            while not done():
                assert not task.done(), task
                await asyncio.sleep(0.001)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 5)


def run(coro: Awaitable[None]) -> None:
    async def main() -> None:
        await coro

    asyncio.run(main())


def test_a_report_is_resent_as_the_same_command_until_it_succeeds_once() -> None:
    clock = ManualClock(T0)
    hosts = FakeHosts(clock, attempts=2, fail_reports=3)
    pauses = Pauses(clock)
    worker = worker_for(hosts, pauses)
    run(run_until(worker, lambda: worker.completed == 2))

    first, second = hosts.claimed
    reports = [c for c in hosts.sent if isinstance(c, ReportOutcome)]
    sends_of_first = [c for c in reports if c.attempt_id == first]
    assert len(sends_of_first) == 4
    assert {c.command_id for c in sends_of_first} == {sends_of_first[0].command_id}
    assert all(c is sends_of_first[0] for c in sends_of_first)
    assert hosts.outcomes == {
        first: [sends_of_first[0].command_id],
        second: [reports[-1].command_id],
    }
    assert [c.attempt_id for c in reports[4:]] == [second]  # the next attempt was claimed
    assert pauses.ceilings == [0.5, 1.0, 2.0]  # exponential, full jitter drawn below each


def test_the_backoff_is_capped() -> None:
    clock = ManualClock(T0)
    hosts = FakeHosts(clock, attempts=1, fail_reports=8)
    pauses = Pauses(clock)
    worker = worker_for(hosts, pauses, lease_grace_s=600.0)
    run(run_until(worker, lambda: worker.completed == 1))
    assert pauses.ceilings == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert len({c.command_id for c in hosts.sent}) == 1


@pytest.mark.parametrize(
    "refusal",
    [
        errors.StaleFencingToken("a newer lease exists"),
        errors.LeaseExpired("expired"),
        errors.OutcomeAlreadyRecorded("already settled"),
    ],
)
def test_a_refusal_for_good_stops_the_resending_and_the_worker_goes_on(
    refusal: errors.RunControlError,
) -> None:
    clock = ManualClock(T0)
    hosts = FakeHosts(clock, attempts=2, fail_reports=1)
    hosts.failure = refusal
    pauses = Pauses(clock)
    worker = worker_for(hosts, pauses)
    run(run_until(worker, lambda: len(hosts.outcomes) == 1 and not hosts.to_claim))

    first, second = hosts.claimed
    assert [c.attempt_id for c in hosts.sent] == [first, second]  # never resent
    assert list(hosts.outcomes) == [second]
    assert worker.completed == 1
    assert pauses.delays == []


def test_the_worker_gives_up_on_a_report_once_its_lease_is_certainly_gone() -> None:
    clock = ManualClock(T0)
    hosts = FakeHosts(clock, attempts=2, fail_reports=1_000)
    pauses = Pauses(clock)
    worker = worker_for(hosts, pauses)

    def gave_up_on_first() -> bool:
        return len(hosts.claimed) == 2

    run(run_until(worker, gave_up_on_first))
    first = hosts.claimed[0]
    sends = [c for c in hosts.sent if c.attempt_id == first]
    assert len({c.command_id for c in sends}) == 1
    # It resent until the lease (60 s) and the grace (5 s) had passed by the local clock.
    assert sum(pauses.delays[: len(sends) - 1]) >= LEASE_S + 5.0 - 4.0
    assert hosts.outcomes == {}


def test_the_claim_loop_survives_any_failure() -> None:
    clock = ManualClock(T0)
    hosts = FakeHosts(clock, attempts=1)
    hosts.claim_failures = [errors.Unavailable("no host answered"), RuntimeError("a bug")]
    pauses = Pauses(clock)
    worker = worker_for(hosts, pauses)
    run(run_until(worker, lambda: worker.completed == 1))
    assert pauses.ceilings == [0.5, 1.0]


def test_a_claim_left_unanswered_is_resent_with_its_claim_id() -> None:
    """A claim that met a transient failure may have been granted a lease (its answer lost):
    the resend carries the same claim id, so the host answers with that lease. An answered
    claim, or one refused for good, is not resent: the next claim has an id of its own."""
    clock = ManualClock(T0)
    hosts = FakeHosts(clock, attempts=2)
    hosts.claim_failures = [
        errors.Unavailable("the host died after the grant"),
        RuntimeError("a bug"),
    ]
    worker = worker_for(hosts, Pauses(clock))
    run(run_until(worker, lambda: worker.completed == 2))
    first, resent, after_refusal, after_answer, *_ = hosts.claim_ids
    assert resent == first
    assert after_refusal != resent
    assert after_answer != after_refusal
    assert len(set(hosts.claim_ids)) == len(hosts.claim_ids) - 1


def test_a_supervised_worker_is_restarted_when_its_loop_dies() -> None:
    clock = ManualClock(T0)
    pauses = Pauses(clock)

    class Dying(ReferenceWorker):
        deaths = 0

        async def run(self) -> None:
            if self.deaths < 2:
                self.deaths += 1
                raise RuntimeError("died")
            await super().run()

    hosts = FakeHosts(clock, attempts=1)
    worker = Dying(
        RunControlClient(hosts),
        "worker-1",
        {AGENT: Instant()},
        backoff=Backoff(uniform=pauses.uniform, sleep=pauses.sleep),
        restart_backoff=Backoff(base_s=1.0, uniform=pauses.uniform, sleep=pauses.sleep),
        clock=clock,
        claim_timeout_s=0.01,
    )

    async def main() -> None:
        task = asyncio.create_task(worker.run_supervised())
        async with asyncio.timeout(5):
            while worker.completed < 1:
                await asyncio.sleep(0.001)
        assert not task.done()
        worker.stop()
        await asyncio.wait_for(task, 5)

    run(main())
    assert worker.deaths == 2
    assert pauses.ceilings[:2] == [1.0, 2.0]


def test_a_claim_in_flight_when_the_worker_stops_is_worked_not_abandoned() -> None:
    """Stopping must not drop a claim the host is answering: its lease would expire unworked
    and settle a shared-write attempt Uncertain although it never ran."""
    clock = ManualClock(T0)
    hosts = FakeHosts(clock, attempts=1)
    asked, answer = asyncio.Event(), asyncio.Event()
    claim = hosts.call_any

    async def slow_claim(method: str, *args: Any, **kwargs: Any) -> Any:
        asked.set()
        await answer.wait()  # the host grants only after the worker was told to stop
        return await claim(method, *args, **kwargs)

    hosts.call_any = slow_claim  # type: ignore[method-assign]
    worker = worker_for(hosts, Pauses(clock))

    async def main() -> None:
        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(asked.wait(), 5)
        worker.stop()
        await asyncio.sleep(0.05)  # the worker sees the stop while its claim is out
        answer.set()
        await asyncio.wait_for(task, 5)

    run(main())
    assert len(hosts.claimed) == 1
    assert list(hosts.outcomes) == hosts.claimed  # worked and reported
    assert worker.completed == 1
