"""Grain commands batched per host: ``HostRouter.send`` -> ``RunHost.command_batch``.

Commands bound for one host leave together as one actor call (at most ``MAX_BATCH`` items, at
most ``MAX_IN_FLIGHT`` calls unanswered per host and event loop); the host runs each item in its
run's mailbox and answers each caller alone. These tests drive the session's real hosts through
the test's own router, ``RecordingRouter``, which records every ``command_batch`` call it makes
(one Ray actor call each) and can hold batches before they leave, to keep them "in flight".

Commands issued in one step of the event loop (one ``gather``, or tasks created without an
``await`` between them) are queued before the router's flush runs on the next turn, so they leave
as one batch per host: the tests rely on that, never on timing.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from actor_harness import RayHarness, assert_typed, outcome_hash, run_async

from actors.placement import MAX_BATCH, MAX_IN_FLIGHT, HostRouter, host_name, unpack
from runcontrol.commands import AcquireLease, Command, OpenAttempts, RenewLease, ReportOutcome
from runcontrol.domain import Attempt, AttemptOutcome, LeaseGrant, errors

Item = Command[Any]


@dataclass
class Batch:
    host: str
    items: list[Item]


@dataclass
class Hold:
    """Batches of one event loop kept from reaching Ray until ``release`` is set; each is put
    on ``entered`` as it arrives."""

    release: asyncio.Event
    entered: asyncio.Queue[Batch]


class RecordingRouter(HostRouter):
    """A router that records its ``command_batch`` calls and can hold a loop's batches before
    they reach Ray (they count as in flight). Other calls pass straight through."""

    def __init__(self, host_count: int) -> None:
        super().__init__(host_count)
        self.batches: list[Batch] = []
        self.in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}
        self._holds: dict[asyncio.AbstractEventLoop, Hold] = {}

    def hold(self) -> Hold:
        """Hold the running loop's batches from now on (the router's other loops go on)."""
        hold = Hold(asyncio.Event(), asyncio.Queue())
        self._holds[asyncio.get_running_loop()] = hold
        return hold

    def forget_holds(self) -> None:
        self._holds.clear()  # they reference their loops

    async def call_named(self, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if method != "command_batch_packed":
            return await super().call_named(name, method, *args, **kwargs)
        batch = Batch(name, list(unpack(args[0])))
        self.batches.append(batch)
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        self.max_in_flight[name] = max(self.max_in_flight.get(name, 0), self.in_flight[name])
        try:
            hold = self._holds.get(asyncio.get_running_loop())
            if hold is not None:
                hold.entered.put_nowait(batch)
                await hold.release.wait()
            return await super().call_named(name, method, *args, **kwargs)
        finally:
            self.in_flight[name] -= 1


def collect_until_gone(refs: list[weakref.ref[Any]], within_s: float = 5.0) -> list[Any]:
    """Collect garbage until every referent is gone or ``within_s`` passed; answers what is
    left alive. Not one ``gc.collect()``: Ray's completion thread still holds the last actor
    call's callback (and through it that loop's future and the loop) for a moment after the
    answer arrived (seen once in 60 loops on a loaded machine, no Python referrer, gone 20 ms
    later). A loop the router kept would stay alive for the whole wait."""
    deadline = time.monotonic() + within_s
    while True:
        gc.collect()
        alive = [ref() for ref in refs if ref() is not None]
        if not alive or time.monotonic() > deadline:
            return alive
        del alive
        time.sleep(0.02)


def recording_router(h: RayHarness) -> RecordingRouter:
    return RecordingRouter(h.rt.settings.grains.host_count)


def open_attempts(tenant: str, run_id: UUID) -> OpenAttempts:
    return OpenAttempts(tenant_id=tenant, run_id=run_id)


def acquire(tenant: str, run_id: UUID, attempt_id: UUID, holder: str) -> AcquireLease:
    return AcquireLease(tenant_id=tenant, run_id=run_id, attempt_id=attempt_id, holder=holder)


def renew(tenant: str, run_id: UUID, attempt_id: UUID, holder: str, token: int) -> RenewLease:
    return RenewLease(
        tenant_id=tenant, run_id=run_id, attempt_id=attempt_id, holder=holder, fencing_token=token
    )


def report(
    tenant: str,
    run_id: UUID,
    attempt_id: UUID,
    holder: str,
    token: int,
    outcome: AttemptOutcome = AttemptOutcome.SUCCEEDED,
    **kw: Any,
) -> ReportOutcome:
    return ReportOutcome(
        tenant_id=tenant,
        run_id=run_id,
        attempt_id=attempt_id,
        holder=holder,
        fencing_token=token,
        outcome=outcome,
        **kw,
    )


async def let_the_loop_turn(turns: int = 20) -> None:
    """Yield to the event loop ``turns`` times (no waiting on time): more than enough turns for
    a queued command to be flushed and its batch handed to ``call_named``, if it may leave."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def dispatched_runs(h: RayHarness, n: int) -> list[tuple[UUID, UUID]]:
    """``n`` runs of a one-step workflow (published by the test), each with its attempt
    Dispatched (submission dispatches the first step in the same transaction)."""
    results = await asyncio.gather(*(h.submit() for _ in range(n)))
    runs = []
    for result in results:
        (attempt,) = h.attempts(result.run_id)
        assert attempt.state == "Dispatched"
        runs.append((result.run_id, UUID(str(attempt.attempt_id))))
    return runs


