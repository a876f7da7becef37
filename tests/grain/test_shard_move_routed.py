"""A virtual shard's move as the processes live it (issue 41, point 5; docs/sharding.md "Moving
a tenant"): while the shard moves, a submission is refused 503 with ``Retry-After`` before
anything is stored (the edge mints the run's id in ``Directory.placement``) and a worker's
report is refused retryable by the fence; once the directory flips, a host whose directory is
stale routes the report again by a fresh one (``ShardMoved``: ``store.rerouted``), and the run
completes on the new database with one outcome per attempt and no event gap."""

from __future__ import annotations

from typing import Any

import pytest
from grain_harness import Harness, edge_submission, placed, submit_placed, tenant_rows
from support import drive

from runcontrol.api import problems
from runcontrol.bootstrap import build
from runcontrol.config import Settings
from runcontrol.domain import RunState, StepSpec, errors
from runcontrol.domain.moves import Step
from runcontrol.store.move import Mover
from runcontrol.store.shards import Shards

VSHARD = 100  # on the first database (the two-shard fixture's second half is the second's)


def test_a_run_in_flight_completes_on_the_new_database_and_submissions_wait(
    two_shards: Shards,
):
    first, second = two_shards.all()
    h = placed(two_shards, VSHARD)
    grain = submit_placed(h, StepSpec("plan", "agent-a"), StepSpec("write", "agent-b"))
    grant = h.lease(grain)  # the worker holds the first step's lease across the move
    events = [(r.seq, r.event_id) for r in h.outbox(grain.run_id)]
    # another process (a second run host) whose directory was loaded before the move and is
    # never told of it
    stale = Shards([first.db, second.db])
    assert stale.for_run(grain.run_id) is stale.all()[0]
    elsewhere = Harness(build(Settings(), db=stale.db, migrate=False), h.tenant, h.clock)
    during: dict[Step, Any] = {}

    def meanwhile(step: Step) -> None:
        if step is Step.MARKING:  # the hosts and the edge hear of the move
            two_shards.directory.refresh()
            with pytest.raises(errors.ShardMoving) as refused:
                edge_submission(h, two_shards.db)
            during[step] = problems.from_error(refused.value)
        if step is Step.FENCING:  # the worker reports while the rows are copied (to a grain
            # loaded afresh: ``grain`` keeps its rows cached across the move)
            with pytest.raises(errors.ShardMoved) as fenced:
                h.succeed(h.grain(grain.run_id), grant)
            during[step] = fenced.value

    moved = Mover([first.db, second.db], quiet_s=0.05, hook=meanwhile).start(VSHARD, 1)

    assert moved.step is Step.DONE
    answer = during[Step.MARKING]
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "5"
    assert answer.media_type == "application/problem+json"
    assert during[Step.FENCING].retryable  # the worker sends its report again
    assert tenant_rows(first.db, "runs", h.tenant) == 0  # nothing of the tenant left behind
    assert (
        tenant_rows(second.db, "runs", h.tenant) == 1
    )  # and the refused submission stored nowhere

    # After the flip: the stale host's report, decided on the rows it cached, is refused by
    # the fence where the tenant was, routed again by a fresh directory and committed on the
    # new database, once.
    assert two_shards.for_run(grain.run_id) is first  # this host's directory: before the flip
    attempt = h.succeed(grain, grant)
    assert two_shards.for_run(grain.run_id) is second
    assert attempt.outcome_hash is not None
    # the other host loads the run where its directory says it is no more: routed again
    follow = elsewhere.grain(grain.run_id)
    elsewhere.succeed(follow, elsewhere.lease(follow), n=2)
    assert stale.for_run(grain.run_id) is stale.all()[1]

    run = h.load(grain.run_id)
    assert run.run.state is RunState.COMPLETED
    assert [a.outcome for a in run.attempts.values()].count(attempt.outcome) == 2  # one per attempt
    after = [(r.seq, r.event_id) for r in h.outbox(grain.run_id)]
    assert after[: len(events)] == events
    assert [seq for seq, _ in after] == list(range(1, len(after) + 1))
    assert tenant_rows(first.db, "outbox", h.tenant) == 0
    # the shard serves again: a submission is minted in it and lands on the new database
    command = edge_submission(h, two_shards.db)
    assert two_shards.for_run(command.run_id) is second
    drive(elsewhere.c.store.close())
