"""Journaled calls (``step.run``) through the worker SDK against the real run hosts (Ray,
PostgreSQL): a worker process killed after its step's first journaled call was recorded and
restarted completes the run without calling the function again; a step that asks for approval
of a proposal a journaled call made at random is approved and completes on re-entry, and its
tool call's repeated claim gets the stored result back."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from actor_harness import RayHarness, run_async
from test_sdk import (
    killed_and_restarted,
    outcomes_per_attempt,
    sdk_worker,
    serving,
    worker_process,
)

from runcontrol.sdk import Step


def start_journal_worker(h: RayHarness, marks: Path, holder: str) -> subprocess.Popen[bytes]:
    return worker_process(
        h,
        marks,
        holder,
        "journal_apps:worker",
        JOURNAL_TEST_MARKS=str(marks),
        JOURNAL_TEST_AGENT=h.agent("planner"),
    )


def test_a_worker_killed_after_a_journaled_call_completes_the_run_without_calling_it_again(
    h: RayHarness, tmp_path: Path
) -> None:
    h.publish({"name": "plan", "agentId": "planner"})
    run_id = killed_and_restarted(
        h,
        lambda holder: start_journal_worker(h, tmp_path, holder),
        tmp_path,
        "recorded-*",  # after the record
        "journal-kill",
    )
    h.assert_consistent(run_id)
    assert (tmp_path / "plan-calls").read_text() == "release notes\n"  # called once
    marks = sorted(tmp_path.glob("recorded-*"))
    assert len(marks) == 2  # both executions got the same plan
    assert len({m.read_text() for m in marks}) == 1
    per_attempt = outcomes_per_attempt(h, run_id)
    assert set(per_attempt.values()) == {1} and len(per_attempt) == 2
    events = h.outbox_events(run_id)
    assert sum(e["type"] == "CallRecorded" for e in events) == 1


def test_an_approval_of_a_journaled_random_proposal_holds_on_re_entry(h: RayHarness) -> None:
    h.publish({"name": "apply", "agentId": "gated", "sideEffectClass": "shared-write"})
    worker = sdk_worker(concurrency=1)
    made: list[str] = []
    applied: list[Any] = []

    def propose() -> dict[str, Any]:
        made.append(f"plan-{len(made)}")  # worded differently on every call
        return {"patch": made[-1]}

    looked_up: list[Any] = []

    @worker.agent(h.agent("gated"))
    async def apply(step: Step) -> dict[str, Any]:
        call = await step.tool_call("lookup", {"ticket": 7})
        if call.proceed:
            await call.complete({"ticket": 7, "open": True})
        looked_up.append((call.status.value, call.result))  # the stored result on re-entry
        proposal = await step.run("propose", propose)
        approval = await step.approval(proposal)
        applied.append(proposal)
        return {"applied": approval.proposal_hash}

    async def scenario() -> None:
        run_id = (await h.submit()).run_id
        await h.wait_type(run_id, "AttemptParked", timeout=60)
        (approval,) = [
            e["payload"] for e in h.outbox_events(run_id) if e["type"] == "ApprovalRequested"
        ]
        await h.approve_requested(approval)  # a reviewer, not the requester
        await h.wait_type(run_id, "RunCompleted", timeout=60)
        h.assert_consistent(run_id)
        events = h.outbox_events(run_id)
        assert sum(e["type"] == "ApprovalRequested" for e in events) == 1

    run_async(serving(h, worker, scenario)(), timeout=120)
    assert made == ["plan-0"]  # the re-entry got the stored proposal
    assert applied == [{"patch": "plan-0"}]
    result = {"ticket": 7, "open": True}
    assert looked_up == [("completed", result), ("completed", result)]
