"""Child runs' rules (issue 32), on the run aggregate alone: a run step starts a child
(its id and key derived from parent, step and number) and holds no worker; the child's end
is its result, or a failure under the step's retry policy (a retry starts a new child); a
report of another or an earlier child changes nothing; the reminder re-drives an open
child; a cancel asks the children to cancel and settles after them; the depth limit."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from domain_harness import INPUT, Harness, make_release, make_submission

from runcontrol.domain import (
    AttemptOutcome,
    FailureClass,
    Options,
    RunState,
    StepState,
    WorkflowDefinition,
    errors,
)
from runcontrol.domain.hashing import canonical_hash
from runcontrol.domain.run.changes import ChildAction
from runcontrol.domain.run.children import child_key, child_run_id
from runcontrol.domain.run.outcomes import report_outcome
from runcontrol.domain.run.submission import accept_run
from runcontrol.domain.workflow import MAX_CHILD_DEPTH

PLAN = {"name": "plan", "agentId": "planner"}
DELEGATE = {
    "name": "delegate",
    "kind": "run",
    "workflowId": "review",
    "releaseAlias": "stable",
    "input": {"repo": "input.repository", "plan": "results.plan", "fixed": "'yes'"},
    "maxAttempts": 2,
    "dependsOn": ["plan"],
}


def started(**options: Any) -> Harness:
    """A run whose plan succeeded with a result; its delegate step is ready."""
    h = Harness([PLAN, DELEGATE], run_input=INPUT, options=Options(**options))
    _, grant = h.start()
    report_outcome(
        h.agg,
        h.ctx(grant.holder),
        grant.attempt_id,
        grant.holder,
        grant.fencing_token,
        AttemptOutcome.SUCCEEDED,
        h.options,
        outcome_hash=None,
        result={"steps": 3},
    )
    h.commit()
    return h


def test_a_run_step_starts_its_child_without_a_worker() -> None:
    h = started()
    changes = h.start_ready()
    step = h.step(1)
    assert step.state is StepState.RUNNING and h.agg.attempts_of(step) == []
    expected = child_run_id(h.run.run_id, step.step_id, 1)
    assert step.child == {"runId": str(expected), "number": 1}
    (call,) = changes.child_calls
    assert call.action is ChildAction.SUBMIT and call.child_run_id == expected
    assert call.workflow_id == "review" and call.release_alias == "stable"
    assert call.input == {"repo": INPUT["repository"], "plan": {"steps": 3}, "fixed": "yes"}
    assert step.due_at == h.now + timedelta(seconds=10)
    assert "ChildRunStarted" in h.last_event_types()
    assert child_run_id(h.run.run_id, step.step_id, 1) == expected  # the same every time
    assert child_key(h.run.run_id, step.step_id, 2) != child_key(h.run.run_id, step.step_id, 1)


def test_the_childs_result_is_the_steps_and_the_runs() -> None:
    h = started()
    h.start_ready()
    assert h.child_ended(1, "Completed", {"verdict": "ok"}) == "Succeeded"
    assert h.run.state is RunState.COMPLETED
    result = h.agg.run_result()
    assert result is not None and result.value == {"verdict": "ok"}
    assert h.run.result_hash == result.outcome_hash
    (ended,) = [e.payload for e in h.events if e.event_type == "ChildRunEnded"]
    # The child's end as a reader of the parent's events sees it: its result's hash, not the
    # result (events stay small).
    assert ended["resultHash"] == canonical_hash({"verdict": "ok"}) == result.outcome_hash
    assert (ended["childState"], ended["failureClass"]) == ("Completed", None)
    assert "verdict" not in str(ended)


def test_a_resent_or_stale_end_changes_nothing() -> None:
    h = started()
    h.start_ready()
    other = UUID(int=999)
    assert h.child_ended(1, "Completed", {"x": 1}, child=other) == "Running"
    assert h.batches[-1].empty
    h.child_ended(1, "Completed", {"x": 1})
    versions = h.run.version
    assert h.child_ended(1, "Completed", {"x": 2}) == "Succeeded"  # a resend: recorded once
    assert h.run.version == versions and h.agg.run_result().value == {"x": 1}  # type: ignore[union-attr]


def test_a_failed_child_is_retried_with_the_next_child_then_fails_the_run() -> None:
    h = started()
    h.start_ready()
    first = h.step(1).child
    assert h.child_ended(1, "Failed", failure_class="transient") == "Pending"
    h.advance(3600)
    changes = h.start_ready()
    second = h.step(1).child
    assert second["number"] == 2 and second["runId"] != first["runId"]  # type: ignore[index]
    assert [c.number for c in changes.child_calls] == [2]
    assert h.child_ended(1, "Failed", failure_class="transient") == "Failed"
    assert h.run.state is RunState.FAILED
    assert "ended Failed" in (h.run.failure_reason or "")


@pytest.mark.parametrize(("state", "failure"), [("Failed", "permanent"), ("Cancelled", None)])
def test_a_child_failing_for_good_or_cancelled_is_not_retried(
    state: str, failure: str | None
) -> None:
    h = started()
    h.start_ready()
    assert h.child_ended(1, state, failure_class=failure) == "Failed"
    expected = FailureClass.CANCELLATION if state == "Cancelled" else FailureClass.PERMANENT
    assert h.run.state is RunState.FAILED and h.run.failure_class is expected
    (ended,) = [e.payload for e in h.events if e.event_type == "ChildRunEnded"]
    assert (ended["childState"], ended["failureClass"]) == (state, str(expected))
    assert ended["resultHash"] is None


@pytest.mark.parametrize(
    ("state", "failure"), [("Running", None), ("Done", None), ("Failed", "made-up")]
)
def test_a_malformed_end_is_refused(state: str, failure: str | None) -> None:
    h = started()
    h.start_ready()
    with pytest.raises(errors.ValidationFailed):
        h.child_ended(1, state, failure_class=failure)


def test_the_reminder_checks_an_open_child_when_due() -> None:
    h = started(child_check_seconds=5)
    h.start_ready()
    assert h.agg.next_due(h.options) == h.step(1).due_at
    assert h.redrive().child_calls == []  # not due yet
    h.advance(5)
    (call,) = h.redrive().child_calls
    assert call.action is ChildAction.CHECK and call.number == 1
    assert h.step(1).due_at == h.now + timedelta(seconds=5)


def test_a_cancel_asks_the_children_and_settles_after_them() -> None:
    h = started()
    h.start_ready()
    h.cancel()
    assert h.run.state is RunState.CANCELLING  # intent: the child settles in its own grain
    (call,) = h.batches[-1].child_calls
    assert call.action is ChildAction.CANCEL and "cancelling" in (call.reason or "")
    h.advance(3600)  # past the stop timeout: the open child still holds the run
    assert h.remind() == "stop-timeout" and h.run.state is RunState.CANCELLING
    assert h.agg.next_due(h.options) == h.step(1).due_at  # only its checks
    h.advance(10)
    assert h.redrive().child_calls[0].action is ChildAction.CANCEL
    assert h.child_ended(1, "Cancelled") == "Cancelled"
    assert h.run.state is RunState.CANCELLED


def test_a_sibling_failing_while_a_child_runs_waits_for_the_child() -> None:
    h = Harness(
        [
            {"name": "other", "agentId": "x", "dependsOn": []},
            {"name": "delegate", "kind": "run", "workflowId": "w", "dependsOn": []},
        ]
    )
    h.start_ready()
    (attempt,) = h.agg.open_attempts()
    grant = h.lease(attempt)
    h.report(grant, AttemptOutcome.FAILED, failure_class=FailureClass.PERMANENT)
    assert h.run.state is RunState.CANCELLING
    assert h.child_ended(1, "Completed", {"x": 1}) == "Succeeded"  # effects stay visible
    assert h.run.state is RunState.FAILED


def test_a_child_deeper_than_the_limit_is_refused() -> None:
    h = Harness([{"name": "again", "kind": "run", "workflowId": "wf-assess"}])
    h.agg.run.depth = MAX_CHILD_DEPTH
    h.start_ready()
    assert h.step(0).state is StepState.FAILED and h.run.state is RunState.FAILED
    assert f"deeper than {MAX_CHILD_DEPTH} levels" in (h.run.failure_reason or "")
    assert h.batches[-1].child_calls == []
    release = make_release([{"name": "a", "agentId": "x"}])
    with pytest.raises(errors.ValidationFailed, match="deeper than"):
        accept_run(
            make_submission(depth=MAX_CHILD_DEPTH + 1), release, h.policy, h.options, h.ctx()
        )


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"name": "r", "kind": "run"}, "workflowId is a name"),
        ({"name": "r", "kind": "run", "workflowId": "w", "releaseAlias": ""}, "releaseAlias"),
        ({"name": "r", "kind": "run", "workflowId": "w", "input": {"a": "bad("}}, "position"),
        ({"name": "r", "kind": "run", "workflowId": "w", "input": {"a": "results.x"}}, "results.x"),
        ({"name": "r", "kind": "run", "workflowId": "w", "maxAttempts": 0}, "maxAttempts"),
    ],
)
def test_publication_refuses_a_bad_run_step(step: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.ValidationFailed, match=message):
        WorkflowDefinition.from_dict({"workflowId": "w", "steps": [step]})