def on_one_host(router: HostRouter, runs: list[tuple[UUID, UUID]]) -> list[tuple[UUID, UUID]]:
    """The runs placed on the host that holds the most of them."""
    by_host: dict[str, list[tuple[UUID, UUID]]] = {}
    for run in runs:
        by_host.setdefault(router.name_for(run[0]), []).append(run)
    return max(by_host.values(), key=len)


def unknown_run_on(router: HostRouter, host: str) -> UUID:
    while True:
        run_id = uuid.uuid4()
        if router.name_for(run_id) == host:
            return run_id


def queue_behind(router: HostRouter, tenant: str, runs: list[tuple[UUID, UUID]]) -> None:
    """More commands than one batch takes, issued while the host's batches are all in flight:
    they wait in the router's queue (callers that will give up with their loop)."""
    for k in range(MAX_BATCH + 10):
        run_id = runs[k % len(runs)][0]
        asyncio.create_task(router.send(open_attempts(tenant, run_id)))


async def host_commands(router: HostRouter) -> int:
    """Commands the hosts themselves counted (``RunHost.stats``), summed over the hosts."""
    stats = await asyncio.gather(
        *(router.call_named(host_name(k), "stats") for k in range(router.host_count))
    )
    return sum(s["commands"] for s in stats)


# ---------------------------------------------------------------------- coalescing


def test_concurrent_commands_share_actor_calls_and_each_caller_gets_its_own_answer(
    h: RayHarness,
) -> None:
    h.publish({"name": "only", "agentId": "a"})
    router = recording_router(h)

    async def main() -> None:
        runs = await dispatched_runs(h, 40)
        counted_before = await host_commands(router)

        grants = await asyncio.gather(
            *(
                router.send(acquire(h.tenant, run_id, attempt_id, f"w-{i}"))
                for i, (run_id, attempt_id) in enumerate(runs)
            )
        )
        counted_after = await host_commands(router)

        for i, ((run_id, attempt_id), grant) in enumerate(zip(runs, grants, strict=True)):
            assert isinstance(grant, LeaseGrant)
            assert (grant.run_id, grant.attempt_id, grant.holder) == (run_id, attempt_id, f"w-{i}")
            assert (grant.fencing_token, grant.attempt_number) == (1, 1)
            assert [(x.holder, x.fencing_token) for x in h.leases(run_id)] == [(f"w-{i}", 1)]

        # 40 commands, one actor call per host: each went once, to its run's host.
        hosts = {router.name_for(run_id) for run_id, _ in runs}
        assert len(router.batches) == len(hosts) < len(runs)
        sent = [
            (type(item).__name__, item.run_id, item.attempt_id, item.holder)
            if isinstance(item, AcquireLease)
            else (type(item).__name__, item.run_id)
            for batch in router.batches
            for item in batch.items
        ]
        assert sorted(sent, key=str) == sorted(
            (
                ("AcquireLease", run_id, attempt_id, f"w-{i}")
                for i, (run_id, attempt_id) in enumerate(runs)
            ),
            key=str,
        )
        for batch in router.batches:
            assert {router.name_for(item.run_id) for item in batch.items} == {batch.host}
        # The hosts ran every command (the scheduler may have added its own meanwhile).
        assert counted_after - counted_before >= len(runs) > len(router.batches)

    run_async(main(), timeout=90)


