"""restore-check: after the store was restored from a backup, settle the leases it holds open.

The spec's recovery for "control store restore after loss" (D30): "runs with open leases are
reconciled as Uncertain and surfaced to operators". A lease open in the backup may have been
renewed, acted on or settled after the backup was taken, by transitions the restore lost; its
holder may still be working. So each run holding one gets ``SettleRestoredLeases``: its grain
revokes the leases, audits each, settles their attempts ``Uncertain`` (cause
``restored-from-backup``) and the run goes on by its rules (a shared-write step fails the run
for an operator; a read step is retried under a new fencing token, so the old holder's late
report is refused). The commands go through the normal write path: grains driven here, on
this process's loop, committing through ``runcontrol_apply`` (a host activation of the same
run is harmless: the version guard makes one of the two decide again). Run it after the
restore and before the service and its workers start (docs/operations.md).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from uuid import UUID

from .bootstrap import Container
from .commands import SettleRestoredLeases
from .grain import RunGrain
from .store import queries as q


@dataclass(frozen=True, slots=True)
class Settled:
    tenant_id: str
    run_id: UUID
    attempts: list[str]  # the attempts settled Uncertain (their leases revoked)
    run_state: str  # the run's state after it


async def restore_check(container: Container) -> list[Settled]:
    """Settle every open lease of the store; answers what each run's grain settled."""

    def open_leases() -> list[tuple[str, UUID]]:
        found: list[tuple[str, UUID]] = []
        for each in container.db.databases():  # every shard's
            with each.system_tx() as conn:
                found += q.runs_with_open_leases(conn)
        return found

    settled: list[Settled] = []
    for tenant_id, run_id in await asyncio.to_thread(open_leases):
        grain = RunGrain(container.env, tenant_id, run_id)
        attempts = await grain.execute(SettleRestoredLeases(tenant_id=tenant_id, run_id=run_id))
        view = await container.store.load(tenant_id, run_id, container.env.clock.now())
        settled.append(Settled(tenant_id, run_id, attempts, str(view[0].run.state)))
    return settled
