"""Flow control (issue 21, docs/flow-control.md): concurrency keys admitted by the dispatching
statement, held steps queued and released in order (priority, then arrival), no slot leaked
or taken twice, the strategies, and the refusals at publication and submission.

Real PostgreSQL, grains driven directly; the run hosts' and the scheduler's parts of the path
(the sweep waking exactly the promoted runs) are tested in tests/api/test_flow_queues.py.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any
from uuid import UUID

import psycopg
import pytest
from grain_harness import Harness
from sqlalchemy import select, text
from support import Faults, cancel, race_async, report, report_command

from runcontrol.commands import RequestApproval, SubmitRun, WakeRun
from runcontrol.config import Settings
from runcontrol.domain import (
    AttemptOutcome,
    Role,
    RunState,
    WorkflowDefinition,
    canonical_hash,
    errors,
)
from runcontrol.store import queries as q
from runcontrol.store.tables import flow_slots, flow_waiters, runs

APPLY = {
    "workflowId": "apply",
    "concurrency": [{"key": "input.repository", "limit": 1}],
    "steps": [{"name": "apply", "agentId": "agent-a"}],
}


def publish(h: Harness, definition: dict[str, Any]) -> None:
    h.c.releases.publish(
        h.tenant, WorkflowDefinition.from_dict(definition), "publisher", h.clock.now(), ["latest"]
    )


def submit(h: Harness, repository: str, priority: int = 3, workflow: str = "apply") -> Any:
    request = h.request(input={"repository": repository}, workflow_id=workflow)
    return submit_request(h, _with_priority(request, priority))


def _with_priority(request: Any, priority: int) -> Any:
    return dataclasses.replace(request, priority=priority)


def submit_request(h: Harness, request: Any) -> Any:
    """Submit as a Requester, or above the default priority as a WorkspaceAdmin (the role
    that may raise it)."""
    roles = (Role.WORKSPACE_ADMIN,) if request.priority > 3 else (Role.REQUESTER,)
    run_id = uuid.uuid4()
    grain = h.grain(run_id)
    grain.execute(
        SubmitRun(
            tenant_id=h.tenant,
            run_id=run_id,
            principal=h.principal("alice", *roles),
            request=request,
        )
    )
    return grain


def slots(h: Harness) -> list[Any]:
    with h.db.tenant(h.tenant) as conn:
        return list(conn.execute(select(flow_slots)))


def waiters(h: Harness) -> list[Any]:
    with h.db.tenant(h.tenant) as conn:
        return list(conn.execute(select(flow_waiters).order_by(flow_waiters.c.seq)))


def assert_no_slot_outlives_its_holder(h: Harness) -> None:
    """The invariant: a slot exists exactly while its holder is open (a run's workflow-wide
    slot while the run is not terminal, an attempt's while the attempt is open)."""
    with h.db.tenant(h.tenant) as conn:
        stale = conn.execute(
            text(
                "SELECT s.holder FROM flow_slots s JOIN runs r ON r.run_id = s.run_id"
                " LEFT JOIN attempts a ON a.attempt_id = s.attempt_id"
                " WHERE r.state IN ('Completed', 'Failed', 'Cancelled')"
                " OR (s.attempt_id IS NOT NULL AND a.state NOT IN"
                " ('Dispatched', 'Leased', 'Parked'))"
            )
        ).all()
        unslotted = conn.execute(
            text(
                "SELECT a.attempt_id FROM attempts a JOIN steps st ON st.step_id = a.step_id"
                " WHERE a.state IN ('Dispatched', 'Leased', 'Parked') AND st.flow IS NOT NULL"
                " AND NOT EXISTS (SELECT 1 FROM flow_slots s"
                " WHERE s.attempt_id = a.attempt_id)"
            )
        ).all()
    assert stale == [] and unslotted == []


def held(h: Harness, grain: Any) -> dict[str, Any] | None:
    return h.load(grain.run_id).steps[0].held


def finish(h: Harness, grain: Any) -> None:
    h.succeed(grain, h.lease(grain))
    assert h.load(grain.run_id).run.state is RunState.COMPLETED


def wake_all(h: Harness, grains: list[Any]) -> list[Any]:
    """The reminders of every held run (the scheduler wakes only the promoted ones; waking
    all shows that a run not promoted never jumps the queue). Answers the dispatched ones."""
    for g in grains:
        h.wake(g)
    return [g for g in grains if h.load(g.run_id).attempts]


def test_one_repository_one_run_another_repository_meanwhile(h: Harness):
    publish(h, APPLY)
    first = submit(h, "repo-x")
    second = submit(h, "repo-x")
    third = submit(h, "repo-y")
    assert h.load(first.run_id).attempts and h.load(third.run_id).attempts
    agg = h.load(second.run_id)
    assert agg.attempts == {} and agg.run.state is RunState.RUNNING
    reason = agg.steps[0].held
    assert reason is not None
    assert (reason["kind"], reason["key"], reason["limit"], reason["holders"]) == (
        "concurrency",
        "repo-x",
        1,
        1,
    )
    assert agg.next_due(h.env.options) == agg.deadline(h.env.options)  # held: not due
    assert wake_all(h, [second]) == []  # the key is busy: the reminder dispatches nothing
    assert_no_slot_outlives_its_holder(h)

    h.clock.advance(5)
    finish(h, first)  # the run's end frees its slot and promotes the waiter, in one commit
    (w,) = waiters(h)
    assert w.run_id == second.run_id and w.promoted
    with h.db.tenant(h.tenant) as conn:
        due = conn.execute(select(runs.c.next_due_at).where(runs.c.run_id == second.run_id))
        assert due.scalar_one() is not None
    assert_no_slot_outlives_its_holder(h)
    assert wake_all(h, [second]) == [second]
    assert held(h, second) is None and waiters(h) == []
    # the intervals: the second's first dispatch comes after the first run ended
    done = h.load(first.run_id)
    (attempt,) = h.load(second.run_id).attempts.values()
    assert attempt.dispatched_at >= done.run.updated_at
    assert_no_slot_outlives_its_holder(h)


def test_held_runs_are_released_by_priority_then_arrival(h: Harness):
    publish(h, APPLY)
    holder = submit(h, "repo-x")
    low = submit(h, "repo-x", priority=2)
    early = submit(h, "repo-x")
    late = submit(h, "repo-x")
    urgent = submit(h, "repo-x", priority=5)  # overtakes the held backlog
    backlog = [low, early, late, urgent]
    order = []
    current = holder
    for _ in backlog:
        h.clock.advance(1)
        finish(h, current)
        (current,) = wake_all(h, [g for g in backlog if g not in order])
        order.append(current)
        assert_no_slot_outlives_its_holder(h)
    assert order == [urgent, early, late, low]


def test_a_higher_priority_run_overtakes_the_tenants_capacity_backlog(make_harness):
    h = make_harness(Settings.model_validate({"capacity": {"max_open_attempts_per_tenant": 1}}))
    h.publish()
    first, _ = h.submit()
    backlog = [h.submit()[0] for _ in range(3)]
    urgent = submit_request(h, _with_priority(h.request(), 4))
    assert held(h, urgent) is not None and held(h, urgent)["kind"] == "capacity"
    finish(h, first)
    assert wake_all(h, [*backlog, urgent]) == [urgent]


def test_a_held_run_cancelled_leaves_the_queue_and_the_next_is_promoted(h: Harness):
    publish(h, APPLY)
    holder = submit(h, "repo-x")
    gone = submit(h, "repo-x")
    next_ = submit(h, "repo-x")
    cancel(gone, "no", requested_by="alice")
    assert h.load(gone.run_id).run.state is RunState.CANCELLED
    assert [w.run_id for w in waiters(h)] == [next_.run_id]
    finish(h, holder)
    assert wake_all(h, [next_]) == [next_]
    assert_no_slot_outlives_its_holder(h)


def test_a_waiter_promoted_then_cancelled_passes_the_slot_on(h: Harness):
    publish(h, APPLY)
    holder = submit(h, "repo-x")
    promoted = submit(h, "repo-x")
    after = submit(h, "repo-x")
    finish(h, holder)
    assert [w.promoted for w in waiters(h)] == [True, False]
    cancel(promoted, "no", requested_by="alice")
    (w,) = waiters(h)
    assert w.run_id == after.run_id and w.promoted
    assert wake_all(h, [after]) == [after]


def test_cancel_newest_cancels_the_run_that_finds_the_key_busy(h: Harness):
    publish(
        h,
        {
            **APPLY,
            "concurrency": [{"key": "input.repository", "limit": 1, "strategy": "cancel-newest"}],
        },
    )
    holder = submit(h, "repo-x")
    newest = submit(h, "repo-x")
    agg = h.load(newest.run_id)
    assert agg.run.state is RunState.CANCELLED and agg.attempts == {}
    (audit,) = h.audits(newest.run_id, "flow.cancel-newest")
    assert audit.detail["key"] == "repo-x"
    assert audit.detail["holder_runs"] == str(holder.run_id)
    assert "repo-x" in agg.intents[0].reason
    assert waiters(h) == []
    assert h.load(holder.run_id).run.state is RunState.RUNNING


def test_a_steps_own_key_holds_a_slot_per_attempt(h: Harness):
    publish(
        h,
        {
            "workflowId": "two",
            "steps": [
                {"name": "plan", "agentId": "agent-a"},
                {
                    "name": "apply",
                    "agentId": "agent-a",
                    "concurrency": [{"key": '"apply:" + input.repository', "limit": 1}],
                },
            ],
        },
    )
    a = submit(h, "repo-x", workflow="two")
    b = submit(h, "repo-x", workflow="two")
    h.succeed(a, h.lease(a))  # a's plan done: its apply takes the slot
    assert [str(x.key) for x in slots(h)] == ["apply:repo-x"]
    h.succeed(b, h.lease(b))  # b's plan done: its apply is held
    b_apply = h.load(b.run_id).steps[1]
    assert b_apply.held is not None and b_apply.held["key"] == "apply:repo-x"
    finish(h, a)  # the attempt's settlement frees the slot (the run ends in the same commit)
    assert wake_all(h, [b]) == [b]
    assert_no_slot_outlives_its_holder(h)


def test_a_bad_expression_is_refused_at_publication_with_its_position():
    for key, position in (("input.", 6), ("input.repo +", 12), ("os.system", 0)):
        with pytest.raises(errors.ValidationFailed) as refused:
            WorkflowDefinition.from_dict({**APPLY, "concurrency": [{"key": key, "limit": 1}]})
        assert refused.value.details["position"] == position


def test_definitions_without_limits_keep_their_content_hash():
    plain = {"workflowId": "w", "steps": [{"name": "s", "agentId": "a"}]}
    assert WorkflowDefinition.from_dict(plain).to_dict() == {
        "workflowId": "w",
        "steps": [
            {
                "name": "s",
                "agentId": "a",
                "skillId": None,
                "maxAttempts": None,
                "gate": "none",
                "sideEffectClass": "read",
            }
        ],
    }


def test_an_input_without_the_keys_field_is_refused_and_nothing_is_stored(h: Harness):
    publish(h, APPLY)
    run_id = uuid.uuid4()
    grain = h.grain(run_id)
    with pytest.raises(errors.ValidationFailed, match="input.repository"):
        grain.execute(
            SubmitRun(
                tenant_id=h.tenant,
                run_id=run_id,
                principal=h.principal(),
                request=h.request(input={"other": 1}, workflow_id="apply"),
            )
        )
    with h.db.tenant(h.tenant) as conn:
        assert conn.execute(select(runs.c.run_id).where(runs.c.run_id == run_id)).all() == []


def test_runs_racing_for_a_key_from_several_hosts_never_exceed_its_limit(make_harness):
    """Many runs on one key (limit 2) submitted at once through three processes' stores, then
    finished and woken in waves; after every wave the database holds at most two slots and
    at most two open attempts of the key, and every run completes in the end."""
    limit = 2
    h = make_harness()
    hosts = [h, make_harness(h.c.settings, h.tenant), make_harness(h.c.settings, h.tenant)]
    publish(h, {**APPLY, "concurrency": [{"key": "input.repository", "limit": limit}]})

    def check() -> None:
        with h.db.tenant(h.tenant) as conn:
            taken = conn.execute(text("SELECT count(*) FROM flow_slots")).scalar_one()
            promoted = conn.execute(
                text("SELECT count(*) FROM flow_waiters WHERE promoted")
            ).scalar_one()
            running = conn.execute(
                text(
                    "SELECT count(*) FROM runs WHERE state = 'Running' AND EXISTS (SELECT 1"
                    " FROM attempts a WHERE a.run_id = runs.run_id)"
                    " AND state NOT IN ('Completed', 'Failed', 'Cancelled')"
                )
            ).scalar_one()
        assert taken + promoted <= limit and running <= limit
        assert_no_slot_outlives_its_holder(h)

    submissions = []
    ids: list[UUID] = []
    for i in range(12):
        host = hosts[i % len(hosts)]
        run_id = uuid.uuid4()
        ids.append(run_id)
        request = host.request(input={"repository": "repo-x"}, workflow_id="apply")
        submissions.append(
            host.grain(run_id).grain.execute(
                SubmitRun(
                    tenant_id=h.tenant, run_id=run_id, principal=h.principal(), request=request
                )
            )
        )
    assert all(kind == "ok" for kind, _ in race_async(*submissions))
    check()
    done: set[UUID] = set()
    for _ in range(len(ids)):
        open_ = [r for r in ids if r not in done and h.load(r).attempts]
        if not open_:
            break
        for r in open_:
            g = h.grain(r)
            h.succeed(g, h.lease(g))
            done.add(r)
        check()
        wakes = [
            hosts[i % len(hosts)].grain(r).grain.execute(WakeRun(tenant_id=h.tenant, run_id=r))
            for i, r in enumerate(ids)
            if r not in done
        ]
        assert all(kind == "ok" for kind, _ in race_async(*wakes))
        check()
    assert done == set(ids)
    assert slots(h) == [] and waiters(h) == []


def test_cancel_oldest_queues_the_newcomer_and_cancels_the_holder(h: Harness):
    """The newcomer waits; after its commit the holder gets a CancelRun from the system
    principal (here the test plays the host, which sends it through its router: tests/api/
    test_flow_queues.py); once the holder settles, the newcomer is promoted."""
    asked: list[tuple[str, UUID, str, UUID]] = []
    h.env.cancel_runs = lambda *call: asked.append(call)
    publish(
        h,
        {
            **APPLY,
            "concurrency": [{"key": "input.repository", "limit": 1, "strategy": "cancel-oldest"}],
        },
    )
    holder = submit(h, "repo-x")
    grant = h.lease(holder)
    newest = submit(h, "repo-x")
    assert held(h, newest) is not None
    ((tenant, run_id, reason, wanted_by),) = asked
    assert (tenant, run_id, wanted_by) == (h.tenant, holder.run_id, newest.run_id)
    (audit,) = h.audits(newest.run_id, "flow.cancel-oldest")
    assert audit.detail["holder_runs"] == str(holder.run_id)
    h.wake(newest)  # held again on the same key: the holder is not asked twice
    assert len(asked) == 1

    cancel(holder, reason, requested_by="run-control")
    assert h.load(holder.run_id).run.state is RunState.CANCELLING
    report(holder, grant, AttemptOutcome.CANCELLED)
    assert h.load(holder.run_id).run.state is RunState.CANCELLED
    assert wake_all(h, [newest]) == [newest]
    assert_no_slot_outlives_its_holder(h)


def test_the_unary_claim_path_offers_the_higher_priority_run_first(h: Harness):
    h.publish()
    older = h.submit()[0]
    h.clock.advance(1)
    urgent = submit_request(h, _with_priority(h.request(), 5))
    with h.db.system_tx() as conn:
        found = [
            run_id
            for tenant, run_id, _ in q.claimable(conn, ["agent-a"], 100)
            if tenant == h.tenant
        ]
    assert found == [urgent.run_id, older.run_id]


def test_a_parked_attempt_frees_its_slot_of_the_cap_not_its_key(make_harness):
    """Parked for an approval, an attempt holds no slot of the tenant's cap (the cap counts
    Dispatched and Leased attempts, docs/approvals.md) but keeps its concurrency key."""
    h = make_harness(Settings.model_validate({"capacity": {"max_open_attempts_per_tenant": 1}}))
    publish(
        h,
        {
            **APPLY,
            "steps": [{"name": "apply", "agentId": "agent-a", "sideEffectClass": "shared-write"}],
        },
    )
    parked = submit(h, "repo-x")
    grant = h.lease(parked)
    same_key = submit(h, "repo-x")
    parked.execute(
        RequestApproval(
            tenant_id=h.tenant,
            run_id=parked.run_id,
            attempt_id=grant.attempt_id,
            holder=grant.holder,
            fencing_token=grant.fencing_token,
            proposal_hash=canonical_hash({"proposal": 1}),
        )
    )
    assert h.load(parked.run_id).run.state is RunState.WAITING_FOR_APPROVAL
    assert {(str(s.kind), str(s.key)) for s in slots(h)} == {("concurrency", "repo-x")}
    other = submit(h, "repo-y")  # the cap's slot is free: another repository dispatches
    assert h.load(other.run_id).attempts
    assert wake_all(h, [same_key]) == []  # repo-x stays held by the parked attempt
    assert_no_slot_outlives_its_holder(h)


def test_raising_the_priority_needs_a_role_that_operates_runs(h: Harness):
    publish(h, APPLY)
    run_id = uuid.uuid4()
    with pytest.raises(errors.Forbidden):
        h.grain(run_id).execute(
            SubmitRun(
                tenant_id=h.tenant,
                run_id=run_id,
                principal=h.principal(),  # a Requester
                request=_with_priority(
                    h.request(input={"repository": "r"}, workflow_id="apply"), 4
                ),
            )
        )
    assert h.load(submit(h, "r", priority=1).run_id).run.priority == 1


@pytest.mark.parametrize("checkpoint", ("after-run", "after-events"))
def test_a_slot_is_freed_in_the_transaction_that_ends_its_holder(
    h: Harness, checkpoint: str, faults: Faults
):
    """The invariant, with the terminal transition's statement failing at a checkpoint: the
    slot, the waiter's promotion and the holder's state roll back together; when it commits
    they move together (there is no other release of a slot)."""
    publish(h, APPLY)
    holder = submit(h, "repo-x")
    grant = h.lease(holder)
    waiting = submit(h, "repo-x")
    faults.arm(holder.run_id, checkpoint)
    faulty = h.grain(holder.run_id)  # a fresh activation
    outcome = report_command(holder, grant, AttemptOutcome.SUCCEEDED)
    with pytest.raises(psycopg.DatabaseError, match=faults.message(checkpoint)):
        faulty.execute(outcome)
    assert h.load(holder.run_id).run.state is RunState.RUNNING
    assert [s.run_id for s in slots(h)] == [holder.run_id]
    assert [(w.run_id, w.promoted) for w in waiters(h)] == [(waiting.run_id, False)]
    assert_no_slot_outlives_its_holder(h)
    faults.disarm(holder.run_id)
    h.grain(holder.run_id).execute(outcome)
    assert h.load(holder.run_id).run.state is RunState.COMPLETED
    assert slots(h) == []
    assert [(w.run_id, w.promoted) for w in waiters(h)] == [(waiting.run_id, True)]
    assert_no_slot_outlives_its_holder(h)
