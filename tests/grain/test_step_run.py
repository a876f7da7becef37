"""``step.run`` (the SDK's journaled calls) against a real grain and PostgreSQL, without Ray:
the SDK's ``Step`` over an ``AttemptContext`` whose commands go straight to the run's grain.
A later execution replays from its grant (no command, ``fn`` not called), loops replay in
order, a final error is stored and raised as ``CallFailed`` while a ``Transient`` is not, a
value past the grant's cap is read with one command, and a value another execution stored
first is the one returned."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from grain_harness import Harness
from support import LOOP, SyncGrain, drive

from runcontrol.commands import Command, RecordCall
from runcontrol.domain import LeaseGrant, Options, StepSpec
from runcontrol.sdk import Backoff, CallFailed, Permanent, Step, SyncStep, Transient
from runcontrol.sdk._step import AttemptContext
from runcontrol.workers.grants import grant


class Execution:
    """One execution of a step's function: a ``Step`` (or ``SyncStep``) over the grant the
    run as committed gives, its commands sent to the grain (and counted)."""

    def __init__(self, h: Harness, grain: SyncGrain, lease: LeaseGrant, grant_max: int) -> None:
        options = Options(calls_grant_max_bytes=grant_max)
        self.sent: list[Command[Any]] = []

        async def send_once(command: Command[Any]) -> Any:
            self.sent.append(command)
            return await grain.grain.execute(command)

        self.attempt = AttemptContext(
            grant("claim", h.load(grain.run_id), lease, options),
            send_once,
            clock=h.clock,
            backoff=Backoff(0.01, 0.05),
            lease_grace=timedelta(seconds=5),
            loop=LOOP,
        )
        self.step = Step(self.attempt)
        self.sync_step = SyncStep(self.attempt)

    def records(self) -> list[RecordCall]:
        return [c for c in self.sent if isinstance(c, RecordCall)]


@pytest.fixture
def leased(h: Harness) -> tuple[SyncGrain, LeaseGrant]:
    return h.start_run(StepSpec("s", "agent-a"))


def counted(calls: list[Any], value: Any) -> Any:
    calls.append(value)
    return value


def test_a_later_execution_replays_from_its_grant_without_a_command(h: Harness, leased):
    grain, lease = leased
    calls: list[Any] = []

    async def body(step: Step) -> list[Any]:
        plan = await step.run("plan", counted, calls, {"plan": ("a", 1.0)})
        answers = [await step.run("model", counted, calls, n) for n in range(3)]

        async def later(n: int) -> int:  # an async fn
            return counted(calls, n)

        return [plan, answers, await step.run("later", later, 7)]

    first = Execution(h, grain, lease, 1 << 20)
    expected = [{"plan": ["a", 1]}, [0, 1, 2], 7]  # as JSON, in every execution alike
    assert drive(body(first.step)) == expected
    assert len(first.records()) == 5 and len(calls) == 5
    second = Execution(h, grain, lease, 1 << 20)
    assert drive(body(second.step)) == expected
    assert second.sent == [] and len(calls) == 5  # no command, no call


def test_a_final_error_is_stored_and_raised_again_a_transient_one_is_not(h: Harness, leased):
    grain, lease = leased
    calls: list[str] = []

    def refuse() -> None:
        calls.append("refuse")
        raise Permanent("the ticket is closed")

    def flaky() -> None:
        calls.append("flaky")
        raise Transient("try later")

    first = Execution(h, grain, lease, 1 << 20)
    with pytest.raises(CallFailed) as failed:
        drive(first.step.run("check", refuse))
    assert isinstance(failed.value.__cause__, Permanent)
    with pytest.raises(Transient):
        drive(first.step.run("flaky", flaky))
    assert [r.name for r in first.records()] == ["check"]

    second = Execution(h, grain, lease, 1 << 20)
    with pytest.raises(CallFailed) as again:
        drive(second.step.run("check", refuse))
    assert (again.value.error_type, again.value.error_message) == (
        "Permanent",
        "the ticket is closed",
    )
    with pytest.raises(Transient):
        drive(second.step.run("flaky", flaky))
    assert calls == ["refuse", "flaky", "flaky"]


def test_a_value_past_the_grant_s_cap_is_read_with_one_command(h: Harness, leased):
    grain, lease = leased
    first = Execution(h, grain, lease, 1 << 20)
    for n in range(3):
        drive(first.step.run("chunk", str, "x" * (8 + n)))
    second = Execution(h, grain, lease, 25)  # carries the first two values only
    found = [drive(second.step.run("chunk", pytest.fail)) for _ in range(3)]
    assert found == ["x" * 8, "x" * 9, "x" * 10]
    (read,) = second.sent
    assert isinstance(read, RecordCall) and read.read_only and read.occurrence == 3


def test_the_value_another_execution_stored_first_is_returned(h: Harness, leased):
    grain, lease = leased
    late = Execution(h, grain, lease, 1 << 20)  # its grant was made before the other recorded
    other = Execution(h, grain, lease, 1 << 20)
    assert drive(other.step.run("plan", str, "first")) == "first"
    assert drive(late.step.run("plan", str, "second")) == "first"
    assert h.event_types(grain.run_id).count("CallRecorded") == 1


def test_a_sync_step_runs_fn_in_its_thread_and_an_async_fn_on_the_loop(h: Harness, leased):
    grain, lease = leased
    first = Execution(h, grain, lease, 1 << 20)

    async def on_the_loop() -> str:
        return "async"

    def body(step: SyncStep) -> list[Any]:
        return [step.run("sync", str, 5), step.run("async", on_the_loop)]

    assert drive(asyncio.to_thread(body, first.sync_step)) == ["5", "async"]
    second = Execution(h, grain, lease, 1 << 20)
    assert drive(asyncio.to_thread(body, second.sync_step)) == ["5", "async"]
    assert second.sent == []
