"""Run hosts and schedulers on two shard databases, on the session's Ray (issue 41).

The runtime's database is the first shard, a second database is added, and the virtual shards
from ``SECOND_HALF`` on are put on it. The hosts, restarted with both listed, route every
command and read by the run's id (a run minted in its tenant's shard); a scheduler of its own
serves both, but holds only the second's lock (the session's scheduler holds the first's). Each
shard's lease expiry and relay run in its lock holder: killing the second's scheduler leaves
its leases to the scheduler started after it, while the first shard goes on, and every row of
the tenant on the second database is there, none in the first."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

from actor_harness import RayHarness, outcome_hash, run_async
from sqlalchemy import text
from support import SECOND_HALF, counted, ray_on_two_databases, tenant_in

from runcontrol.commands import ReportOutcome, SubmitRun
from runcontrol.domain import AttemptOutcome
from runcontrol.domain.shards import vshard_of
from runcontrol.ids import new_run_id
from runcontrol.store import Database
from runcontrol.store.queries import UNPUBLISHED_SQL


def unpublished(db: Database, tenant: str) -> int:
    with db.system_tx() as conn:
        left = f"SELECT count(*) FROM outbox WHERE tenant_id = :t AND {UNPUBLISHED_SQL}"
        return int(conn.execute(text(left), {"t": tenant}).scalar_one())


def wait_until(check: Callable[[], bool], timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


async def expire_once(h: RayHarness, run_id: UUID, after: int) -> int:
    """Claim the run's open attempt and let its lease expire: the seq of ``LeaseExpired``."""
    await h.claim("only", timeout=20.0)
    expired = await h.wait_type(run_id, "LeaseExpired", after=after, timeout=30.0)
    return int(expired["seq"])


def test_hosts_and_schedulers_serve_two_shard_databases(ray_runtime: Any, owner_url: str):
    import ray

    from actors.scheduler import ensure_scheduler

    schedulers: list[Any] = []
    with ray_on_two_databases(ray_runtime, owner_url, "runcontrol_ray_shard1") as runtime:
        first, second, shards = runtime.first, runtime.second, runtime.shards
        settings = runtime.settings
        try:
            schedulers.append(ensure_scheduler(settings, ray_runtime.owner_url, name="shards-a"))
            status = ray.get(schedulers[0].status.remote())
            assert status["shards_held"] == [1]  # the session's scheduler holds the first's lock

            h0 = RayHarness(runtime, shards.db, tenant_in(0))
            h1 = RayHarness(runtime, shards.db, tenant_in(1))

            async def main() -> list[UUID]:
                runs = []
                for h in (h0, h1):
                    h.publish({"name": "only", "agentId": "only", "maxAttempts": 5})
                    principal = h.principal()
                    run_id = new_run_id(h.tenant, shards.vshard_for)  # as the edge mints it
                    await h.client.send(
                        SubmitRun(
                            tenant_id=h.tenant,
                            run_id=run_id,
                            principal=principal,
                            request=h.request(),
                        )
                    )
                    runs.append(run_id)
                # each shard's lease expiry, by its own lock holder
                seqs = await asyncio.gather(
                    expire_once(h0, runs[0], 0), expire_once(h1, runs[1], 0)
                )
                # the second shard's scheduler dies; another one takes its lock over, the first
                # shard's leases expire on time meanwhile
                ray.kill(schedulers[0], no_restart=True)
                schedulers.append(
                    ensure_scheduler(settings, ray_runtime.owner_url, name="shards-b")
                )
                await asyncio.gather(
                    expire_once(h0, runs[0], seqs[0]), expire_once(h1, runs[1], seqs[1])
                )
                for h, run_id in zip((h0, h1), runs, strict=True):
                    claim = await h.claim("only", timeout=20.0)
                    await h.client.send(
                        ReportOutcome(
                            **claim.fenced(),
                            outcome=AttemptOutcome.SUCCEEDED,
                            outcome_hash=outcome_hash(1),
                        )
                    )
                    await h.history(run_id, timeout=30.0)
                return runs

            runs = run_async(main(), timeout=180.0)
            assert ray.get(schedulers[1].status.remote())["shards_held"] == [1]
            assert [shards.for_run(r).index for r in runs] == [0, 1]
            assert vshard_of(runs[1]) >= SECOND_HALF
            for table in ("runs", "attempts", "leases", "outbox", "recovery_journal", "releases"):
                assert counted(first, table, h1.tenant) == 0, table
                assert counted(second, table, h1.tenant) > 0, table
                assert counted(second, table, h0.tenant) == 0, table
            # the second shard's events relayed by its scheduler
            assert wait_until(lambda: unpublished(second, h1.tenant) == 0)
        finally:
            for handle in schedulers:
                ray.kill(handle, no_restart=True)
