"""A legacy run (its id a version 4, minted before shards: it says nothing of a shard) of a
tenant whose virtual shard moved (issue 41; docs/sharding.md, "Legacy ids"): the move carries it
with the tenant's other rows, and every process routes it by its tenant's placement, learned
when it loads the run, so it completes on the new database."""

from __future__ import annotations

from uuid import uuid4

from grain_harness import Harness, placed, tenant_rows

from runcontrol.bootstrap import build
from runcontrol.commands import SubmitRun
from runcontrol.config import Settings
from runcontrol.domain import RunState, StepSpec, shards
from runcontrol.domain.moves import Step
from runcontrol.store.move import Mover
from runcontrol.store.shards import Shards

VSHARD = 101  # on the first database (the two-shard fixture's second half is the second's)


def test_a_moved_tenants_legacy_run_is_routed_by_its_tenant(two_shards: Shards):
    first, second = two_shards.all()
    h = placed(two_shards, VSHARD)
    h.publish(StepSpec("plan", "agent-a"), StepSpec("write", "agent-b"))
    grain = h.grain(uuid4())  # a run stored before shards
    assert shards.vshard_of(grain.run_id) == shards.LEGACY
    grain.execute(
        SubmitRun(
            tenant_id=h.tenant, run_id=grain.run_id, principal=h.principal(), request=h.request()
        )
    )
    grant = h.lease(grain)  # held across the move
    assert tenant_rows(first.db, "runs", h.tenant) == 1

    moved = Mover([first.db, second.db], quiet_s=0.05).start(VSHARD, 1)
    assert moved.step is Step.DONE
    assert tenant_rows(first.db, "runs", h.tenant) == 0
    assert tenant_rows(second.db, "runs", h.tenant) == 1

    # This process (its directory told of the move) and another one, loading the run afresh,
    # route it to the second database by its tenant.
    two_shards.directory.refresh()
    attempt = h.succeed(h.grain(grain.run_id), grant)
    assert attempt.outcome_hash is not None
    other = Shards([first.db, second.db])
    elsewhere = Harness(build(Settings(), db=other.db, migrate=False), h.tenant, h.clock)
    follow = elsewhere.grain(grain.run_id)
    elsewhere.succeed(follow, elsewhere.lease(follow), n=2)
    assert other.for_run(grain.run_id) is other.all()[1]

    assert h.load(grain.run_id).run.state is RunState.COMPLETED
    assert tenant_rows(first.db, "outbox", h.tenant) == 0  # every event of it committed there
