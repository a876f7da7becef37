"""Fair shares across tenants on the real hosts (issue 21, item 4): a worker pool that serves
every tenant grants tenant B's one run within the first grants after it is dispatched, while
tenant A's deep backlog waits (oldest first across tenants would serve all of A's first).
Asserted from the stored leases and attempts."""

from __future__ import annotations

import uuid
from typing import Any

from actor_harness import RayHarness, poll, run_async
from session_harness import SessionDriver
from sqlalchemy import select

from actors.run_host import make_router
from runcontrol.domain import WorkflowDefinition
from runcontrol.store.tables import attempts, leases

BACKLOG = 40


def two_tenants(h: RayHarness, agent: str) -> RayHarness:
    """Tenant B beside the test's tenant A, both with a one-step workflow of ``agent`` (one
    agent id for both: the pool's workers serve both tenants)."""
    b = RayHarness(h.rt, h.db, f"t-{uuid.uuid4().hex[:12]}")
    definition = WorkflowDefinition.from_dict({"workflowId": "wf", "steps": [{"agentId": agent}]})
    clock = h.rt.container.env.clock
    for tenant in (h.tenant, b.tenant):
        h.rt.container.releases.publish(tenant, definition, "tester", clock.now())
    return b


def grants_since(h: RayHarness, tenants: tuple[str, ...]) -> list[tuple[str, Any, Any]]:
    """Every lease of these tenants' runs, in grant order: (tenant, granted at, run)."""
    with h.db.system_tx() as conn:
        rows = conn.execute(
            select(leases.c.tenant_id, leases.c.granted_at, leases.c.run_id)
            .where(leases.c.tenant_id.in_(tenants))
            .order_by(leases.c.granted_at)
        ).all()
    return [(r.tenant_id, r.granted_at, r.run_id) for r in rows]


def dispatched_at(h: RayHarness, run_id: uuid.UUID) -> Any:
    with h.db.system_tx() as conn:
        return conn.execute(
            select(attempts.c.dispatched_at).where(attempts.c.run_id == run_id)
        ).scalar_one()


def test_one_run_of_a_tenant_is_granted_before_anothers_deep_backlog_drains(
    h: RayHarness,
) -> None:
    agent = h.agent("fair")
    b = two_tenants(h, agent)
    # One slot per host, untenanted (an in-cluster worker): every grant is a choice.
    driver = SessionDriver(make_router(h.rt.config), (agent,), slots_per_host=1)

    async def main() -> None:
        backlog = [(await h.submit()).run_id for _ in range(BACKLOG)]
        interactive = (await b.submit()).run_id

        def done() -> bool:
            return b.run_row(interactive).state == "Completed"

        await driver.run(done, timeout=90)
        await poll(lambda: done() or None, "B's run to complete", timeout=30)
        assert len(backlog) == BACKLOG

    run_async(main(), timeout=150)
    granted = grants_since(h, (h.tenant, b.tenant))
    (b_at,) = [at for tenant, at, _ in granted if tenant == b.tenant]
    (b_run,) = [run for tenant, _, run in granted if tenant == b.tenant]
    since = dispatched_at(h, b_run)
    before_b = [t for t, at, _ in granted if since <= at < b_at]
    # two hosts, one slot each: A's attempt already in the grant (at most one per host),
    # then B's turn on its host
    assert len(before_b) <= 4, before_b
    a_granted = sum(1 for t, at, _ in granted if t == h.tenant and at <= b_at)
    assert a_granted < BACKLOG // 2, a_granted  # most of A's backlog still waited


def test_an_untenanted_claim_takes_another_tenants_attempt_in_its_turn(h: RayHarness) -> None:
    """The unary claim path (``AcquireLease`` by claim, no session) picks the tenant by the
    host's fair shares too, from each tenant's oldest attempts."""
    agent = h.agent("fair-claim")
    b = two_tenants(h, agent)

    async def main() -> list[str]:
        for _ in range(20):
            await h.submit()
        interactive = (await b.submit()).run_id
        await poll(
            lambda: b.run_row(interactive).state == "Running" or None, "B's dispatch", timeout=30
        )
        tenants: list[str] = []
        while b.tenant not in tenants and len(tenants) < 21:
            claim = await h.client.claim([agent], "w-fair", 10.0)
            assert claim is not None
            tenants.append(claim.tenant_id)
        return tenants

    tenants = run_async(main(), timeout=120)
    # each host's first untenanted claim is a tie (A's head older); B's turn is next
    assert b.tenant in tenants[:4], tenants
