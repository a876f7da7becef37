"""Operator controls on the grain (issue 14): where the rules are subtle. A suspended run starts
nothing new while a lease in hand still reports; resume dispatches what is due; a retry is a
new attempt whose lease has a higher fencing token; resolving an Uncertain attempt settles its
step as the normal path would, or only corrects the record of a finished run; a rerun is a new
run linked to the finished one. Every control commits its journal entry, outbox event and an
audit record with the caller and the reason."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from grain_harness import OPERATOR, PROJECT, CeilingRandom, Harness, control, operator, outcome_hash
from support import acquire, cancel, report

from runcontrol.commands import (
    ControlResult,
    RerunRelease,
    RerunRun,
    ResolveAttempt,
    ResumeRun,
    RetryStep,
    SuspendRun,
)
from runcontrol.domain import (
    AttemptOutcome,
    AttemptState,
    FailureClass,
    RunState,
    SideEffectClass,
    StepSpec,
    StepState,
    errors,
)
from runcontrol.store import queries as q

TWO_STEPS = (StepSpec("first", "agent-a"), StepSpec("second", "agent-a"))


def audited(h: Harness, run_id: uuid.UUID, kind: str) -> Any:
    (row,) = h.audits(run_id, kind)
    return row


def claimable(h: Harness, run_id: uuid.UUID) -> bool:
    with h.db.tenant(h.tenant) as conn:
        return any(r == run_id for _, r, _ in q.claimable(conn, ["agent-a"], limit=100))


# ---------------------------------------------------------------------- suspend / resume


def test_a_suspended_run_dispatches_nothing_while_a_lease_in_hand_reports(h: Harness):
    grain, grant = h.start_run(*TWO_STEPS)

    answer = control(h, grain, SuspendRun, reason="incident 42")

    assert answer == ControlResult(grain.run_id, "Running", True)
    # The lease in hand finishes: its outcome is accepted...
    assert report(grain, grant, AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash()).state is (
        AttemptState.SUCCEEDED
    )
    # ...but the next step is not dispatched, not even by the reminder, which is not due for it.
    agg = h.load(grain.run_id)
    assert agg.open_attempts() == []
    assert [s.state for s in agg.steps] == [StepState.SUCCEEDED, StepState.PENDING]
    due = agg.next_due(h.env.options)
    assert due is not None and due > h.clock.now()
    h.clock.advance(60)
    assert not h.wake(grain).dispatched
    assert h.open_attempts(grain.run_id) == []

    resumed = control(h, grain, ResumeRun, reason="incident over")

    assert (resumed.state, resumed.suspended) == ("Running", False)
    (attempt,) = h.open_attempts(grain.run_id)  # dispatched by the resume itself
    assert h.load(grain.run_id).step(attempt.step_id).name == "second"
    types = h.event_types(grain.run_id)
    assert types.index("RunSuspended") < types.index("RunResumed") < len(types) - 1
    assert types[types.index("RunResumed") + 1] == "AttemptDispatched"
    suspended = audited(h, grain.run_id, "run-suspended")
    assert (suspended.actor, suspended.detail["reason"]) == (OPERATOR, "incident 42")
    assert audited(h, grain.run_id, "run-resumed").detail["reason"] == "incident over"
    causes = [j.cause for j in h.journal(grain.run_id)]
    assert "SuspendRequested" in causes and "ResumeRequested" in causes


def test_a_dispatched_attempt_is_neither_claimed_nor_leased_while_suspended(h: Harness):
    h.publish(*TWO_STEPS)
    grain, _ = h.submit()
    attempt = h.open_attempt(grain.run_id)
    assert claimable(h, grain.run_id)

    control(h, grain, SuspendRun)

    assert not claimable(h, grain.run_id)
    with pytest.raises(errors.LeaseRejected):
        acquire(grain, attempt.attempt_id)
    control(h, grain, ResumeRun)
    assert claimable(h, grain.run_id)
    assert h.lease(grain).attempt_id == attempt.attempt_id


def test_suspend_and_resume_refuse_the_wrong_state_and_an_empty_reason(h: Harness):
    grain, grant = h.start_run(StepSpec("only", "agent-a"))
    with pytest.raises(errors.ValidationFailed):
        control(h, grain, SuspendRun, reason="  ")
    with pytest.raises(errors.RunNotSuspended):
        control(h, grain, ResumeRun)
    control(h, grain, SuspendRun)
    with pytest.raises(errors.RunSuspended):
        control(h, grain, SuspendRun)
    report(grain, grant, AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash())
    agg = h.load(grain.run_id)
    assert agg.run.state is RunState.COMPLETED and agg.run.suspended_at is None
    with pytest.raises(errors.RunTerminal):
        control(h, grain, ResumeRun)
    assert h.audits(grain.run_id, "run-resumed") == []


# ---------------------------------------------------------------------- retry


def test_retry_dispatches_a_new_attempt_now_whose_lease_has_a_higher_token(h: Harness):
    h.env.rng = CeilingRandom()
    grain, first = h.start_run(StepSpec("only", "agent-a", max_attempts=3))
    report(grain, first, AttemptOutcome.FAILED, failure_class=FailureClass.TRANSIENT)
    agg = h.load(grain.run_id)
    assert agg.open_attempts() == [] and agg.steps[0].not_before > h.clock.now()
    step_id = agg.steps[0].step_id

    answer = control(h, grain, RetryStep, reason="the outage is fixed", step_id=step_id)

    assert (answer.attempt_number, answer.attempt_state) == (2, "Dispatched")
    second = h.lease(grain)  # no clock advance: the backoff was skipped
    assert second.attempt_id == answer.attempt_id != first.attempt_id
    assert second.fencing_token > first.fencing_token
    retry = audited(h, grain.run_id, "step-retry")
    assert (retry.actor, retry.detail["reason"]) == (OPERATOR, "the outage is fixed")
    (event,) = [e for e in h.outbox(grain.run_id) if e.event_type == "StepRetryRequested"]
    assert event.payload["nextAttemptNumber"] == 2
    assert event.payload["requestedBy"] == OPERATOR


def test_a_retry_while_suspended_is_dispatched_by_the_resume(h: Harness):
    h.env.rng = CeilingRandom()
    grain, first = h.start_run(StepSpec("only", "agent-a", max_attempts=3))
    control(h, grain, SuspendRun)
    report(grain, first, AttemptOutcome.FAILED, failure_class=FailureClass.TRANSIENT)
    step_id = h.load(grain.run_id).steps[0].step_id

    answer = control(h, grain, RetryStep, step_id=step_id)

    assert (answer.suspended, answer.attempt_id) == (True, None)
    assert h.open_attempts(grain.run_id) == []
    control(h, grain, ResumeRun)  # the backoff was skipped: due at once
    assert h.lease(grain).fencing_token > first.fencing_token


def test_retry_refuses_a_finished_run_and_a_busy_step(h: Harness):
    grain, first = h.start_run(
        StepSpec("only", "agent-a", max_attempts=3, side_effect_class=SideEffectClass.SHARED_WRITE)
    )
    step_id = h.load(grain.run_id).steps[0].step_id
    with pytest.raises(errors.IllegalTransition):  # its attempt is still leased
        control(h, grain, RetryStep, step_id=step_id)
    with pytest.raises(errors.StepNotFound):
        control(h, grain, RetryStep, step_id=uuid.uuid4())
    report(grain, first, AttemptOutcome.UNCERTAIN)  # shared-write: the run fails (inv. 6)
    assert h.load(grain.run_id).run.state is RunState.FAILED
    with pytest.raises(errors.RunTerminal, match="rerun"):
        control(h, grain, RetryStep, step_id=step_id)


# ---------------------------------------------------------------------- resolve


def resolve(h: Harness, grain, grant, outcome: AttemptOutcome, reason: str = "checking"):
    """An operator resolves the attempt ``grant`` leased as ``outcome``."""
    return control(
        h, grain, ResolveAttempt, reason=reason, attempt_id=grant.attempt_id, outcome=outcome
    )


def test_resolving_an_awaited_uncertain_attempt_as_succeeded_completes_the_run(h: Harness):
    h.env.rng = CeilingRandom()
    grain, grant = h.start_run(StepSpec("only", "agent-a", max_attempts=3))
    report(grain, grant, AttemptOutcome.UNCERTAIN)  # read-only: a retry is scheduled
    assert h.load(grain.run_id).steps[0].state is StepState.PENDING

    answer = resolve(h, grain, grant, AttemptOutcome.SUCCEEDED, "the report reached the tracker")

    assert (answer.state, answer.attempt_state) == ("Completed", "Succeeded")
    agg = h.load(grain.run_id)
    assert agg.steps[0].state is StepState.SUCCEEDED and len(agg.attempts) == 1
    types = h.event_types(grain.run_id)
    assert types[-3:] == ["AttemptOutcomeResolved", "RunStateChanged", "RunCompleted"]
    resolved = audited(h, grain.run_id, "attempt-resolved")
    assert resolved.detail["outcome"] == "Succeeded" and resolved.actor == OPERATOR
    with pytest.raises(errors.IllegalTransition):  # no longer Uncertain
        resolve(h, grain, grant, AttemptOutcome.FAILED)


def test_resolving_an_attempt_of_a_failed_run_corrects_the_record_only(h: Harness):
    grain, grant = h.start_run(
        StepSpec("only", "agent-a", side_effect_class=SideEffectClass.SHARED_WRITE)
    )
    report(grain, grant, AttemptOutcome.UNCERTAIN)

    answer = resolve(h, grain, grant, AttemptOutcome.FAILED, "no row was written")

    assert (answer.state, answer.attempt_state) == ("Failed", "Failed")
    agg = h.load(grain.run_id)
    assert agg.run.state is RunState.FAILED and agg.run.failure_class is FailureClass.UNCERTAIN
    assert agg.attempts[grant.attempt_id].outcome is AttemptOutcome.FAILED
    (entry,) = [j for j in h.journal(grain.run_id) if j.cause == "OperatorResolved"]
    assert (entry.from_state, entry.to_state, entry.actor) == ("Uncertain", "Failed", OPERATOR)
    with pytest.raises(errors.ValidationFailed):
        resolve(h, grain, grant, AttemptOutcome.CANCELLED)


# ---------------------------------------------------------------------- rerun


def rerun(h: Harness, old: uuid.UUID, command_id: str, **kw: Any) -> Any:
    grain = h.grain(uuid.uuid4())
    return grain.execute(
        RerunRun(
            tenant_id=h.tenant,
            run_id=grain.run_id,
            command_id=command_id,
            principal=operator(h),
            reason="try again",
            rerun_of=old,
            **kw,
        )
    )


def test_a_rerun_is_a_new_run_with_the_same_input_linked_to_the_finished_one(h: Harness):
    first_release = h.publish()
    grain, _ = h.submit(h.request(input={"repo": "y", "n": 1}))
    with pytest.raises(errors.RunNotFinished):
        rerun(h, grain.run_id, "early")
    cancel(grain, "stop", requested_by="alice")
    second_release = h.publish(StepSpec("changed", "agent-a"))

    pinned = rerun(h, grain.run_id, "cmd-1")
    again = rerun(h, grain.run_id, "cmd-1")  # the same command resent: the same run
    current = rerun(h, grain.run_id, "cmd-2", release=RerunRelease.CURRENT)

    assert pinned.created and not again.created and again.run_id == pinned.run_id
    assert pinned.release_id == first_release.release_id
    assert current.release_id == second_release.release_id != first_release.release_id
    old = h.load(grain.run_id).run
    for result in (pinned, current):
        new = h.load(result.run_id).run
        assert new.run_id != old.run_id and new.rerun_of == old.run_id
        assert (new.input, new.project_id, new.requested_by) == (old.input, PROJECT, OPERATOR)
        audit = audited(h, new.run_id, "run-rerun")
        assert audit.detail["rerun_of"] == str(old.run_id) and audit.detail["reason"] == "try again"
        assert "RunRerun" in h.event_types(new.run_id)
    assert h.audits(grain.run_id, "run-rerun") == []  # the finished run is never written
