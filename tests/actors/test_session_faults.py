"""Worker sessions across host faults: a host killed with a grant outstanding (the credit
resent to the restarted host finds its lease by claim id, in the store), and a draining host
(it takes no credit; another host's sweep grants the attempts it had dispatched).

The hosts of this module grant two-minute leases (``long_leases``): a lease found again here
was not left to expire meanwhile."""

from __future__ import annotations

import time
import uuid
from typing import Any

import ray
from actor_harness import RayHarness, poll, run_async
from session_harness import report
from test_lost_claim_answer import submit_on_host

from actors.placement import NAMESPACE, host_name
from actors.run_host import make_router
from runcontrol.domain import errors
from runcontrol.workers.protocol import Credit, SessionUp


async def kill_and_restart(index: int) -> None:
    """ray.kill host ``index`` (it restarts: ``max_restarts``) and wait for its new process."""
    host = ray.get_actor(host_name(index), namespace=NAMESPACE)
    pid = (await host.stats.remote())["pid"]
    ray.kill(host, no_restart=False)

    async def restarted() -> bool:
        try:
            fresh = ray.get_actor(host_name(index), namespace=NAMESPACE)
            return bool((await fresh.stats.remote())["pid"] != pid)
        except Exception:  # noqa: BLE001 - still restarting
            return False

    await poll(restarted, f"host {index} to restart", timeout=60, interval=0.2)


def test_a_credit_resent_to_a_restarted_host_finds_its_lease(
    h: RayHarness, long_leases: dict[str, Any]
) -> None:
    h.publish({"name": "only", "agentId": "killed-s"})
    agents = (h.agent("killed-s"),)
    t = make_router(long_leases)

    async def main() -> None:
        run_id = await submit_on_host(h, 0)
        sid = f"s-{uuid.uuid4().hex[:8]}"
        credit = Credit(str(uuid.uuid4()), "w-killed", agents)
        (grant,) = (await t.exchange(0, SessionUp(sid, credits=(credit,), wait_s=10))).grants
        await kill_and_restart(0)  # the grant is outstanding (never acked)
        resent = Credit(credit.claim_id, "w-killed", agents, resent=True)
        again = await t.exchange(0, SessionUp(sid, credits=(resent,), wait_s=5))
        assert [g.lease for g in again.grants] == [grant.lease]
        assert again.grants[0].input == {"repo": "x"}
        done = await t.exchange(
            0, SessionUp(sid, commands=(report(grant),), acks=(credit.claim_id,))
        )
        assert [a.ok for a in done.answers] == [True], done.answers
        await h.wait_type(run_id, "RunCompleted")
        (lease,) = h.leases(run_id)
        assert lease.release_cause == "OutcomeReported"
        h.assert_consistent(run_id)

    run_async(main(), timeout=120)


def test_a_draining_host_takes_no_credit_and_another_host_grants_its_attempts(
    h: RayHarness, long_leases: dict[str, Any]
) -> None:
    h.publish({"name": "only", "agentId": "drained-s"})
    agents = (h.agent("drained-s"),)
    t = make_router(long_leases)
    draining = ray.get_actor(host_name(1), namespace=NAMESPACE)

    async def main() -> None:
        run_id = await submit_on_host(h, 1)
        await h.wait_type(run_id, "AttemptDispatched")
        await draining.drain.remote(grace_s=1.0)
        try:
            sid = f"s-{uuid.uuid4().hex[:8]}"
            credit = Credit(str(uuid.uuid4()), "w-drained", agents)
            refused = await t.exchange(1, SessionUp(sid, credits=(credit,), commands=(), wait_s=5))
            assert refused.draining and not refused.grants
            # the worker offers the credit to host 0, whose sweep finds the attempt (an
            # exchange may come back with nothing, e.g. woken by another agent's backlog news:
            # the worker then offers the same credit again, as the SDK does)
            deadline = time.monotonic() + 30
            grants: list[Any] = []
            while not grants:
                assert time.monotonic() < deadline, "host 0 granted nothing within 30 s"
                down = await t.exchange(0, SessionUp(sid, credits=(credit,), wait_s=15))
                grants = list(down.grants)
            (grant,) = grants
            assert grant.lease.run_id == run_id
            fenced = report(grant)
            on_drained = await t.exchange(1, SessionUp(sid, commands=(fenced,)))
            (answer,) = on_drained.answers
            assert not answer.ok and isinstance(answer.value, errors.Draining)
            done = await t.exchange(0, SessionUp(sid, commands=(fenced,), acks=(credit.claim_id,)))
            assert [a.ok for a in done.answers] == [True], done.answers
            await h.wait_type(run_id, "RunCompleted")
            assert len(h.leases(run_id)) == 1
            h.assert_consistent(run_id)
        finally:
            await draining.resume.remote()

    run_async(main(), timeout=120)


