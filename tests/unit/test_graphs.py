"""Step graphs (issue 22): publication's check of ``dependsOn``, the ready set (fan-out,
fan-in), and what siblings do when one step parks for approval or fails terminally."""

from __future__ import annotations

from datetime import timedelta

import pytest
from domain_harness import Harness, proposal

from runcontrol.domain import (
    AttemptOutcome,
    AttemptState,
    Decision,
    FailureClass,
    RunState,
    StepState,
    WorkflowDefinition,
    canonical_hash,
    dependencies,
    errors,
)
from runcontrol.domain.run import submission
from runcontrol.domain.run.submission import dispatch, dispatchable_steps
from runcontrol.domain.run.waits import fire_due_waits, receive_signal
from runcontrol.domain.workflow import final_step

DIAMOND = [
    {"name": "plan", "agentId": "a"},
    {"name": "left", "agentId": "a", "dependsOn": ["plan"]},
    {"name": "middle", "agentId": "a", "dependsOn": ["plan"]},
    {"name": "right", "agentId": "a", "dependsOn": ["plan"]},
    {"name": "join", "agentId": "a", "dependsOn": ["left", "middle", "right"]},
]


def definition(steps: list[dict[str, object]]) -> WorkflowDefinition:
    return WorkflowDefinition.from_dict({"workflowId": "wf", "steps": steps})


# ---------------------------------------------------------------------- publication


def test_without_depends_on_a_step_depends_on_the_one_before():
    d = definition([{"name": "a", "agentId": "x"}, {"name": "b", "agentId": "x"}])
    assert dependencies(d.steps, "a") == ()
    assert dependencies(d.steps, "b") == ("a",)
    assert final_step(d.steps) == "b"


def test_a_linear_release_keeps_its_content_hash():
    """``dependsOn`` absent is not written, so a release published before graphs hashes the
    same (same release id when published again)."""
    d = definition([{"name": "a", "agentId": "x"}])
    assert "dependsOn" not in d.to_dict()["steps"][0]
    assert d.content_hash == definition([{"name": "a", "agentId": "x"}]).content_hash


def test_explicit_depends_on_round_trips_and_changes_the_hash():
    d = definition(DIAMOND)
    assert WorkflowDefinition.from_dict(d.to_dict()) == d
    assert dependencies(d.steps, "join") == ("left", "middle", "right")
    assert final_step(d.steps) == "join"
    roots = definition(
        [{"name": "a", "agentId": "x"}, {"name": "b", "agentId": "x", "dependsOn": []}]
    )
    assert dependencies(roots.steps, "b") == ()
    linear = definition([{"name": "a", "agentId": "x"}, {"name": "b", "agentId": "x"}])
    assert roots.content_hash != linear.content_hash


def test_an_unknown_dependency_is_refused_by_name():
    with pytest.raises(errors.ValidationFailed, match="'nope'") as info:
        definition([{"name": "a", "agentId": "x", "dependsOn": ["nope"]}])
    assert info.value.details == {"step": "a", "unknown": "nope"}


@pytest.mark.parametrize(
    ("steps", "cycle"),
    [
        ([{"name": "a", "agentId": "x", "dependsOn": ["a"]}], ["a", "a"]),
        (
            [
                {"name": "a", "agentId": "x", "dependsOn": ["c"]},
                {"name": "b", "agentId": "x"},
                {"name": "c", "agentId": "x"},
            ],
            ["a", "c", "b", "a"],
        ),
    ],
)
def test_a_cycle_is_refused_naming_it(steps, cycle):
    with pytest.raises(errors.ValidationFailed, match="cycle") as info:
        definition(steps)
    assert info.value.details == {"cycle": " -> ".join(cycle)}
    assert " -> ".join(cycle) in str(info.value)


@pytest.mark.parametrize("bad", ["a", [1], [""], ["a", "a"], {"a": 1}])
def test_depends_on_must_be_a_list_of_distinct_names(bad):
    with pytest.raises(errors.ValidationFailed, match="dependsOn"):
        definition([{"name": "a", "agentId": "x"}, {"name": "b", "agentId": "x", "dependsOn": bad}])


def test_a_long_linear_release_is_checked_without_recursion():
    definition([{"name": f"s{i}", "agentId": "x"} for i in range(5000)])


# ---------------------------------------------------------------------- the ready set


