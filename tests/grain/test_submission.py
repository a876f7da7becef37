"""SubmitRun through RunGrain: idempotency (invariant 1), pinning (invariant 2) and the budget
reservation whose denial fails the run policy-denied."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from grain_harness import PROJECT, SHARED, Harness
from sqlalchemy import func, select
from support import (
    Faults,
    acquire,
    cancel,
    decide,
    race_async,
    report,
    request_approval,
)

from runcontrol.commands import (
    SubmitRun,
    WakeRun,
)
from runcontrol.config import Settings
from runcontrol.domain import (
    AttemptOutcome,
    Decision,
    FailureClass,
    Limits,
    PolicyDocument,
    Principal,
    RunState,
    StepSpec,
    errors,
)
from runcontrol.store.tables import budget_reservations, runs

# ------------------------------------------------------------------ invariant 1


def test_same_key_and_same_canonical_input_answer_with_the_same_run(h: Harness):
    h.publish()
    grain, first = h.submit(h.request("k-1", {"repo": "x", "depth": 2, "opts": {"a": 1, "b": 2}}))
    assert first.created

    # Another activation, keys in another order, 2.0 for 2: the same canonical input.
    _, again = h.submit(h.request("k-1", {"opts": {"b": 2, "a": 1}, "depth": 2.0, "repo": "x"}))
    assert not again.created
    assert (again.run_id, again.release_id, again.policy_revision, again.snapshot_id) == (
        first.run_id,
        first.release_id,
        first.policy_revision,
        first.snapshot_id,
    )
    assert h.event_types(first.run_id).count("RunAccepted") == 1


def test_same_key_with_different_input_is_an_idempotency_conflict(h: Harness):
    h.publish()
    _, first = h.submit(h.request("k-1", {"repo": "x"}))
    for changed in (
        h.request("k-1", {"repo": "y"}),
        h.request("k-1", {"repo": "x"}, limits=Limits(max_cost_usd=5)),
        h.request("k-1", {"repo": "x"}, release_alias="stable"),
    ):
        with pytest.raises(errors.IdempotencyConflict) as exc:
            h.submit(changed)
        assert exc.value.details["run_id"] == str(first.run_id)
    with h.db.tenant(h.tenant) as conn:
        count = conn.execute(
            select(func.count()).where(runs.c.idempotency_key == "k-1")
        ).scalar_one()
    assert count == 1


def test_idempotency_is_scoped_to_tenant(h: Harness, make_harness, tenant):
    other = make_harness(tenant_id=f"{tenant}-other")
    for harness in (h, other):
        harness.publish()
    _, mine = h.submit(h.request("k-1"))
    _, theirs = other.submit(other.request("k-1", {"something": "else"}))
    assert theirs.created and theirs.run_id != mine.run_id


def test_twenty_concurrent_identical_submissions_make_one_run(h: Harness):
    h.publish()
    request = h.request("burst", {"repo": "x"})

    def submit():
        run_id = uuid.uuid4()
        return h.grain(run_id).grain.execute(
            SubmitRun(
                tenant_id=h.tenant,
                run_id=run_id,
                principal=h.principal(),
                request=request,
            )
        )

    raced = race_async(*(submit() for _ in range(20)))
    assert all(kind == "ok" for kind, _ in raced), raced
    results = [value for _, value in raced]

    assert len({r.run_id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    run_id = results[0].run_id
    with h.db.tenant(h.tenant) as conn:
        assert (
            conn.execute(select(func.count()).where(runs.c.idempotency_key == "burst")).scalar_one()
            == 1
        )
        assert (
            conn.execute(
                select(func.count()).where(budget_reservations.c.run_id == run_id)
            ).scalar_one()
            == 1
        )
    assert h.event_types(run_id).count("RunAccepted") == 1
    assert len(h.load(run_id).attempts) == 1


# ------------------------------------------------------------------ invariant 2


def test_pins_survive_a_moved_alias_and_a_new_policy_revision(h: Harness):
    policies = h.c.policies
    first_policy = policies.publish(
        h.tenant, PolicyDocument("default", "", frozenset({SHARED})), h.clock.now()
    )
    first_release = h.publish(StepSpec("write", "agent-a", side_effect_class=SHARED))
    grain, pinned = h.submit(h.request("k-1"))
    assert (pinned.release_id, pinned.policy_revision) == (
        first_release.release_id,
        first_policy.revision,
    )
    grant = h.lease(grain)

    # Move `latest` to a new release and publish a policy revision that needs no approvals.
    second_release = h.publish(
        StepSpec("write", "agent-a", side_effect_class=SHARED), StepSpec("more", "agent-b")
    )
    second_policy = policies.publish(
        h.tenant, PolicyDocument("default", "", frozenset()), h.clock.now()
    )
    assert second_release.release_id != first_release.release_id
    assert second_policy.revision != first_policy.revision

    # Future submissions pin the new ones ...
    _, later = h.submit(h.request("k-2"))
    assert (later.release_id, later.policy_revision) == (
        second_release.release_id,
        second_policy.revision,
    )
    # ... the pinned run keeps evaluating its own: revision 1 still requires the approval,
    approval = request_approval(grain, grant)
    assert approval is not None and approval.policy_revision == first_policy.revision
    decide(grain, approval, h.reviewer(), Decision.APPROVE)
    # ... and its release's single step: one success (by the resumed holder) completes it.
    h.succeed(grain, h.lease(grain))
    run = h.load(grain.run_id).run
    assert run.state is RunState.COMPLETED
    assert (run.release_id, run.release.hash) == (
        first_release.release_id,
        first_release.content_hash,
    )
    assert (run.policy_revision, run.snapshot_id, run.model_profile_id) == (
        first_policy.revision,
        pinned.snapshot_id,
        "code-agent",
    )
    accepted = h.outbox(grain.run_id)[0]
    assert accepted.payload["releaseId"] == first_release.release_id
    assert accepted.payload["policyRevision"] == first_policy.revision

    # Re-submitting the first key answers with the first pins, not what `latest` is now.
    _, again = h.submit(h.request("k-1"))
    assert (again.run_id, again.release_id, again.snapshot_id) == (
        pinned.run_id,
        first_release.release_id,
        pinned.snapshot_id,
    )


# ------------------------------------------------------------------ budget (BC-05)


def test_budget_denial_fails_the_run_policy_denied(make_harness):
    h = make_harness(Settings(budget={"tenant_limit_usd": 10}))
    h.publish()
    grain, first = h.submit(h.request(limits=Limits(max_cost_usd=6)))
    assert first.state == "Running"

    _, denied = h.submit(h.request(limits=Limits(max_cost_usd=6)))
    assert denied.state == "Failed"
    agg = h.load(denied.run_id)
    assert agg.run.failure_class is FailureClass.POLICY_DENIED
    assert agg.run.budget_reservation_id is None
    assert agg.attempts == {}
    events = h.outbox(denied.run_id)
    assert [e.event_type for e in events] == ["RunAccepted", "RunStateChanged", "RunFailed"]
    assert events[1].payload["toState"] == "Failed"
    assert events[2].payload["failureClass"] == "policy-denied"

    # A terminal run releases its reservation, so the next run fits again.
    h.succeed(grain, h.lease(grain))
    _, third = h.submit(h.request(limits=Limits(max_cost_usd=6)))
    assert third.state == "Running"
    with h.db.tenant(h.tenant) as conn:
        open_reservations = conn.execute(
            select(budget_reservations.c.run_id).where(budget_reservations.c.released_at.is_(None))
        ).scalars()
        assert list(open_reservations) == [third.run_id]


def reservation_released_at(h: Harness, run_id: uuid.UUID) -> object:
    with h.db.tenant(h.tenant) as conn:
        return conn.execute(
            select(budget_reservations.c.released_at).where(budget_reservations.c.run_id == run_id)
        ).scalar_one()


@pytest.mark.parametrize("checkpoint", ("after-run", "after-events"))
def test_the_terminal_transition_itself_releases_the_reservation(
    h: Harness, checkpoint: str, faults: Faults
):
    """The statement that makes the run terminal also releases its reservation (migration
    0004): there is no other release. If that statement fails, the run stays Running and the
    reservation stays held; when it commits, the reservation is released at the run's end."""
    grain, grant = h.start_run()

    faults.arm(grain.run_id, checkpoint)
    faulty = h.grain(grain.run_id)  # a fresh activation
    with pytest.raises(psycopg.DatabaseError, match=faults.message(checkpoint)):
        report(faulty, grant, AttemptOutcome.SUCCEEDED)
    assert h.load(grain.run_id).run.state is RunState.RUNNING
    assert reservation_released_at(h, grain.run_id) is None

    faults.disarm(grain.run_id)
    h.succeed(grain, grant)
    done = h.load(grain.run_id).run
    assert done.state is RunState.COMPLETED
    assert reservation_released_at(h, grain.run_id) == done.updated_at