def test_a_refused_command_fails_only_its_own_caller(h: RayHarness) -> None:
    """One burst, one batch: refusals (LeaseHeld, StaleFencingToken, RunNotFound) reach their
    own callers as those typed errors, while every other command in the same call succeeds."""
    h.publish({"name": "only", "agentId": "a"})
    router = recording_router(h)

    async def main() -> None:
        (a, att_a), (b, att_b), (c, att_c), (d, att_d) = on_one_host(
            router, await dispatched_runs(h, 8)
        )[:4]
        host = router.name_for(a)
        missing = unknown_run_on(router, host)

        results = await asyncio.gather(
            router.send(acquire(h.tenant, a, att_a, "w-a")),
            router.send(acquire(h.tenant, a, att_a, "w-other")),  # after w-a: held
            router.send(acquire(h.tenant, b, att_b, "w-b")),
            router.send(acquire(h.tenant, c, att_c, "w-c")),
            router.send(
                report(h.tenant, c, att_c, "w-c", 0, AttemptOutcome.SUCCEEDED)
            ),  # token 0 while the lease's is 1: stale
            router.send(acquire(h.tenant, d, att_d, "w-d")),
            router.send(
                report(
                    h.tenant,
                    d,
                    att_d,
                    "w-d",
                    1,
                    AttemptOutcome.SUCCEEDED,
                    outcome_hash=outcome_hash("d"),
                )
            ),
            router.send(open_attempts(h.tenant, missing)),
            return_exceptions=True,
        )

        # They did share one actor call.
        assert [(batch.host, len(batch.items)) for batch in router.batches] == [(host, 8)]
        grant_a, held, grant_b, grant_c, stale, grant_d, outcome_d, not_found = results
        assert_typed(held, errors.LeaseHeld)
        assert_typed(stale, errors.StaleFencingToken)
        assert_typed(not_found, errors.RunNotFound)
        for grant, run_id, holder in (
            (grant_a, a, "w-a"),
            (grant_b, b, "w-b"),
            (grant_c, c, "w-c"),
        ):
            assert isinstance(grant, LeaseGrant), grant
            assert (grant.run_id, grant.holder, grant.fencing_token) == (run_id, holder, 1)
        assert isinstance(grant_d, LeaseGrant) and grant_d.run_id == d
        assert isinstance(outcome_d, Attempt) and str(outcome_d.state) == "Succeeded"

        # The store agrees: refusals changed nothing but their audit record.
        assert [x.holder for x in h.leases(a)] == ["w-a"]
        assert [x.holder for x in h.leases(c)] == ["w-c"]
        assert len(h.audits(c, "stale-fencing-token")) == 1
        assert h.run_row(c).state == "Running"
        assert h.run_row(d).state == "Completed"
        for run_id in (a, b, c, d):
            h.assert_consistent(run_id)

    run_async(main(), timeout=90)


