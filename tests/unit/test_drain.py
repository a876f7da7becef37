"""The drain state of one process (``runcontrol.drain``): which commands it refuses, and what
its wait waits for. Pure asyncio: no Ray, no database."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from runcontrol.commands import (
    AcquireLease,
    CancelRun,
    RenewLease,
    ReportOutcome,
    SubmitRequest,
    SubmitRun,
)
from runcontrol.domain import AttemptOutcome, Principal, Role, errors
from runcontrol.drain import Drain, DrainReport

RUN = {"tenant_id": "t-1", "run_id": uuid.uuid4()}
FENCED = {**RUN, "attempt_id": uuid.uuid4(), "holder": "w/1", "fencing_token": 3}


def submission() -> SubmitRun:
    principal = Principal("alice", "t-1", "p-1", frozenset({Role.REQUESTER}))
    request = SubmitRequest("p-1", "key-1", "wf", "code-agent", {})
    return SubmitRun(**RUN, principal=principal, request=request)


def test_a_draining_edge_refuses_new_work_only() -> None:
    drain = Drain(retry_after_s=7)
    for command in (submission(), AcquireLease(**RUN, attempt_id=uuid.uuid4(), holder="w/1")):
        drain.admit(command)  # not draining: everything goes
    drain.begin()
    for command in (submission(), AcquireLease(**RUN, attempt_id=uuid.uuid4(), holder="w/1")):
        with pytest.raises(errors.Draining) as refused:
            drain.admit(command)
        assert refused.value.retryable and refused.value.details == {"retry_after": 7}
    # The work already accepted goes on: a holder's renewal and report, a cancel.
    drain.admit(RenewLease(**FENCED))
    drain.admit(ReportOutcome(**FENCED, outcome=AttemptOutcome.SUCCEEDED))
    drain.admit(CancelRun(**RUN, requested_by="alice", reason="r"))
    with pytest.raises(errors.Draining):
        drain.check("a claim")
    drain.resume()
    drain.admit(submission())
    drain.check()


def test_the_wait_ends_when_the_last_work_in_flight_ends() -> None:
    async def main() -> None:
        drain = Drain()
        release = asyncio.Event()

        async def work() -> None:
            with drain.track():
                await release.wait()

        tasks = [asyncio.create_task(work()) for _ in range(3)]
        await asyncio.sleep(0)  # let them start
        assert drain.in_flight == 3
        # Two waiters (``runcontrol up`` begins a drain, then awaits it): both wake.
        waiting = [asyncio.create_task(drain.wait(grace_s=3600)) for _ in range(2)]
        await asyncio.sleep(0)
        assert drain.draining and not any(w.done() for w in waiting)
        release.set()
        for report in await asyncio.gather(*waiting):
            assert report.idle and report.in_flight == 0
        await asyncio.gather(*tasks)

    asyncio.run(main())


def test_the_wait_gives_up_after_the_grace_and_says_what_is_left() -> None:
    async def main() -> None:
        drain = Drain()
        stuck = asyncio.Event()

        async def work() -> None:
            with drain.track():
                await stuck.wait()

        task = asyncio.create_task(work())
        await asyncio.sleep(0)
        report = await drain.wait(grace_s=0.0)
        assert not report.idle and report.in_flight == 1
        stuck.set()
        await task
        assert (await drain.wait(grace_s=0.0)).idle

    asyncio.run(main())


def test_work_ending_on_another_threads_loop_ends_the_wait_at_once() -> None:
    """A run host waits for its drain on its control group's loop while its commands run on
    another loop, in another thread (Ray's concurrency groups): the last one ending wakes the
    waiter at once, not when the grace runs out."""
    import threading
    import time

    drain = Drain()
    ready, release = threading.Event(), threading.Event()

    async def command() -> None:
        with drain.track():
            ready.set()
            while not release.is_set():
                await asyncio.sleep(0.01)

    worker = threading.Thread(target=lambda: asyncio.run(command()))
    worker.start()
    assert ready.wait(5)

    async def waiter() -> tuple[DrainReport, float]:
        threading.Timer(0.2, release.set).start()
        began = time.monotonic()
        report = await drain.wait(10.0)
        return report, time.monotonic() - began

    report, waited = asyncio.run(waiter())
    worker.join()
    assert report.idle and report.in_flight == 0, report
    assert waited < 2.0, f"the wait took {waited:.1f}s: woken only by its grace"