def names(steps) -> list[str]:
    return [s.name for s in steps]


def test_fan_out_dispatches_together_and_fan_in_waits_for_all():
    h = Harness(DIAMOND)
    assert names(dispatchable_steps(h.agg, h.now)) == ["plan"]
    _, grant = h.start(0)
    assert dispatchable_steps(h.agg, h.now) == []
    h.report(grant)
    assert names(dispatchable_steps(h.agg, h.now)) == ["left", "middle", "right"]
    grants = [h.start(i, holder=f"w{i}")[1] for i in (1, 2, 3)]
    assert dispatchable_steps(h.agg, h.now) == []  # one non-terminal attempt per step
    with pytest.raises(errors.IllegalTransition):
        dispatch(h.agg, h.ctx(), h.step(1))
    h.report(grants[0])
    h.report(grants[2])
    assert dispatchable_steps(h.agg, h.now) == []  # join waits for middle too
    h.report(grants[1])
    assert names(dispatchable_steps(h.agg, h.now)) == ["join"]
    h.report(h.start(4)[1])
    assert h.run.state is RunState.COMPLETED


def test_a_runs_dependencies_are_its_releases_made_once_and_read_live():
    """``RunAggregate.dependencies_of`` is the release's ``dependencies`` (in the run's order),
    made once per aggregate: the map holds the steps themselves, so a state a command changes
    after it was made is what the next ready set reads."""
    h = Harness(DIAMOND)
    spec = definition(DIAMOND).steps
    for step in h.agg.steps:
        assert names(h.agg.dependencies_of(step)) == list(dependencies(spec, step.name))
    join = h.step(4)
    h.agg.dependencies_of(join).clear()  # a caller's list is its own
    assert names(h.agg.dependencies_of(join)) == ["left", "middle", "right"]
    assert h.agg.ready_steps() == [h.step(0)]
    for i in range(4):
        h.step(i).state = StepState.SUCCEEDED  # past the map: read through the steps
    assert h.agg.ready_steps() == [join]


def test_a_retry_of_one_branch_keeps_the_others_going():
    h = Harness(DIAMOND)
    h.report(h.start(0)[1])
    grants = [h.start(i, holder=f"w{i}")[1] for i in (1, 2, 3)]
    h.report(grants[0], AttemptOutcome.FAILED, failure_class=FailureClass.TRANSIENT)
    assert h.step(1).state is StepState.PENDING and h.run.state is RunState.RUNNING
    assert dispatchable_steps(h.agg, h.step(1).not_before) == [h.step(1)]
    h.report(grants[1])  # a sibling's outcome is accepted meanwhile
    assert h.step(2).state is StepState.SUCCEEDED


def test_next_due_is_the_earliest_ready_step():
    h = Harness(DIAMOND)
    h.report(h.start(0)[1])
    assert h.agg.next_due(h.options) == h.run.updated_at


# ---------------------------------------------------------------------- siblings


def test_terminal_failure_of_a_branch_stops_the_others_and_the_run_ends_failed():
    h = Harness(DIAMOND)
    h.report(h.start(0)[1])
    left = h.start(1, holder="w1")[1]
    middle = h.start(2, holder="w2")[1]
    right = h.dispatch(3)  # dispatched, never leased
    h.report(left, AttemptOutcome.FAILED, failure_class=FailureClass.PERMANENT)
    assert h.run.state is RunState.CANCELLING  # middle is held: asked to stop, observed
    assert h.run.failure_class is FailureClass.PERMANENT
    assert right.state is AttemptState.CANCELLED  # nobody held it: settled at once
    assert h.renew(middle).cancel_requested
    assert "CancellationRequested" in h.event_types()
    h.report(middle, AttemptOutcome.CANCELLED)
    assert h.run.state is RunState.FAILED
    assert h.event_types()[-1] == "RunFailed"
    assert not h.agg.open_attempts()
    assert all(s.state.terminal for s in h.agg.steps)
    assert h.step(4).state is StepState.CANCELLED


def test_a_failing_runs_silent_sibling_settles_uncertain_at_the_stop_timeout():
    h = Harness(DIAMOND)
    h.report(h.start(0)[1])
    left = h.start(1, holder="w1")[1]
    h.start(2, holder="w2")
    h.report(left, AttemptOutcome.FAILED, failure_class=FailureClass.PERMANENT)
    h.advance(h.options.cancel_stop_timeout_seconds + 1)
    assert h.remind() == "stop-timeout"
    assert h.run.state is RunState.FAILED
    assert h.agg.attempts_of(h.step(2))[0].state is AttemptState.UNCERTAIN