def test_one_callers_commands_for_a_run_run_in_the_order_sent(h: RayHarness) -> None:
    """A caller sends each run's lease, renewal, outcome and a repeat of the outcome one after
    another without awaiting them (interleaved with other runs' commands): every run's commands
    run in that order, which is the only order in which all of them succeed.

    (Commands sent in different loop turns while a batch to the host is already in flight leave
    in separate actor calls, which an async actor may start in either order, DESIGN 9.6: a
    caller that needs an order across those awaits the first answer.)"""
    h.publish({"name": "only", "agentId": "a"})
    router = recording_router(h)

    async def main() -> None:
        runs = await dispatched_runs(h, 6)
        versions = {run_id: h.run_row(run_id).version for run_id, _ in runs}

        def sequence(run_id: UUID, attempt_id: UUID, i: int) -> list[Command[Any]]:
            holder, succeeded = f"w-{i}", AttemptOutcome.SUCCEEDED
            return [
                acquire(h.tenant, run_id, attempt_id, holder),
                renew(h.tenant, run_id, attempt_id, holder, 1),
                report(h.tenant, run_id, attempt_id, holder, 1, succeeded),
                report(h.tenant, run_id, attempt_id, holder, 1, succeeded),  # a retry: same answer
            ]

        sequences = [sequence(run_id, attempt_id, i) for i, (run_id, attempt_id) in enumerate(runs)]
        tasks: list[list[asyncio.Task[Any]]] = [[] for _ in runs]
        for step in range(4):
            for i in range(len(runs)):
                tasks[i].append(asyncio.create_task(router.send(sequences[i][step])))
        await asyncio.gather(*(t for per_run in tasks for t in per_run), return_exceptions=True)

        for i, (run_id, _) in enumerate(runs):
            grant, renewed, outcome, repeated = (t.result() for t in tasks[i])
            assert isinstance(grant, LeaseGrant) and isinstance(renewed, LeaseGrant)
            assert grant.lease_id == renewed.lease_id and grant.holder == f"w-{i}"
            assert isinstance(outcome, Attempt) and str(outcome.state) == "Succeeded"
            assert repeated == outcome
            run = h.run_row(run_id)
            # one batch: the run's four commands one turn of its grain, one commit
            assert (run.state, run.version) == ("Completed", versions[run_id] + 1)
            types = [e["type"] for e in h.outbox_events(run_id)]
            assert types.index("LeaseGranted") < types.index("AttemptOutcomeRecorded")
            assert types[-1] == "RunCompleted"
        # All sent in one loop turn: one batch per host, in the order sent.
        assert len(router.batches) == len({router.name_for(run_id) for run_id, _ in runs})
        for batch in router.batches:
            for run_id, _ in runs:
                names = [type(item) for item in batch.items if item.run_id == run_id]
                assert names in ([], [AcquireLease, RenewLease, *[ReportOutcome] * 2])

    run_async(main(), timeout=90)


async def host_stats(router: HostRouter, host: str) -> dict[str, Any]:
    return dict(await router.call_named(host, "stats"))


def test_a_batchs_cached_runs_commit_as_one_group_and_later_commands_queue_behind(
    h: RayHarness,
) -> None:
    """A batch's commands start in the same turn of the host's loop, so the cached runs'
    commits share statements (``GroupCommit``): fewer commit statements than runs. A run's
    second command in the same batch is decided in the same turn of its grain, on what the
    first left, and both commit as one document (``runcontrol.grain.turn``)."""
    h.publish({"name": "only", "agentId": "a"})
    router = recording_router(h)

    async def main() -> None:
        runs = on_one_host(router, await dispatched_runs(h, 16))
        host = router.name_for(runs[0][0])
        before = await host_stats(router, host)

        calls = []
        for i, (run_id, attempt_id) in enumerate(runs):
            calls.append(router.send(acquire(h.tenant, run_id, attempt_id, f"w-{i}")))
            calls.append(
                router.send(
                    report(
                        h.tenant,
                        run_id,
                        attempt_id,
                        f"w-{i}",
                        1,
                        AttemptOutcome.SUCCEEDED,
                        outcome_hash=outcome_hash(i),
                    )
                )
            )
        answers = await asyncio.gather(*calls)
        after = await host_stats(router, host)

        assert [(batch.host, len(batch.items)) for batch in router.batches] == [
            (host, 2 * len(runs))
        ]
        for i, (run_id, _) in enumerate(runs):
            grant, outcome = answers[2 * i], answers[2 * i + 1]
            assert isinstance(grant, LeaseGrant) and grant.holder == f"w-{i}"
            assert isinstance(outcome, Attempt) and str(outcome.state) == "Succeeded"
            assert h.run_row(run_id).state == "Completed"
            h.assert_consistent(run_id)
        statements = after["commit_groups"] - before["commit_groups"]
        documents = after["commit_documents"] - before["commit_documents"]
        assert documents == len(runs) > statements
        assert after["turns"] - before["turns"] == len(runs)

    run_async(main(), timeout=90)


