"""Child runs through real grains on the real store (issue 32): each run its own grain, the
commands between them sent by a router as a host's would (one mailbox per run), the
re-drive of a lost command by the parent's reminder, a parent's cancel, signal bodies as
results, conditions."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from uuid import UUID

import pytest
from grain_harness import Harness
from support import drive

from runcontrol.commands import CancelRun, Command, SendSignal, SubmitRun, WakeRun
from runcontrol.domain import RunAggregate, RunState, StepSpec, StepState, errors
from runcontrol.grain import RunGrain
from runcontrol.ids import new_run_id

CHILD = StepSpec(name="go", agent_id="", kind="signal", signal="go")


class Router:
    """What a host's router does for a grain test: a grain and a mailbox per run."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.grains: dict[UUID, RunGrain] = {}
        self.locks: dict[UUID, asyncio.Lock] = {}
        self.sent: list[str] = []

    async def send(self, command: Command[Any]) -> Any:
        self.sent.append(type(command).__name__)
        grain = self.grains.setdefault(
            command.run_id, RunGrain(self.h.env, command.tenant_id, command.run_id)
        )
        async with self.locks.setdefault(command.run_id, asyncio.Lock()):
            return await grain.execute(command)

    def run(self, command: Command[Any]) -> Any:
        return drive(self.send(command))

    def kill(self) -> None:
        """The hosts die: every activation is gone (the store keeps everything)."""
        self.grains.clear()


def until(h: Harness, run_id: UUID, check: Callable[[RunAggregate], bool]) -> RunAggregate:
    """Let the commands sent after the commits arrive, until ``check`` holds of the run."""

    async def wait() -> RunAggregate:
        state = "not there"
        for _ in range(500):
            try:
                agg, _ = await h.env.store.load(h.tenant, run_id, h.clock.now())
            except errors.RunNotFound:
                await asyncio.sleep(0.01)
                continue
            if check(agg):
                return agg
            state = str(agg.run.state)
            await asyncio.sleep(0.01)
        raise AssertionError(f"run {run_id} never got there: {state}")

    return drive(wait())


@pytest.fixture
def router(h: Harness) -> Router:
    router = Router(h)
    h.env.send = router.send
    return router


def publish_pair(h: Harness, **run_step: Any) -> None:
    h.publish(CHILD, workflow_id="child")
    h.publish(
        StepSpec(name="plan", agent_id="", kind="signal", signal="plan"),
        StepSpec(
            name="delegate",
            agent_id="",
            kind="run",
            depends_on=("plan",),
            child_workflow_id="child",
            child_alias="latest",
            child_input={"topic": "results.plan.topic", "repo": "input.repo"},
            **run_step,
        ),
        workflow_id="parent",
    )


def submit(h: Harness, router: Router, workflow_id: str = "parent") -> UUID:
    run_id = new_run_id(h.tenant)
    command = SubmitRun(
        tenant_id=h.tenant,
        run_id=run_id,
        principal=h.principal(),
        request=h.request(workflow_id=workflow_id),
    )
    return router.run(command).run_id  # type: ignore[no-any-return]


def signal(h: Harness, router: Router, run_id: UUID, name: str, body: Any) -> None:
    router.run(SendSignal(tenant_id=h.tenant, run_id=run_id, name=name, body=body, sent_by="bob"))


def child_of(agg: RunAggregate, step: str = "delegate") -> UUID:
    found = next(s for s in agg.steps if s.name == step)
    assert found.child is not None
    return UUID(found.child["runId"])


def test_the_childs_result_is_the_steps_and_the_runs(h: Harness, router: Router) -> None:
    publish_pair(h)
    parent = submit(h, router)
    signal(h, router, parent, "plan", {"topic": "tests"})
    agg = until(h, parent, lambda a: a.steps[1].state is StepState.RUNNING)
    child = child_of(agg)
    child_agg = until(h, child, lambda a: a.run.state is RunState.RUNNING)
    assert child_agg.run.parent_run_id == parent and child_agg.run.depth == 1
    assert child_agg.run.parent_step_id == agg.steps[1].step_id
    assert child_agg.run.input == {"topic": "tests", "repo": "x"}  # built from both
    signal(h, router, child, "go", {"answer": 42})
    done = until(h, parent, lambda a: a.run.state.terminal)
    assert done.run.state is RunState.COMPLETED
    result = done.run_result()
    assert result is not None and result.value == {"answer": 42}
    assert [t for t in h.event_types(parent) if "Child" in t] == [
        "ChildRunStarted",
        "ChildRunEnded",
    ]
    ended = ended_payload(h, parent)  # the result's hash, not the result
    assert (ended["childState"], ended["failureClass"]) == ("Completed", None)
    assert ended["resultHash"] == result.outcome_hash and "answer" not in str(ended)


def ended_payload(h: Harness, parent: UUID) -> dict[str, Any]:
    """The parent's ``ChildRunEnded`` (one)."""
    (row,) = [r for r in h.outbox(parent) if r.event_type == "ChildRunEnded"]
    return dict(row.payload)