def test_a_submission_retried_after_it_committed_keeps_the_runs_reservation(h: Harness):
    """The router repeats a whole batch after ``ActorUnavailableError`` (unknown whether it
    ran), with the same run id: the repeat must answer the run and leave its budget reserved,
    not release it as if another submission had won the key."""
    h.publish()
    request = h.request("retried", {"repo": "x"})
    run_id = uuid.uuid4()
    first = h.grain(run_id).execute(
        SubmitRun(
            tenant_id=h.tenant,
            run_id=run_id,
            principal=h.principal(),
            request=request,
        )
    )
    again = h.grain(run_id).execute(
        SubmitRun(
            tenant_id=h.tenant,
            run_id=run_id,
            principal=h.principal(),
            request=request,
        )
    )  # a fresh activation, as after a retry
    assert (first.created, again.created) == (True, False)
    assert again.run_id == first.run_id == run_id
    with h.db.tenant(h.tenant) as conn:
        open_reservations = conn.execute(
            select(budget_reservations.c.run_id).where(budget_reservations.c.released_at.is_(None))
        ).scalars()
        assert list(open_reservations) == [run_id]


def test_principal_of_another_tenant_cannot_submit_through_this_grain(h: Harness):
    h.publish()
    intruder = Principal("mallory", "another-tenant", PROJECT)
    with pytest.raises(errors.Forbidden):
        run_id = uuid.uuid4()
        h.grain(run_id).execute(
            SubmitRun(
                tenant_id=h.tenant,
                run_id=run_id,
                principal=intruder,
                request=h.request(),
            )
        )