# ---------------------------------------------------------------------- bounds


def test_batches_in_flight_and_batch_size_are_bounded_per_host(h: RayHarness) -> None:
    h.publish({"name": "only", "agentId": "a"})
    router = recording_router(h)

    async def main() -> None:
        runs = on_one_host(router, await dispatched_runs(h, 8))
        host = router.name_for(runs[0][0])
        expected = {run_id: [attempt_id] for run_id, attempt_id in runs}

        def wave(n: int) -> list[tuple[UUID, asyncio.Task[Any]]]:
            chosen = [runs[k % len(runs)][0] for k in range(n)]
            return [
                (run_id, asyncio.create_task(router.send(open_attempts(h.tenant, run_id))))
                for run_id in chosen
            ]

        hold = router.hold()
        held: list[tuple[UUID, asyncio.Task[Any]]] = []
        for _ in range(MAX_IN_FLIGHT):
            held += wave(3)
            await hold.entered.get()  # one more batch in flight (held before Ray)
        queued = wave(2 * MAX_BATCH + 22)
        try:
            await let_the_loop_turn()
            assert len(router.batches) == MAX_IN_FLIGHT, "a batch left beyond MAX_IN_FLIGHT"
        finally:  # even on failure: no command left behind for asyncio.run to cancel
            hold.release.set()
            await asyncio.gather(*(task for _, task in held + queued), return_exceptions=True)
        for run_id, task in held + queued:
            assert task.result() == expected[run_id]

        # The queued commands left as full batches, each once an earlier one was answered.
        sizes = [len(batch.items) for batch in router.batches]
        assert sizes == [3] * MAX_IN_FLIGHT + [MAX_BATCH, MAX_BATCH, 22]
        assert {batch.host for batch in router.batches} == {host}
        assert router.max_in_flight == {host: MAX_IN_FLIGHT}

    run_async(main(), timeout=90)


# ---------------------------------------------------------------------- event loops


def test_router_serves_successive_event_loops_and_keeps_none_of_them(h: RayHarness) -> None:
    """A process may run several event loops one after another (``asyncio.run`` each time):
    one router serves them all, and a finished loop is not kept alive by the router's queues."""
    h.publish({"name": "only", "agentId": "a"})
    router = recording_router(h)
    runs = run_async(dispatched_runs(h, 6))
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def burst() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        answers = await asyncio.gather(
            *(router.send(open_attempts(h.tenant, run_id)) for run_id, _ in runs * 3)
        )
        assert answers == [[attempt_id] for _, attempt_id in runs * 3]

    hosts = {router.name_for(run_id) for run_id, _ in runs}
    for _ in range(3):
        calls = len(router.batches)
        run_async(burst(), timeout=60)
        assert len(router.batches) - calls == len(hosts)  # batched in every loop
    assert collect_until_gone(loops) == []