def test_a_sibling_parked_for_approval_holds_dispatch_not_the_others():
    steps = [
        {"name": "plan", "agentId": "a"},
        {"name": "write", "agentId": "a", "dependsOn": ["plan"], "gate": "approval"},
        {"name": "read", "agentId": "a", "dependsOn": ["plan"]},
        {"name": "after-read", "agentId": "a", "dependsOn": ["read"]},
    ]
    h = Harness(steps)
    h.report(h.start(0)[1])
    write = h.start(1, holder="w1")[1]
    read = h.start(2, holder="w2")[1]
    approval = h.request_approval(write, proposal(1))
    assert h.run.state is RunState.WAITING_FOR_APPROVAL
    h.report(read)  # its outcome is accepted while the run waits
    assert h.step(2).state is StepState.SUCCEEDED
    assert dispatchable_steps(h.agg, h.now) == []  # nothing new until the decision
    h.decide(approval, decision=Decision.APPROVE)
    assert h.run.state is RunState.RUNNING
    assert names(dispatchable_steps(h.agg, h.now)) == ["after-read"]


def test_a_rejection_with_a_held_sibling_stops_it_and_fails():
    steps = [
        {"name": "write", "agentId": "a", "dependsOn": [], "gate": "approval"},
        {"name": "read", "agentId": "a", "dependsOn": []},
    ]
    h = Harness(steps)
    write = h.start(0, holder="w1")[1]
    read = h.start(1, holder="w2")[1]
    approval = h.request_approval(write, proposal(1))
    h.decide(approval, decision=Decision.REJECT, reason="no")
    assert h.run.state is RunState.CANCELLING
    h.report(read)  # completed effects stay visible
    assert h.run.state is RunState.FAILED
    assert h.run.failure_class is FailureClass.POLICY_DENIED
    assert h.step(1).state is StepState.SUCCEEDED


# ---------------------------------------------------------------------- wait steps

WAITING = [
    {"name": "plan", "agentId": "a"},
    {"name": "pause", "kind": "wait", "seconds": 30},
    {"name": "after", "agentId": "a"},
]


def start_ready(h: Harness) -> list:
    attempts = submission.start_ready(h.agg, h.ctx("run-dispatcher"))
    h.commit()
    return attempts


def fire(h: Harness) -> int:
    fired = fire_due_waits(h.agg, h.ctx("reminder"), h.options)
    h.commit()
    return fired


def test_a_wait_step_holds_no_worker_and_fires_once_when_due():
    h = Harness(WAITING)
    h.report(h.start(0)[1])
    assert start_ready(h) == []  # the wait has no attempt
    pause = h.step(1)
    assert pause.state is StepState.RUNNING and pause.due_at == h.now + timedelta(seconds=30)
    assert h.event_types()[-1] == "StepWaiting"
    assert h.agg.next_due(h.options) == pause.due_at  # the durable reminder
    assert fire(h) == 0  # not yet
    h.advance(30)
    assert fire(h) == 1
    assert pause.state is StepState.SUCCEEDED
    assert fire(h) == 0  # once
    assert h.event_types().count("StepWaitEnded") == 1
    (attempt,) = start_ready(h)
    assert h.agg.step(attempt.step_id).name == "after"
    h.report(h.lease(attempt))
    assert h.run.state is RunState.COMPLETED


def test_an_overdue_wait_fires_at_the_next_wake():
    h = Harness(
        [{"name": "then", "kind": "wait", "until": "2026-01-01T00:00:00+00:00", "dependsOn": []}]
    )
    assert start_ready(h) == []
    assert h.run.state is RunState.RUNNING  # a wait step starts the run as an attempt does
    assert fire(h) == 1
    assert h.run.state is RunState.COMPLETED


def test_a_cancel_ends_a_wait_at_once():
    h = Harness(WAITING)
    h.report(h.start(0)[1])
    start_ready(h)
    h.cancel()
    assert h.run.state is RunState.CANCELLED
    assert h.step(1).state is StepState.CANCELLED
    h.advance(60)
    assert fire(h) == 0


