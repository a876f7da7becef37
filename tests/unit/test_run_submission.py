"""RunAggregate rules, driven purely in memory with a fixed clock and deterministic ids.

Submission: a run accepted (release, policy and snapshot pinned, steps Pending) and its
steps dispatched.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from domain_harness import (
    INPUT,
    READ_STEP,
    REQUESTER,
    RUN_ID,
    SNAPSHOT_ID,
    T0,
    TENANT,
    WRITE_STEP,
    Harness,
    assert_refused_cleanly,
    make_release,
    make_submission,
    proposal,
)

from runcontrol.domain import (
    AttemptOutcome,
    AttemptState,
    FailureClass,
    Limits,
    RunState,
    StepState,
    canonical_hash,
    errors,
)
from runcontrol.domain.events import TOPICS
from runcontrol.domain.run.submission import (
    accept_run,
    assert_same_submission,
    deny_budget,
    dispatch,
    dispatchable_step,
)

# ============================================================================ SubmitRun


class TestAccept:
    def test_pins_release_policy_snapshot_and_creates_pending_steps(self):
        h = Harness([READ_STEP, {**WRITE_STEP, "maxAttempts": 5}])
        run = h.run
        assert run.state is RunState.ACCEPTED
        assert run.run_id == RUN_ID and run.snapshot_id == SNAPSHOT_ID
        assert run.release_id == "rel-0001"
        assert run.release.hash == h.release.content_hash
        assert run.policy.policy_id == "pol-1" and run.policy_revision == "7"
        assert run.input_hash == canonical_hash(INPUT)
        assert run.requested_by == REQUESTER
        assert [s.state for s in h.agg.steps] == [StepState.PENDING, StepState.PENDING]
        assert [s.ordinal for s in h.agg.steps] == [1, 2]
        assert [s.max_attempts for s in h.agg.steps] == [3, 5]  # default, then release override

    def test_first_batch_is_an_insert_with_run_accepted(self):
        h = Harness()
        first = h.batches[0]
        assert first.expected_version is None  # a new row, not an UPDATE
        assert first.run_dirty
        assert set(first.steps) == {s.step_id for s in h.agg.steps}
        assert [e.event_type for e in first.events] == ["RunAccepted"]
        accepted = first.events[0]
        assert accepted.seq == 1
        assert accepted.topic == TOPICS["RunAccepted"]
        assert accepted.payload == {
            "runId": str(RUN_ID),
            "tenantId": TENANT,
            "projectId": "project-a",
            "workflowId": "wf-assess",
            "releaseId": "rel-0001",
            "policyRevision": "7",
            "modelProfileId": "code-agent",
            "requestedBy": REQUESTER,
            "parentRunId": None,  # a client's run (issue 32: a child's names its parent)
            "parentStepId": None,
        }
        assert [(j.sequence, j.from_state, j.to_state) for j in first.journal] == [
            (1, None, RunState.ACCEPTED)
        ]
        assert h.run.version == 1

    def test_the_wall_clock_budget_starts_at_the_first_lease_grant(self):
        h = Harness(limits=Limits(max_cost_usd=12, max_minutes=45))
        assert h.run.deadline_at is None  # accepted, nothing has run yet
        h.advance(90)
        attempt, grant = h.start()
        assert h.run.deadline_at == T0 + timedelta(seconds=90, minutes=45)
        h.advance(10)
        h.report(grant, AttemptOutcome.FAILED, failure_class=FailureClass.TRANSIENT)
        h.advance(60)
        h.lease(h.dispatch())  # a retry's lease does not move it
        assert h.run.deadline_at == T0 + timedelta(seconds=90, minutes=45)

    def test_rejects_a_non_canonical_input_hash(self):
        h = Harness()
        with pytest.raises(errors.ValidationFailed, match="inputHash"):
            accept_run(make_submission(input_hash="abc"), h.release, h.policy, h.options, h.ctx())

    def test_rejects_a_release_of_another_workflow(self):
        h = Harness()
        other = make_release([READ_STEP], workflow_id="other-workflow")
        with pytest.raises(errors.ValidationFailed, match="release"):
            accept_run(make_submission(), other, h.policy, h.options, h.ctx())

    def test_idempotency_same_input_is_the_same_run_different_input_conflicts(self):
        h = Harness()
        assert_same_submission(h.agg, canonical_hash(dict(reversed(list(INPUT.items())))))
        with pytest.raises(errors.IdempotencyConflict) as info:
            assert_same_submission(h.agg, canonical_hash({**INPUT, "revision": "ffff"}))
        assert info.value.details == {"run_id": str(RUN_ID)}
        assert h.agg.take_changes().empty

    def test_pinned_fields_never_change_through_a_whole_run(self):
        h = Harness([READ_STEP, WRITE_STEP])
        pinned = (h.run.release, h.run.policy, h.run.snapshot_id, h.run.model_profile_id)
        _, g = h.start(0)
        h.report(g)
        attempt, g = h.start(1)
        approval = h.request_approval(g, proposal(1))
        h.decide(approval)
        h.report(h.lease(attempt, "worker-2"))
        assert h.run.state is RunState.COMPLETED
        assert (h.run.release, h.run.policy, h.run.snapshot_id, h.run.model_profile_id) == pinned

    def test_budget_denial_fails_an_accepted_run_policy_denied(self):
        h = Harness([READ_STEP, READ_STEP | {"name": "two"}])
        deny_budget(h.agg, h.ctx("budget"), "over the tenant limit")
        h.commit()
        assert h.run.state is RunState.FAILED
        assert h.run.failure_class is FailureClass.POLICY_DENIED
        assert all(s.state is StepState.CANCELLED for s in h.agg.steps)
        changed = [e for e in h.events if e.event_type == "RunStateChanged"][-1]
        assert changed.payload["cause"] == "BudgetReservationDenied"
        assert h.events[-1].event_type == "RunFailed"
        assert h.events[-1].payload["failureClass"] == "policy-denied"


# ============================================================================ dispatch


class TestDispatch:
    def test_first_dispatch_moves_the_run_to_running(self):
        h = Harness([READ_STEP, WRITE_STEP])
        assert dispatchable_step(h.agg, h.now) is h.step(0)
        attempt = h.dispatch(0)
        assert attempt.number == 1 and attempt.state is AttemptState.DISPATCHED
        assert attempt.dispatched_at == T0 and attempt.fencing_token is None
        assert h.step(0).state is StepState.RUNNING
        assert h.run.state is RunState.RUNNING
        batch = h.batches[-1]
        assert h.last_event_types() == ["AttemptDispatched", "RunStateChanged"]
        assert batch.events[0].payload["attemptNumber"] == 1
        assert batch.events[1].payload["cause"] == "FirstAttemptDispatched"
        assert [(j.entity, j.from_state, j.to_state) for j in batch.journal] == [
            ("Step", StepState.PENDING, StepState.RUNNING),
            ("Attempt", None, AttemptState.DISPATCHED),
            ("Run", RunState.ACCEPTED, RunState.RUNNING),
        ]
        assert batch.expected_version == 1 and h.run.version == 2

    def test_steps_run_in_order(self):
        h = Harness([READ_STEP, WRITE_STEP])
        _, grant = h.start(0)
        assert dispatchable_step(h.agg, h.now) is None  # step 1 in flight
        h.report(grant)
        assert dispatchable_step(h.agg, h.now) is h.step(1)

    def test_at_most_one_open_attempt_per_step(self):
        h = Harness()
        attempt = h.dispatch(0)
        with pytest.raises(errors.IllegalTransition):
            dispatch(h.agg, h.ctx(), h.step(0))
        assert_refused_cleanly(h)
        h.lease(attempt)
        with pytest.raises(errors.IllegalTransition):
            dispatch(h.agg, h.ctx(), h.step(0))
        assert_refused_cleanly(h)
        assert len(h.agg.attempts_of(h.step(0))) == 1

    def test_open_attempt_guard_holds_even_if_the_step_looks_pending(self):
        # E.g. a step row reloaded inconsistently: the attempt guard is the invariant.
        h = Harness()
        h.dispatch(0)
        h.step(0).state = StepState.PENDING
        with pytest.raises(errors.IllegalTransition, match="one non-terminal attempt") as info:
            dispatch(h.agg, h.ctx(), h.step(0))
        assert info.value.details == {"step_id": str(h.step(0).step_id)}
        assert len(h.agg.attempts) == 1

    def test_no_dispatch_while_waiting_for_approval(self):
        h = Harness([WRITE_STEP, READ_STEP])
        _, grant = h.start(0)
        h.request_approval(grant, proposal(1))
        assert h.run.state is RunState.WAITING_FOR_APPROVAL
        assert dispatchable_step(h.agg, h.now) is None
        for index in (0, 1):
            with pytest.raises(errors.IllegalTransition, match="WaitingForApproval") as info:
                dispatch(h.agg, h.ctx(), h.step(index))
            assert info.value.details == {"run_state": "WaitingForApproval"}
            assert_refused_cleanly(h)

    def test_no_dispatch_while_cancelling(self):
        h = Harness([READ_STEP, READ_STEP | {"name": "two"}])
        _, _grant = h.start(0)
        h.cancel()
        assert h.run.state is RunState.CANCELLING
        assert dispatchable_step(h.agg, h.now) is None
        with pytest.raises(errors.IllegalTransition, match="Cancelling"):
            dispatch(h.agg, h.ctx(), h.step(1))
        assert_refused_cleanly(h)

    @pytest.mark.parametrize("end", ["completed", "cancelled", "failed"])
    def test_no_dispatch_on_a_terminal_run(self, end):
        h = Harness()
        if end == "completed":
            _, g = h.start(0)
            h.report(g)
        elif end == "cancelled":
            h.cancel()
        else:
            deny_budget(h.agg, h.ctx(), "denied")
            h.commit()
        assert h.run.state.terminal
        assert dispatchable_step(h.agg, h.now) is None
        with pytest.raises(errors.IllegalTransition):
            dispatch(h.agg, h.ctx(), h.step(0))