def abandon_a_loop(
    h: RayHarness, router: RecordingRouter, runs: list[tuple[UUID, UUID]]
) -> tuple[weakref.ref[asyncio.AbstractEventLoop], list[Any]]:
    """Run a loop that ends with ``MAX_IN_FLIGHT`` batches in flight (held) for the runs' host
    and more than a batch of commands queued behind them: ``asyncio.run`` then cancels every
    caller and the held batches, and closes the loop. Returns a weak reference to that loop and
    the exceptions Python reported as ignored (unraisable) while its leftovers were collected,
    which happens here (``gc.collect``) rather than in some later test."""
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def abandon() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        hold = router.hold()
        for _ in range(MAX_IN_FLIGHT):
            for run_id, _ in runs:
                asyncio.create_task(router.send(open_attempts(h.tenant, run_id)))
            await hold.entered.get()
        queue_behind(router, h.tenant, runs)
        await let_the_loop_turn()
        assert len(router.batches) == MAX_IN_FLIGHT

    ignored: list[Any] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: ignored.append(
        (unraisable.exc_value, unraisable.object)
    )
    try:
        asyncio.run(abandon())
        router.forget_holds()
        collect_until_gone([loops[0]])
    finally:
        sys.unraisablehook = previous
    return loops[0], ignored


def test_router_serves_a_new_loop_after_one_closed_with_commands_outstanding(
    h: RayHarness,
) -> None:
    """A loop that ends with batches in flight and commands queued (its callers gave up) must
    not hand its queue state to the next loop: the next loops' commands leave and are answered.
    (What the closed loop leaves behind is the next test.)"""
    h.publish({"name": "only", "agentId": "a"})
    router = recording_router(h)
    runs = on_one_host(router, run_async(dispatched_runs(h, 6)))
    abandon_a_loop(h, router, runs)

    async def burst() -> None:
        answers = await asyncio.gather(
            *(router.send(open_attempts(h.tenant, run_id)) for run_id, _ in runs)
        )
        assert answers == [[attempt_id] for _, attempt_id in runs]

    for _ in range(2):
        calls = len(router.batches)
        run_async(burst(), timeout=30)
        assert len(router.batches) == calls + 1


def test_a_loop_closed_with_commands_outstanding_leaves_nothing_behind(h: RayHarness) -> None:
    """The router keeps nothing of a loop that closed with commands queued and in flight (no
    queue, no future of it: the loop itself is collected), and collecting its leftovers raises
    nothing (no clean-up that touches the closed loop)."""
    h.publish({"name": "only", "agentId": "a"})
    router = recording_router(h)
    runs = on_one_host(router, run_async(dispatched_runs(h, 4)))

    loop, ignored = abandon_a_loop(h, router, runs)

    assert (loop() is None, ignored) == (True, []), (
        "the router keeps the closed loop (and its futures) alive, or its clean-up failed"
    )


def test_two_event_loops_at_once_keep_their_own_queues(h: RayHarness) -> None:
    """Two threads, each running a loop, share one router: while one loop's batches to a host
    are all in flight (held), the other loop's commands to that host still leave and are
    answered; the first loop's then complete too."""
    h.publish({"name": "only", "agentId": "a"})
    router = recording_router(h)
    runs = on_one_host(router, run_async(dispatched_runs(h, 6)))
    expected = [[attempt_id] for _, attempt_id in runs]
    holding, released = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    async def hold_the_host() -> list[Any]:
        hold = router.hold()
        tasks = []
        for _ in range(MAX_IN_FLIGHT):
            tasks += [
                asyncio.create_task(router.send(open_attempts(h.tenant, run_id)))
                for run_id, _ in runs
            ]
            await hold.entered.get()
        holding.set()
        await asyncio.to_thread(released.wait)
        hold.release.set()
        return list(await asyncio.gather(*tasks))

    def other_thread() -> None:
        try:
            outcome["answers"] = run_async(hold_the_host(), timeout=60)
        except BaseException as exc:  # handed to the test to assert on
            outcome["error"] = exc

    async def burst() -> list[Any]:
        return list(
            await asyncio.gather(
                *(router.send(open_attempts(h.tenant, run_id)) for run_id, _ in runs)
            )
        )

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        assert holding.wait(timeout=30), outcome
        assert run_async(burst(), timeout=30) == expected
    finally:
        released.set()
        thread.join(timeout=60)
        router.forget_holds()
    assert not thread.is_alive()
    assert outcome == {"answers": expected * MAX_IN_FLIGHT}