def test_an_exchange_waiting_on_a_host_answers_at_once_when_the_host_drains(
    h: RayHarness, long_leases: dict[str, Any]
) -> None:
    """A worker's exchange long-polls a host (nothing to grant); the host drains: the exchange
    answers at once, as draining, so the worker moves its credits to another host now rather
    than when its wait ends (the drain runs on the host's control loop, the exchange waits on
    its command loop)."""
    import asyncio

    agents = (h.agent("nothing-dispatched"),)
    t = make_router(long_leases)
    draining = ray.get_actor(host_name(1), namespace=NAMESPACE)

    async def main() -> None:
        sid = f"s-{uuid.uuid4().hex[:8]}"
        credit = Credit(str(uuid.uuid4()), "w-waiting", agents)
        for _ in range(20):
            waiting = asyncio.ensure_future(
                t.exchange(1, SessionUp(sid, credits=(credit,), commands=(), wait_s=25))
            )
            await asyncio.sleep(1.0)
            if not waiting.done():
                break  # the exchange is waiting on the host
            # answered early (another test's backlog news): offer again, as the SDK does
        assert not waiting.done(), "no exchange stayed waiting on host 1"
        began = time.monotonic()
        try:
            await draining.drain.remote(grace_s=1.0)
            down = await asyncio.wait_for(waiting, 20)
            answered_s = time.monotonic() - began
        finally:
            await draining.resume.remote()
        assert down.draining and not down.grants, down
        assert answered_s < 5.0, f"the waiting exchange answered {answered_s:.1f}s after"

    run_async(main(), timeout=60)


def test_a_fused_first_grant_lost_with_its_host_is_found_by_claim_id(
    h: RayHarness, long_leases: dict[str, Any]
) -> None:
    """The credit waits first: the submission's commit dispatches the first step and leases
    it to the credit in one transaction (its answer stored under the claim id); the host dies
    before the grant is acked; the resent credit finds the lease in the store."""
    import asyncio

    h.publish({"name": "only", "agentId": "fused-s"})
    agents = (h.agent("fused-s"),)
    t = make_router(long_leases)

    async def main() -> None:
        sid = f"s-{uuid.uuid4().hex[:8]}"
        credit = Credit(str(uuid.uuid4()), "w-fused", agents)
        waiting = asyncio.create_task(t.exchange(0, SessionUp(sid, credits=(credit,), wait_s=20)))
        await asyncio.sleep(0.5)
        run_id = await submit_on_host(h, 0)
        (grant,) = (await asyncio.wait_for(waiting, 20)).grants
        assert grant.lease.run_id == run_id
        # one commit: the run's acceptance, its dispatch and the lease
        (journal_tx,) = {j.occurred_at for j in h.journal(run_id)}
        assert journal_tx is not None
        await kill_and_restart(0)
        resent = Credit(credit.claim_id, "w-fused", agents, resent=True)
        again = await t.exchange(0, SessionUp(sid, credits=(resent,), wait_s=5))
        assert [g.lease for g in again.grants] == [grant.lease]
        done = await t.exchange(
            0, SessionUp(sid, commands=(report(grant),), acks=(credit.claim_id,))
        )
        assert [a.ok for a in done.answers] == [True], done.answers
        await h.wait_type(run_id, "RunCompleted")
        assert len(h.leases(run_id)) == 1
        h.assert_consistent(run_id)

    run_async(main(), timeout=120)