def test_a_wait_step_is_never_dispatched_as_an_attempt():
    h = Harness([{"name": "w", "kind": "wait", "seconds": 1, "dependsOn": []}])
    with pytest.raises(errors.IllegalTransition):
        dispatch(h.agg, h.ctx(), h.step(0))


@pytest.mark.parametrize(
    ("step", "match"),
    [
        ({"kind": "wait"}, "exactly one"),
        ({"kind": "wait", "seconds": 1, "until": "2026-01-01T00:00:00+00:00"}, "exactly one"),
        ({"kind": "wait", "seconds": -1}, "seconds"),
        ({"kind": "wait", "seconds": True}, "seconds"),
        ({"kind": "wait", "until": "tomorrow"}, "until"),
        ({"kind": "wait", "until": "2026-01-01T00:00:00"}, "offset"),
        ({"kind": "sleep", "agentId": "x"}, "kind"),
    ],
)
def test_bad_wait_steps_are_refused(step, match):
    with pytest.raises(errors.ValidationFailed, match=match):
        definition([dict(step, name="w")])


# ---------------------------------------------------------------------- signals

SIGNALLED = [
    {"name": "plan", "agentId": "a"},
    {"name": "go", "kind": "signal"},
    {"name": "after", "agentId": "a"},
]


def signal(h: Harness, name: str = "go", body: object = None, who: str = "carol"):
    step = receive_signal(h.agg, h.ctx(who), name, {"ok": True} if body is None else body, who)
    h.commit()
    return step


def test_a_signal_sent_before_its_step_waits_is_kept_and_delivered_once():
    h = Harness(SIGNALLED)
    _, grant = h.start(0)
    early = signal(h)  # the step is still Pending
    assert early.state is StepState.PENDING and early.signal["body"] == {"ok": True}
    assert h.events[-1].payload["delivered"] is False
    assert h.batches[-1].audits[0].kind == "signal-received"
    h.report(grant)
    (attempt,) = start_ready(h)  # the signal step starts and takes it at once
    assert early.state is StepState.SUCCEEDED
    assert h.agg.step(attempt.step_id).name == "after"
    assert h.event_types().count("StepWaitEnded") == 1
    with pytest.raises(errors.SignalAlreadyReceived):
        signal(h)
    h.report(h.lease(attempt))
    assert h.run.state is RunState.COMPLETED


def test_a_signal_to_a_waiting_step_is_its_result():
    h = Harness(SIGNALLED)
    h.report(h.start(0)[1])
    start_ready(h)
    assert h.step(1).state is StepState.RUNNING
    assert h.agg.next_due(h.options) != h.step(1).due_at  # no timeout: no timer of its own
    step = signal(h, body=[1, 2])
    received = next(e for e in h.events if e.event_type == "SignalReceived")
    assert step.state is StepState.SUCCEEDED and received.payload["delivered"] is True
    assert step.outcome_hash == canonical_hash({"step": "go", "result": [1, 2]})


def test_a_signal_for_no_step_or_a_finished_run_is_refused():
    h = Harness(SIGNALLED)
    with pytest.raises(errors.SignalNotAwaited):
        signal(h, "nope")
    h.cancel()
    with pytest.raises(errors.RunTerminal, match="no more signals"):
        signal(h)


@pytest.mark.parametrize("action", ["fail", "continue"])
def test_a_signal_timeout_fails_the_run_or_continues_with_the_default(action):
    step: dict[str, object] = {"name": "go", "kind": "signal", "timeoutSeconds": 60}
    step["onTimeout"] = action
    if action == "continue":
        step["default"] = {"approved": False}
    h = Harness([{"name": "plan", "agentId": "a"}, step])
    h.report(h.start(0)[1])
    start_ready(h)
    assert h.agg.next_due(h.options) == h.step(1).due_at
    h.advance(60)
    assert fire(h) == 1
    if action == "fail":
        assert h.step(1).state is StepState.FAILED and h.run.state is RunState.FAILED
    else:
        assert h.run.state is RunState.COMPLETED
        assert h.step(1).outcome_hash == canonical_hash(
            {"step": "go", "result": {"approved": False}}
        )


def test_a_signals_body_is_bounded():
    h = Harness(SIGNALLED)
    with pytest.raises(errors.ValidationFailed, match="bytes"):
        signal(h, body="x" * 70000)