def test_a_lost_submission_and_a_lost_end_are_sent_again(h: Harness, router: Router) -> None:
    publish_pair(h)
    parent = submit(h, router)
    h.env.send = None  # the host dies between the parent's commit and the child's submission
    signal(h, router, parent, "plan", {"topic": "t"})
    child = child_of(until(h, parent, lambda a: a.steps[1].state is StepState.RUNNING))
    with pytest.raises(errors.RunNotFound):
        h.load(child)
    router.kill()
    h.env.send = router.send
    h.clock.advance(h.env.options.child_check_seconds)
    router.run(WakeRun(tenant_id=h.tenant, run_id=parent))  # the parent's reminder
    until(h, child, lambda a: a.run.state is RunState.RUNNING)
    h.env.send = None  # the child's host dies between its end and telling its parent
    signal(h, router, child, "go", {"answer": 1})
    assert until(h, child, lambda a: a.run.state.terminal).run.state is RunState.COMPLETED
    assert h.load(parent).run.state is RunState.RUNNING
    router.kill()
    h.env.send = router.send
    h.clock.advance(h.env.options.child_check_seconds)
    router.run(WakeRun(tenant_id=h.tenant, run_id=parent))
    done = until(h, parent, lambda a: a.run.state.terminal)
    assert done.run.state is RunState.COMPLETED
    assert done.run_result().value == {"answer": 1}  # type: ignore[union-attr]
    resent = until(h, parent, lambda a: True)
    assert h.event_types(parent).count("ChildRunEnded") == 1
    assert resent.steps[1].child == {"runId": str(child), "number": 1}  # one child, not two


def test_cancelling_the_parent_cancels_its_child_and_then_ends(h: Harness, router: Router) -> None:
    publish_pair(h)
    parent = submit(h, router)
    signal(h, router, parent, "plan", {"topic": "t"})
    child = child_of(until(h, parent, lambda a: a.steps[1].state is StepState.RUNNING))
    until(h, child, lambda a: a.run.state is RunState.RUNNING)
    state = router.run(
        CancelRun(tenant_id=h.tenant, run_id=parent, requested_by="alice", reason="stop")
    )
    assert state == "Cancelling"  # intent first: the child has not settled yet
    assert until(h, child, lambda a: a.run.state.terminal).run.state is RunState.CANCELLED
    done = until(h, parent, lambda a: a.run.state.terminal)
    assert done.run.state is RunState.CANCELLED
    assert done.steps[1].state is StepState.CANCELLED


def test_a_child_cancelled_by_someone_else_fails_its_step(h: Harness, router: Router) -> None:
    h.publish(
        StepSpec(name="go", agent_id="", kind="signal", signal="go", timeout_seconds=5),
        workflow_id="child",
    )
    h.publish(
        StepSpec(
            name="delegate",
            agent_id="",
            kind="run",
            max_attempts=2,
            child_workflow_id="child",
        ),
        workflow_id="parent",
    )
    parent = submit(h, router)
    first = child_of(until(h, parent, lambda a: a.steps[0].state is StepState.RUNNING))
    until(h, first, lambda a: a.run.state is RunState.RUNNING)
    router.run(CancelRun(tenant_id=h.tenant, run_id=first, requested_by="op", reason="x"))
    # a cancelled child is not retried: its step fails, and the run with it
    failed = until(h, parent, lambda a: a.run.state.terminal)
    assert failed.run.state is RunState.FAILED
    assert "ended Cancelled" in (failed.run.failure_reason or "")
    ended = ended_payload(h, parent)
    assert (ended["childState"], ended["failureClass"], ended["resultHash"]) == (
        "Cancelled",
        "cancellation",
        None,
    )


def test_a_missing_workflow_fails_the_step_once(h: Harness, router: Router) -> None:
    h.publish(
        StepSpec(name="delegate", agent_id="", kind="run", child_workflow_id="nowhere"),
        workflow_id="parent",
    )
    parent = submit(h, router)
    failed = until(h, parent, lambda a: a.run.state.terminal)
    assert failed.run.state is RunState.FAILED
    assert "the child run was refused" in (failed.run.failure_reason or "")
    ended = ended_payload(h, parent)  # no child run exists: no child state
    assert (ended["state"], ended["childState"], ended["failureClass"]) == (
        "Failed",
        None,
        "validation",
    )


def test_a_cycle_stops_at_the_depth_limit(h: Harness, router: Router) -> None:
    h.publish(
        StepSpec(name="again", agent_id="", kind="run", child_workflow_id="loop"),
        workflow_id="loop",
    )
    top = submit(h, router, "loop")
    failed = until(h, top, lambda a: a.run.state.terminal)
    assert failed.run.state is RunState.FAILED
    depth = 0
    run_id = top
    while True:  # down the chain: each level failed because the one below it did
        agg = h.load(run_id)
        step = agg.steps[0]
        if step.child is None or agg.run.depth == 5:
            break
        run_id, depth = UUID(step.child["runId"]), depth + 1
    deepest = h.load(run_id)
    assert deepest.run.depth == 5 and deepest.run.state is RunState.FAILED
    assert "deeper than 5 levels is refused" in (deepest.run.failure_reason or "")


def test_a_cancel_before_the_child_was_submitted_settles_through_it(
    h: Harness, router: Router
) -> None:
    h.publish(CHILD, workflow_id="child")
    h.publish(StepSpec(name="d", agent_id="", kind="run", child_workflow_id="child"))
    h.env.send = None  # the parent's host dies before the child's submission
    parent = submit(h, router, "wf")
    child = child_of(h.load(parent), "d")
    router.run(CancelRun(tenant_id=h.tenant, run_id=parent, requested_by="alice", reason="x"))
    assert h.load(parent).run.state is RunState.CANCELLING
    router.kill()
    h.env.send = router.send
    h.clock.advance(h.env.options.child_check_seconds)
    router.run(WakeRun(tenant_id=h.tenant, run_id=parent))  # submits it, then cancels it
    assert until(h, child, lambda a: a.run.state.terminal).run.state is RunState.CANCELLED
    assert until(h, parent, lambda a: a.run.state.terminal).run.state is RunState.CANCELLED
