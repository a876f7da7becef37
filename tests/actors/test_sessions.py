"""The worker session, host side (DESIGN 10, issue 24): one exchange per worker per host.

A session's credits are matched, in memory, to the attempts the run's own host dispatches:
each attempt is granted exactly once, by one host, with no refused claim; a lost answer is
found again by claim id; a cancel comes down the session of the attempt's holder."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections import Counter
from typing import Any

import ray
from actor_harness import RayHarness, run_async
from session_harness import SessionDriver, report

from actors.placement import NAMESPACE, HostRouter, host_name
from actors.run_host import make_router
from runcontrol.commands import CancelRun, ReportOutcome, SubmitRun
from runcontrol.domain import AttemptOutcome, canonical_hash
from runcontrol.workers.protocol import MAX_WAIT_S, Credit, SessionDown, SessionUp


def transport(h: RayHarness) -> HostRouter:
    return make_router(h.rt.config)


def three_steps(h: RayHarness, name: str) -> tuple[str, ...]:
    h.publish(
        {"name": "plan", "agentId": f"{name}-a"},
        {"name": "apply", "agentId": f"{name}-b"},
        {"name": "report", "agentId": f"{name}-a"},
    )
    return (h.agent(f"{name}-a"), h.agent(f"{name}-b"))


async def host_stats() -> list[dict[str, Any]]:
    handles = [ray.get_actor(host_name(k), namespace=NAMESPACE) for k in range(2)]
    return list(await asyncio.gather(*(h.stats.remote() for h in handles)))


def test_one_session_completes_runs_each_attempt_granted_once_by_one_host(h: RayHarness) -> None:
    agents = three_steps(h, "sess")
    driver = SessionDriver(transport(h), agents, holder="w-sessions")

    async def main() -> None:
        runs = [(await h.submit(h.request(input={"n": i}))).run_id for i in range(12)]
        before = await host_stats()

        def done() -> bool:
            return all(h.run_row(r).state == "Completed" for r in runs)

        await driver.run(done, timeout=90)
        after = await host_stats()
        granted = Counter(g.lease.attempt_id for _, g in driver.grants)
        assert len(granted) == 36 and set(granted.values()) == {1}
        for run_id in runs:
            row = h.assert_consistent(run_id)
            assert row.state == "Completed"
            events = h.outbox_events(run_id)
            leases = Counter(e["attemptId"] for e in events if e["type"] == "LeaseGranted")
            assert set(leases.values()) == {1} and len(leases) == 3
            # every grant of the run came from one host: the one its commands ran on (its
            # placement's, unless the router still avoids that host after an earlier test
            # drained or killed it: then the other serves the run, and grants it)
            hosts = {k for k, g in driver.grants if g.lease.run_id == run_id}
            assert len(hosts) == 1, hosts
        assert all(
            g.input == {"n": i}
            for i, r in enumerate(runs)
            for _, g in driver.grants
            if g.lease.run_id == r
        )
        assert all(g.deadline_at is not None for _, g in driver.grants)
        answers = [a for rec in driver.received for a in rec.down.answers]
        assert answers and all(a.ok for a in answers), [a for a in answers if not a.ok]
        # no claim went through the old path: the hosts served no claim read
        assert sum(a["reads"] for a in after) == sum(b["reads"] for b in before)
        # fused grants: a dispatch that found a waiting credit leased it in its own commit,
        # so fewer than 7 commands (submit, 3 grants, 3 reports) ran per run
        commands = sum(a["commands"] - b["commands"] for a, b in zip(after, before, strict=True))
        assert commands < 7 * len(runs), commands

    run_async(main(), timeout=120)


def test_a_lost_answer_is_found_again_by_claim_id(h: RayHarness) -> None:
    h.publish({"name": "only", "agentId": "lost-s"})
    agents = (h.agent("lost-s"),)
    t = transport(h)

    async def main() -> None:
        run_id = (await h.submit()).run_id
        k = h.host_of(run_id)
        credit = Credit(str(uuid.uuid4()), "w-lost", agents)
        sid = f"s-{uuid.uuid4().hex[:8]}"
        first = await t.exchange(k, SessionUp(sid, credits=(credit,), wait_s=10))
        (grant,) = first.grants  # answered ... and dropped by the caller
        # the worker resends the credit (no ack): the grant comes down again, the same lease
        again = await t.exchange(
            k, SessionUp(sid, credits=(Credit(credit.claim_id, "w-lost", agents, resent=True),))
        )
        assert [g.lease for g in again.grants] == [grant.lease]
        # acked, the grant is not sent again; the report completes the run
        done = await t.exchange(
            k, SessionUp(sid, commands=(report(grant),), acks=(credit.claim_id,))
        )
        assert not done.grants and [a.ok for a in done.answers] == [True]
        await h.wait_type(run_id, "RunCompleted")
        assert len(h.leases(run_id)) == 1
        h.assert_consistent(run_id)

    run_async(main(), timeout=60)


def test_a_cancel_reaches_the_holders_session_within_a_bound(h: RayHarness) -> None:
    h.publish({"name": "only", "agentId": "cancel-s"})
    agents = (h.agent("cancel-s"),)
    t = transport(h)
    bound_s = 2.0

    async def main() -> None:
        run_id = (await h.submit()).run_id
        k = h.host_of(run_id)
        sid = f"s-{uuid.uuid4().hex[:8]}"
        credit = Credit(str(uuid.uuid4()), "w-cancel", agents)
        (grant,) = (await t.exchange(k, SessionUp(sid, credits=(credit,), wait_s=10))).grants

        async def until_cancelled() -> SessionDown:
            # The long poll may also answer with backlog news (another test's attempt waiting
            # on this host wakes every session of it): poll again, as the SDK does.
            while True:
                up = SessionUp(sid, acks=(credit.claim_id,), wait_s=MAX_WAIT_S)
                down = await t.exchange(k, up)
                if down.cancels:
                    return down
                assert not down.grants and not down.answers, down

        waiting = asyncio.create_task(until_cancelled())
        await asyncio.sleep(0.3)  # the exchange waits on the host
        assert not waiting.done()
        sent = time.monotonic()
        await h.client.send(
            CancelRun(tenant_id=h.tenant, run_id=run_id, requested_by="alice", reason="stop")
        )
        down = await asyncio.wait_for(waiting, bound_s)
        assert time.monotonic() - sent < bound_s
        assert list(down.cancels) == [grant.lease.attempt_id]
        stop = dataclasses.replace(report(grant), outcome=AttemptOutcome.CANCELLED)
        cancelled = await t.exchange(k, SessionUp(sid, commands=(stop,)))
        assert [a.ok for a in cancelled.answers] == [True], cancelled.answers
        await h.wait_type(run_id, "RunCancelled")
        h.assert_consistent(run_id)

    run_async(main(), timeout=60)


def test_a_new_exchange_supersedes_the_waiting_one(h: RayHarness) -> None:
    t = h.client  # RunControlClient is a SessionTransport too (through its router)

    async def main() -> None:
        sid = f"s-{uuid.uuid4().hex[:8]}"
        for _ in range(20):
            waiting = asyncio.create_task(t.exchange(0, SessionUp(sid, wait_s=MAX_WAIT_S)))
            await asyncio.sleep(0.3)
            if not waiting.done():
                break  # waiting on the host
            # answered early (another test's backlog news wakes every session): poll again
        assert not waiting.done()
        newer = await t.exchange(0, SessionUp(sid, wait_s=0))
        superseded = await asyncio.wait_for(waiting, 2.0)
        assert not superseded.grants and not newer.grants
        assert newer.hosts == superseded.hosts == 2

    run_async(main(), timeout=30)


def test_a_late_exchange_offers_no_credit_but_its_commands_count(h: RayHarness) -> None:
    """Exchanges of a session are not delivered in order: one older (``seq``) than the newest
    the host saw must not offer again a credit the newer one withdrew; its commands and acks
    still count."""
    h.publish({"name": "only", "agentId": "late-s"})
    agents = (h.agent("late-s"),)
    t = transport(h)

    async def main() -> None:
        run_id = (await h.submit()).run_id
        k = h.host_of(run_id)
        await h.wait_type(run_id, "AttemptDispatched")
        before = (await host_stats())[k]["late_exchanges"]
        sid = f"s-{uuid.uuid4().hex[:8]}"
        given_up = Credit(str(uuid.uuid4()), "w-late", agents)
        newer = await t.exchange(k, SessionUp(sid, seq=2))
        late = await t.exchange(k, SessionUp(sid, credits=(given_up,), seq=1))
        assert not newer.grants and not late.grants
        quiet = await t.exchange(k, SessionUp(sid, seq=3, wait_s=1.0))
        assert not quiet.grants and quiet.backlog.get(agents[0]) == 1
        assert "LeaseGranted" not in [e["type"] for e in h.outbox_events(run_id)]

        credit = Credit(str(uuid.uuid4()), "w-late", agents)
        (grant,) = (await t.exchange(k, SessionUp(sid, credits=(credit,), seq=4, wait_s=10))).grants
        assert grant.claim_id == credit.claim_id
        # a late exchange's report is answered, and its ack taken
        done = await t.exchange(
            k, SessionUp(sid, commands=(report(grant),), acks=(credit.claim_id,), seq=1)
        )
        assert [a.ok for a in done.answers] == [True]
        await h.wait_type(run_id, "RunCompleted")
        after = await t.exchange(k, SessionUp(sid, seq=5))
        assert not after.grants  # acked by the late exchange
        assert (await host_stats())[k]["late_exchanges"] - before == 2
        h.assert_consistent(run_id)

    run_async(main(), timeout=60)


def test_an_exchange_decides_each_runs_commands_in_one_turn_and_one_document(
    h: RayHarness,
) -> None:
    """Issue 42 point 3: the reports of two runs' parallel steps in one exchange are one actor
    call to their host, and each run's pair one turn of its grain and one document."""
    h.publish(
        {"name": "a", "agentId": "turn-a", "dependsOn": []},
        {"name": "b", "agentId": "turn-a", "dependsOn": []},
    )
    router = transport(h)
    principal = h.principal()
    runs = [r for r in (uuid.uuid4() for _ in range(64)) if h.host_of(r) == 0][:2]

    async def main() -> None:
        for run_id in runs:
            await h.client.send(
                SubmitRun(
                    tenant_id=h.tenant, run_id=run_id, principal=principal, request=h.request()
                )
            )
        claims = [await h.claim("turn-a") for _ in range(4)]
        assert {c.grant.run_id for c in claims} == set(runs)
        before = (await host_stats())[0]
        commands = [
            ReportOutcome(
                **c.fenced(),
                outcome=AttemptOutcome.SUCCEEDED,
                outcome_hash=canonical_hash({"outcome": n}),
            )
            for n, c in enumerate(claims)
        ]
        down = await router.exchange(0, SessionUp(str(uuid.uuid4()), commands=commands))
        after = (await host_stats())[0]
        assert [(a.command_id, a.ok) for a in down.answers] == [
            (c.command_id, True) for c in commands
        ]
        assert after["calls"] - before["calls"] == 1
        assert after["turns"] - before["turns"] == 2
        assert after["commit_documents"] - before["commit_documents"] == 2
        for run_id in runs:
            assert h.run_row(run_id).state == "Completed"
            h.assert_consistent(run_id)

    run_async(main())