# ------------------------------------------------------------------ invariant 9, grain side


def test_another_tenants_grain_cannot_see_or_command_the_run(h: Harness, make_harness, tenant):
    grain, grant = h.start_run()
    other = make_harness(tenant_id=f"{tenant}-other")
    foreign = other.grain(grain.run_id)
    commands = (
        lambda: cancel(foreign, "mine now", requested_by="mallory"),
        lambda: foreign.execute(WakeRun(tenant_id=foreign.tenant_id, run_id=foreign.run_id)),
        lambda: acquire(foreign, grant.attempt_id, "mallory"),
        lambda: report(foreign, grant, AttemptOutcome.SUCCEEDED),
    )
    for command in commands:
        with pytest.raises(errors.RunNotFound):
            command()
    agg = h.load(grain.run_id)
    assert agg.run.state is RunState.RUNNING and agg.intents == []
    assert h.audits(grain.run_id) == []


def test_a_used_key_with_an_unknown_workflow_is_a_conflict_not_a_404(h: Harness):
    h.publish()
    h.submit(h.request(key="k-reused"))
    with pytest.raises(errors.IdempotencyConflict):
        h.submit(h.request(key="k-reused", workflow_id="no-such-workflow"))
    with pytest.raises(errors.WorkflowNotFound):
        h.submit(h.request(key="k-fresh", workflow_id="no-such-workflow"))


@pytest.mark.parametrize("checkpoint", ("after-run", "after-events"))
def test_the_reservation_commits_with_the_submission_or_not_at_all(
    h: Harness, checkpoint: str, faults: Faults
):
    """The budget reservation is made by the statement that accepts the run (migration 0007):
    a submission that fails leaves no reservation behind, and its retry leaves exactly one,
    the one the run names."""
    h.publish()
    run_id = uuid.uuid4()
    submit = SubmitRun(
        tenant_id=h.tenant, run_id=run_id, principal=h.principal(), request=h.request("atomic")
    )
    faults.arm(run_id, checkpoint)
    with pytest.raises(psycopg.DatabaseError, match=faults.message(checkpoint)):
        h.grain(run_id).execute(submit)
    with h.db.tenant(h.tenant) as conn:
        held = conn.execute(select(budget_reservations.c.reservation_id)).scalars().all()
    assert held == []

    faults.disarm(run_id)
    assert h.grain(run_id).execute(submit).created
    with h.db.tenant(h.tenant) as conn:
        held = conn.execute(select(budget_reservations.c.reservation_id)).scalars().all()
    assert held == [h.load(run_id).run.budget_reservation_id]
