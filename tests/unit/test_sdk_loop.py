"""The worker SDK's loop against an in-process fake of the run hosts' session side.

``FakeHosts`` keeps the rules of ``runcontrol.workers.protocol`` (credits replace the last set, a
grant is resent until acked, commands are answered by command id and a resend gets the
stored answer, a second outcome is refused, a new exchange supersedes the waiting one) and
nothing else: no leases, no database. It tests the SDK's slot, credit and resend logic only;
tests/actors/test_sdk*.py run the SDK against the real hosts."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import Any

import pytest
from sdk_loop_harness import (
    DEADLINE,
    FakeAttempt,
    FakeHosts,
    fast,
    noop_worker,
    run_one,
    scenario,
    until,
)
from support import endless_agent

from runcontrol.commands import (
    Command,
    RenewLease,
    ReportOutcome,
    ReportProgress,
    RequestApproval,
)
from runcontrol.domain import (
    AttemptOutcome,
    FailureClass,
    ToolCallStatus,
    canonical_hash,
    errors,
)
from runcontrol.sdk import Permanent, Step, SyncStep, Transient, Uncertain

# ---------------------------------------------------------------------- the happy path


def test_agents_run_and_each_attempt_reports_its_result_hash_once() -> None:
    hosts = FakeHosts(hosts=2)
    worker = fast(concurrency=2)
    seen: list[tuple[Any, Any, int]] = []

    @worker.agent("planner")
    async def plan(step: Step) -> dict[str, Any]:
        seen.append((step.input, dict(step.results), step.attempt))
        assert step.deadline == DEADLINE
        return {"planned": step.attempt_id.hex}

    @worker.agent("reporter")
    def reporter(step: SyncStep) -> dict[str, Any]:
        assert threading.current_thread() is not threading.main_thread()
        return {"reported": True}

    attempts = [
        FakeAttempt("planner", host=0),
        FakeAttempt("reporter", host=1),
        FakeAttempt("planner", host=1),
    ]

    async def body() -> None:
        for attempt in attempts:
            hosts.dispatch(attempt)
        await until(lambda: len(hosts.outcomes) == 3, "three outcomes")

    scenario(worker, hosts, body)
    for attempt in attempts:
        report = hosts.outcome(attempt)
        assert report.outcome is AttemptOutcome.SUCCEEDED
    assert hosts.outcome(attempts[0]).outcome_hash == canonical_hash(
        {"planned": attempts[0].attempt_id.hex}
    )
    assert seen[0] == ({"n": 1}, {"plan": {"files": 2}}, 1)
    assert worker.completed == 3


def test_each_slot_holds_its_own_leases() -> None:
    hosts = FakeHosts(hosts=1)
    worker = fast(concurrency=3)
    release = asyncio.Event()
    holders: list[str] = []

    @worker.agent("a")
    async def work(step: Step) -> None:
        holders.append(step.holder)
        await release.wait()

    async def body() -> None:
        for _ in range(3):
            hosts.dispatch(FakeAttempt("a", host=0))
        await until(lambda: len(holders) == 3, "three attempts at once")
        release.set()
        await until(lambda: len(hosts.outcomes) == 3, "three outcomes")

    scenario(worker, hosts, body)
    assert sorted(holders) == ["w-1/0", "w-1/1", "w-1/2"]


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("raised", "outcome", "failure_class"),
    [
        (Transient("rate limited"), AttemptOutcome.FAILED, FailureClass.TRANSIENT),
        (Permanent("bad input"), AttemptOutcome.FAILED, FailureClass.PERMANENT),
        (Uncertain("timed out mid-write"), AttemptOutcome.UNCERTAIN, FailureClass.UNCERTAIN),
        (KeyError("a bug"), AttemptOutcome.FAILED, FailureClass.PERMANENT),
    ],
)
def test_errors_map_to_the_failure_classes(
    raised: Exception, outcome: AttemptOutcome, failure_class: FailureClass
) -> None:
    hosts = FakeHosts()
    worker = fast(concurrency=1)

    @worker.agent("a")
    async def fail(step: Step) -> None:
        raise raised

    attempt = FakeAttempt("a", host=0)
    report = run_one(worker, hosts, attempt)
    assert (report.outcome, report.failure_class) == (outcome, failure_class)


# ---------------------------------------------------------------------- exactly once


def test_a_report_whose_answer_was_lost_is_resent_as_the_same_command() -> None:
    hosts = FakeHosts()
    worker = fast(concurrency=1)
    done = asyncio.Event()

    @worker.agent("a")
    async def work(step: Step) -> dict[str, bool]:
        await done.wait()
        return {"ok": True}

    attempt = FakeAttempt("a", host=0)

    async def body() -> None:
        hosts.dispatch(attempt)
        await until(lambda: any(u.credits == () for _, u in hosts.ups), "the grant")
        await asyncio.sleep(0.05)
        hosts.faults = [("after", errors.Unavailable("answer lost")), ("before", ConnectionError())]
        done.set()
        await until(lambda: worker.completed == 1, "the report answered")

    scenario(worker, hosts, body)
    reports = [c for c in hosts.commands if isinstance(c, ReportOutcome)]
    assert len(reports) >= 2
    assert len({c.command_id for c in reports}) == 1
    assert all(c is reports[0] for c in reports)
    assert len(hosts.outcomes[attempt.attempt_id]) == 1


def test_a_credit_carried_by_a_lost_exchange_is_resent_with_its_claim_id() -> None:
    """The host may have granted the credit in the exchange whose answer was lost: the next
    exchange carries it again, ``resent``, with the same claim id, and gets the grant."""
    hosts = FakeHosts()
    worker = noop_worker()

    attempt = FakeAttempt("a", host=0)

    async def body() -> None:
        await until(lambda: bool(hosts.ups), "the first exchange")
        hosts.faults = [("after", errors.Unavailable("answer lost"))]
        hosts.dispatch(attempt)  # granted by the exchange whose answer is lost
        await until(lambda: bool(hosts.outcomes), "the outcome")

    scenario(worker, hosts, body)
    resent = [c for _, u in hosts.ups for c in u.credits if c.resent]
    assert resent, "no credit was resent"
    granted = hosts.outcome(attempt)
    assert granted.holder == "w-1"
    assert resent[0].claim_id in hosts.granted_claims


def test_a_grant_is_acked_and_worked_once_though_resent() -> None:
    hosts = FakeHosts()
    worker = fast(concurrency=1)
    calls = 0

    @worker.agent("a")
    async def work(step: Step) -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.1)

    attempt = FakeAttempt("a", host=0)
    run_one(worker, hosts, attempt)
    assert calls == 1
    claim_id = next(iter(hosts.granted_claims))
    assert any(claim_id in u.acks for _, u in hosts.ups)


def test_a_refusal_for_good_is_not_resent() -> None:
    hosts = FakeHosts()
    worker = noop_worker()

    attempt = FakeAttempt("a", host=0)
    hosts.outcomes[attempt.attempt_id] = []  # placeholder: a second outcome is refused

    def refuse(command: Command[Any]) -> Any:
        raise errors.StaleFencingToken("a newer lease exists")

    effect = hosts._effect
    hosts._effect = lambda c: refuse(c) if isinstance(c, ReportOutcome) else effect(c)  # type: ignore[method-assign]

    async def body() -> None:
        hosts.dispatch(attempt)
        await until(lambda: any(isinstance(c, ReportOutcome) for c in hosts.commands), "the report")
        await asyncio.sleep(0.2)

    scenario(worker, hosts, body)
    assert sum(isinstance(c, ReportOutcome) for c in hosts.commands) == 1
    assert worker.completed == 0


# ---------------------------------------------------------------------- credits


def test_an_idle_credit_moves_to_the_host_with_a_backlog() -> None:
    hosts = FakeHosts(hosts=2)
    worker = noop_worker()

    attempts = [FakeAttempt("a", host=1), FakeAttempt("a", host=0), FakeAttempt("a", host=1)]

    async def body() -> None:
        await until(lambda: any(u.credits for _, u in hosts.ups), "a credit offered")
        for attempt in attempts:
            hosts.dispatch(attempt)
        await until(lambda: len(hosts.outcomes) == 3, "all three worked")

    scenario(worker, hosts, body)
    # One credit at a time: no exchange ever offered two, and never to two hosts at once.
    offered: dict[str, set[int]] = {}
    for host, up in hosts.ups:
        assert len(up.credits) <= 1
        for credit in up.credits:
            offered.setdefault(credit.claim_id, set()).add(host)
    assert {h for hs in offered.values() for h in hs} == {0, 1}


def test_a_credit_moves_without_sitting_out_the_long_poll() -> None:
    """Long polls of 30 s (what users run with: 20): an idle credit on host 0 moves to host 1
    once host 1 reports a backlog, in well under a poll. The exchange that withdraws it asks
    for an answer at once; waiting like a long poll, it held the move for the whole wait (a
    withdrawal is no news to the host)."""
    hosts = FakeHosts(hosts=2)
    worker = noop_worker(wait_s=30.0, probe_s=30.0)
    attempt = FakeAttempt("a", host=1)

    async def body() -> None:
        await until(lambda: any(h == 0 and u.credits for h, u in hosts.ups), "credit on 0")
        began = time.monotonic()
        hosts.dispatch(attempt)
        await until(lambda: attempt.attempt_id in hosts.outcomes, "the move", timeout=10)
        assert time.monotonic() - began < 3.0

    scenario(worker, hosts, body)


def test_an_idle_worker_stops_without_sitting_out_the_long_poll() -> None:
    """Long polls of 30 s: an idle worker told to stop has returned within a second or two
    (``runcontrol up``'s Ctrl-C sat in its demo workers' drain for 4-22 s before)."""
    hosts = FakeHosts(hosts=2)
    worker = noop_worker(wait_s=30.0, probe_s=30.0, concurrency=4)

    async def main() -> None:
        task = asyncio.create_task(worker.run(hosts, "w-1"))
        await until(lambda: len(hosts.waiters) == 2, "a long poll waiting on each host")
        began = time.monotonic()
        worker.stop()
        await asyncio.wait_for(task, 10)
        assert time.monotonic() - began < 2.0

    asyncio.run(main())
    assert all(up.credits == () for _, up in hosts.ups[-2:])


def test_a_stopping_worker_works_what_was_granted_meanwhile() -> None:
    hosts = FakeHosts()
    worker = noop_worker()

    attempt = FakeAttempt("a", host=0)

    async def main() -> None:
        task = asyncio.create_task(worker.run(hosts, "w-1"))
        await until(lambda: any(u.credits for _, u in hosts.ups), "a credit offered")
        # Granted by the host while the worker stops: the grant comes down with the
        # withdrawal's answer and is worked, not left to expire.
        hosts.faults = [("after", errors.Unavailable("answer lost"))]
        hosts.dispatch(attempt)
        await asyncio.sleep(0.01)
        worker.stop()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())
    assert hosts.outcome(attempt).outcome is AttemptOutcome.SUCCEEDED
    last = hosts.ups[-1][1]
    assert last.credits == ()


# ---------------------------------------------------------------------- cancellation


def test_a_pushed_cancel_interrupts_an_async_function_which_reports_cancelled() -> None:
    hosts = FakeHosts()
    worker = fast(concurrency=1)
    started, interrupted = endless_agent(worker, "a")

    attempt = FakeAttempt("a", host=0)

    async def body() -> None:
        hosts.dispatch(attempt)
        await started.wait()
        t0 = time.monotonic()
        hosts.cancel(attempt.attempt_id)
        await asyncio.wait_for(interrupted.wait(), 2)
        await until(lambda: bool(hosts.outcomes), "the outcome")
        assert time.monotonic() - t0 < 2

    scenario(worker, hosts, body)
    assert hosts.outcome(attempt).outcome is AttemptOutcome.CANCELLED


def test_a_sync_function_sees_the_flag_and_one_that_ignores_it_settles_uncertain() -> None:
    hosts = FakeHosts()
    worker = fast(concurrency=2, stop_timeout_s=0.3)
    polite_stopped = threading.Event()
    release = threading.Event()

    @worker.agent("polite")
    def polite(step: SyncStep) -> None:
        while not step.cancelled:
            time.sleep(0.01)
        polite_stopped.set()

    @worker.agent("stubborn")
    def stubborn(step: SyncStep) -> None:
        release.wait(10)

    a, b = FakeAttempt("polite", host=0), FakeAttempt("stubborn", host=0)

    async def body() -> None:
        hosts.dispatch(a)
        hosts.dispatch(b)
        await until(lambda: len(hosts.granted_claims) == 2, "both granted")
        hosts.cancel(a.attempt_id)
        hosts.cancel(b.attempt_id)
        await until(lambda: len(hosts.outcomes) == 2, "both outcomes")

    try:
        scenario(worker, hosts, body)
    finally:
        release.set()
    assert polite_stopped.is_set()
    assert hosts.outcome(a).outcome is AttemptOutcome.CANCELLED
    assert hosts.outcome(b).outcome is AttemptOutcome.UNCERTAIN


def test_a_renewal_saying_cancel_requested_stops_the_function() -> None:
    hosts = FakeHosts(lease_s=0.6)  # renewed every ~0.2 s
    worker = fast(concurrency=1)

    @worker.agent("a")
    async def forever(step: Step) -> None:
        await asyncio.sleep(3600)

    attempt = FakeAttempt("a", host=0)
    hosts._cancels = lambda key: []  # type: ignore[method-assign] # nothing pushed

    async def body() -> None:
        hosts.dispatch(attempt)
        await until(lambda: bool(hosts.granted_claims), "the grant")
        hosts.cancelled.add(attempt.attempt_id)  # the renewal's cancel_requested says it
        await until(lambda: bool(hosts.outcomes), "the outcome")

    scenario(worker, hosts, body)
    assert hosts.outcome(attempt).outcome is AttemptOutcome.CANCELLED
    assert any(isinstance(c, RenewLease) for c in hosts.commands)


# ---------------------------------------------------------------------- approvals


def test_approval_parks_without_an_outcome_and_the_resumed_attempt_reenters() -> None:
    hosts = FakeHosts()
    worker = fast(concurrency=1)
    entries: list[str | None] = []
    effects: list[str] = []
    proposal = {"patch": "abc"}

    @worker.agent("apply")
    async def apply(step: Step) -> dict[str, str]:
        entries.append(step.approved_proposal_hash)
        approval = await step.approval(proposal)
        effects.append(approval.proposal_hash)
        return {"applied": approval.proposal_hash}

    parked = FakeAttempt("apply", host=0, gate="approval")

    async def body() -> None:
        hosts.dispatch(parked)
        await until(lambda: parked.attempt_id in hosts.approvals, "the approval request")
        await until(lambda: any(u.credits for _, u in hosts.ups[-1:]), "the slot freed")
        assert parked.attempt_id not in hosts.outcomes
        # Approved: the attempt is leased again with the approved hash.
        resumed = replace(parked, approved_hash=canonical_hash(proposal), number=2)
        hosts.attempts[parked.attempt_id] = resumed
        hosts.dispatch(resumed)
        await until(lambda: bool(hosts.outcomes), "the outcome")

    scenario(worker, hosts, body)
    assert entries == [None, canonical_hash(proposal)]
    assert effects == [canonical_hash(proposal)]  # nothing ran before the approval
    requests = [c for c in hosts.commands if isinstance(c, RequestApproval)]
    assert len(requests) == 1  # the re-entry did not ask again
    assert hosts.outcome(parked).outcome is AttemptOutcome.SUCCEEDED


# ---------------------------------------------------------------------- progress, tools


def test_progress_and_an_at_most_once_tool_call() -> None:
    hosts = FakeHosts()
    worker = fast(concurrency=1)
    ran: list[str] = []
    repeats: list[Any] = []

    @worker.agent("a")
    async def work(step: Step) -> None:
        await step.progress("starting", {"pct": 0})
        call = await step.tool_call("open-pr", {"title": "x"})
        if call.proceed:
            ran.append("open-pr")
            await call.complete({"pr": 7})
        again = await step.tool_call("open-pr", {"title": "x"})
        repeats.append((again.proceed, again.status, again.result_hash))
        await step.progress("done")

    attempt = FakeAttempt("a", host=0)
    run_one(worker, hosts, attempt)
    assert ran == ["open-pr"]
    assert repeats == [(False, ToolCallStatus.COMPLETED, canonical_hash({"pr": 7}))]
    seqs = [m.seq for c in hosts.commands if isinstance(c, ReportProgress) for m in c.messages]
    assert seqs == [1, 2]


def test_a_lease_certainly_gone_is_given_up() -> None:
    hosts = FakeHosts(lease_s=0.2)
    worker = fast(concurrency=1, lease_grace_s=0.2, renew_every_s=60)
    done = asyncio.Event()

    @worker.agent("a")
    async def work(step: Step) -> None:
        await done.wait()

    attempt = FakeAttempt("a", host=0)

    async def body() -> None:
        hosts.dispatch(attempt)
        await until(lambda: bool(hosts.granted_claims), "the grant")
        hosts.faults = [("before", errors.Unavailable("down"))] * 10_000
        done.set()
        await asyncio.sleep(1.0)
        sends = [c for c in hosts.commands if isinstance(c, ReportOutcome)]
        assert sends == []
        hosts.faults = []

    scenario(worker, hosts, body)
    assert attempt.attempt_id not in hosts.outcomes


def test_a_draining_host_sends_credits_and_commands_to_another_host() -> None:
    hosts = FakeHosts(hosts=2)
    worker = fast(concurrency=2)
    release = asyncio.Event()

    @worker.agent("a")
    async def work(step: Step) -> None:
        await release.wait()

    first, later = FakeAttempt("a", host=0), FakeAttempt("a", host=1)

    async def body() -> None:
        hosts.dispatch(first)
        await until(lambda: bool(hosts.granted_claims), "the grant")
        hosts.draining.add(0)
        release.set()
        await until(lambda: first.attempt_id in hosts.outcomes, "the report, through host 1")
        hosts.dispatch(later)
        await until(lambda: later.attempt_id in hosts.outcomes, "host 1's attempt")

    scenario(worker, hosts, body)
    report = hosts.outcome(first)
    assert [h for h, u in hosts.ups if report in u.commands][-1] == 1
    # both slots ended up offered to host 1
    assert max(len(u.credits) for h, u in hosts.ups if h == 1) == 2


def test_a_late_grant_of_a_withdrawn_credit_is_worked_not_left_to_expire() -> None:
    hosts = FakeHosts(hosts=2)
    worker = noop_worker()

    moved, late = FakeAttempt("a", host=1), FakeAttempt("a", host=0)

    async def body() -> None:
        await until(lambda: any(h == 0 and u.credits for h, u in hosts.ups), "a credit at 0")
        first = next(c.claim_id for h, u in hosts.ups if h == 0 for c in u.credits)
        hosts.dispatch(moved)  # host 1's backlog: the credit moves there
        await until(lambda: moved.attempt_id in hosts.outcomes, "the moved credit's attempt")
        hosts.late_grant(0, first, late)
        await until(lambda: late.attempt_id in hosts.outcomes, "the late grant worked")

    scenario(worker, hosts, body)
    assert hosts.outcome(late).outcome is AttemptOutcome.SUCCEEDED
