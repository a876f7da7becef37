"""Every id minted for a run and its entities carries the run's virtual shard (issue 41,
``domain/shards.py``): the run's (as the edge mints it, in its tenant's shard), its snapshot's,
steps', attempts', leases' and events'. A run stored before shards keeps legacy ids."""

from __future__ import annotations

from uuid import UUID

from grain_harness import Harness
from support import acquire

from runcontrol.commands import SubmitRun
from runcontrol.domain import Limits, StepSpec
from runcontrol.domain.shards import LEGACY, hashed_vshard, vshard_of
from runcontrol.ids import new_run_id
from runcontrol.store.tables import attempts, leases, steps


def entity_ids(h: Harness, run_id: UUID) -> list[UUID | None]:
    """The ids of the run's rows: snapshot, reservation, steps, attempts, leases, events."""
    run = h.load(run_id).run
    return [
        run.snapshot_id,
        run.budget_reservation_id,
        *(r.step_id for r in h.rows(steps, run_id)),
        *(r.attempt_id for r in h.rows(attempts, run_id)),
        *(r.lease_id for r in h.rows(leases, run_id)),
        *(r.event_id for r in h.outbox(run_id)),
    ]


def test_a_submitted_runs_ids_all_carry_its_tenants_virtual_shard(h: Harness):
    h.publish(StepSpec("plan", "agent-a"), StepSpec("write", "agent-b"))
    run_id = new_run_id(h.tenant)  # as edge.commands.submit_run mints it
    grain = h.grain(run_id)
    request = h.request(limits=Limits(max_cost_usd=5.0))
    grain.execute(
        SubmitRun(tenant_id=h.tenant, run_id=run_id, principal=h.principal(), request=request)
    )
    h.succeed(grain, h.lease(grain))
    acquire(grain, h.open_attempt(run_id).attempt_id)

    found = entity_ids(h, run_id)
    assert len(found) >= 9 and None not in found  # 2 steps, 2 attempts, 2 leases, events
    shard = hashed_vshard(h.tenant)
    assert vshard_of(run_id) == shard
    assert {vshard_of(id_) for id_ in found} == {shard}


def test_a_run_stored_before_shards_keeps_legacy_ids(h: Harness):
    grain, _ = h.start_run(StepSpec("only", "agent-a"))  # the harness's run id: a version 4
    assert vshard_of(grain.run_id) == LEGACY
    assert {vshard_of(id_) for id_ in entity_ids(h, grain.run_id) if id_ is not None} == {LEGACY}
