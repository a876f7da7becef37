"""Ordered progress and at-most-once tool calls through the grain, against real Postgres.

What the store holds is read back as the tenant (row-level security applies): the progress
events in the outbox, the tool call rows, the audit records, the run's reminder.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from grain_harness import Harness
from support import WORKER, fenced, race_async

from runcontrol import reconcilers
from runcontrol.commands import (
    ClaimToolCall,
    CompleteToolCall,
    DispatchRun,
    ReportProgress,
)
from runcontrol.config import LeaseOptions, Settings, ToolCallOptions
from runcontrol.domain import (
    LeaseGrant,
    ProgressAck,
    ProgressMessage,
    RunState,
    ToolCallState,
    ToolCallStatus,
    canonical_hash,
    errors,
)
from runcontrol.store.tables import audit_log, command_answers, runs, tool_calls

REQUEST = canonical_hash({"tool": "open-pull-request", "branch": "fix"})
RESULT = canonical_hash({"pullRequest": 17})


def report(h: Harness, grant: LeaseGrant, *seqs: int, **overrides: Any) -> ReportProgress:
    return ReportProgress(
        **fenced(grant, h.tenant, **overrides),
        messages=tuple(ProgressMessage(s, f"step {s}") for s in seqs),
    )


def claim(h: Harness, grant: LeaseGrant, call_id: str = "call-1", **overrides: Any):
    return ClaimToolCall(
        **fenced(grant, h.tenant, **overrides), call_id=call_id, request_hash=REQUEST
    )


def complete(h: Harness, grant: LeaseGrant, call_id: str = "call-1") -> CompleteToolCall:
    return CompleteToolCall(**fenced(grant, h.tenant), call_id=call_id, result_hash=RESULT)


def stored_progress(h: Harness, run_id: uuid.UUID) -> list[tuple[int, str]]:
    return [
        (r.payload["seq"], r.payload["text"])
        for r in h.outbox(run_id)
        if r.event_type == "ProgressReported"
    ]


# ---------------------------------------------------------------------- progress


def test_progress_with_duplicates_and_a_gap_stores_the_exact_sequence(h: Harness):
    grain, grant = h.start_run()

    assert grain.execute(report(h, grant, 1, 2, 3)).acked_seq == 3
    assert grain.execute(report(h, grant, 2, 3, 4)) == ProgressAck(grant.attempt_id, 4, 1, 2)
    with pytest.raises(errors.ProgressGap) as gap:
        grain.execute(report(h, grant, 4, 5, 7, 8))  # 6 was lost: 5 is stored, 7 and 8 not
    assert (gap.value.details["acked_seq"], gap.value.details["gap_at"]) == (5, 7)
    assert h.load(grain.run_id).attempts[grant.attempt_id].progress_seq == 5
    assert grain.execute(report(h, grant, 6, 7, 8)).acked_seq == 8

    assert stored_progress(h, grain.run_id) == [(n, f"step {n}") for n in range(1, 9)]
    seqs = [r.seq for r in h.outbox(grain.run_id)]
    assert seqs == list(range(1, len(seqs) + 1))  # one gap-free per-run sequence
    # A fresh activation (a restarted host) continues from the stored sequence.
    assert h.grain(grain.run_id).execute(report(h, grant, 8, 9)).acked_seq == 9


def test_a_resent_report_gets_its_stored_answer_and_no_second_event(h: Harness):
    grain, grant = h.start_run()
    first = report(h, grant, 1, 2)
    ack = grain.execute(first)
    gapped = report(h, grant, 3, 5)
    with pytest.raises(errors.ProgressGap):
        grain.execute(gapped)
    events = len(h.outbox(grain.run_id))

    again = h.grain(grain.run_id)  # the host died before the answers arrived
    assert again.execute(first) == ack
    with pytest.raises(errors.ProgressGap) as gap:
        again.execute(gapped)  # the same refusal, from the stored ack
    assert gap.value.details["acked_seq"] == 3
    assert len(h.outbox(grain.run_id)) == events
    assert stored_progress(h, grain.run_id) == [(1, "step 1"), (2, "step 2"), (3, "step 3")]


def test_progress_with_a_made_up_token_is_refused_and_audited(h: Harness):
    grain, grant = h.start_run()
    with pytest.raises(errors.StaleFencingToken):
        grain.execute(report(h, grant, 1, fencing_token=grant.fencing_token + 41))
    (audit,) = h.audits(grain.run_id, "stale-fencing-token")
    assert audit.detail["fencing_token"] == grant.fencing_token + 41
    assert stored_progress(h, grain.run_id) == []


# ---------------------------------------------------------------------- tool calls


def test_one_call_claimed_twice_concurrently_is_executed_once(h: Harness):
    grain, grant = h.start_run()
    a, b = h.grain(grain.run_id), h.grain(grain.run_id)
    for g in (a, b):  # warm both activations on the same version
        g.execute(DispatchRun(tenant_id=g.tenant_id, run_id=g.run_id))

    results = race_async(a.grain.execute(claim(h, grant)), b.grain.execute(claim(h, grant)))

    answers = sorted(v.status for kind, v in results if kind == "ok")
    assert answers == [ToolCallStatus.IN_PROGRESS, ToolCallStatus.PROCEED], results
    (row,) = h.rows(tool_calls, grain.run_id)
    assert row.state == ToolCallState.CLAIMED
    executed = sum(1 for _, v in results if v.status is ToolCallStatus.PROCEED)
    assert executed == 1
    assert h.event_types(grain.run_id).count("ToolCallClaimed") == 1


def test_a_completed_call_answers_its_result_to_every_later_claim(h: Harness):
    grain, grant = h.start_run()
    assert grain.execute(claim(h, grant)).status is ToolCallStatus.PROCEED
    assert grain.execute(claim(h, grant)).status is ToolCallStatus.IN_PROGRESS
    done = grain.execute(complete(h, grant))
    assert (done.status, done.result_hash) == (ToolCallStatus.COMPLETED, RESULT)

    later = h.grain(grain.run_id).execute(claim(h, grant))  # a fresh activation, from the rows
    assert (later.status, later.result_hash) == (ToolCallStatus.COMPLETED, RESULT)
    (row,) = h.rows(tool_calls, grain.run_id)
    assert (row.state, row.result_hash) == (ToolCallState.COMPLETED, RESULT)


def test_a_resent_claim_gets_its_stored_answer_not_in_progress(h: Harness):
    grain, grant = h.start_run()
    first = claim(h, grant)
    proceed = grain.execute(first)
    assert proceed.status is ToolCallStatus.PROCEED

    # The reply was lost: the same command (same id) again, on a fresh activation, is told
    # to proceed with its own claim; a different command is told the call is in progress.
    assert h.grain(grain.run_id).execute(first) == proceed
    assert grain.execute(claim(h, grant)).status is ToolCallStatus.IN_PROGRESS
    assert len(h.rows(tool_calls, grain.run_id)) == 1
    stored = [r for r in h.rows(command_answers, grain.run_id) if r.command == "ClaimToolCall"]
    assert len(stored) == 1 and stored[0].command_id == first.command_id


def test_an_orphaned_claim_is_closed_by_the_reminder_and_never_executed(make_harness):
    h: Harness = make_harness(
        Settings(
            leases=LeaseOptions(duration_seconds=3600),
            tool_calls=ToolCallOptions(claim_timeout_seconds=90),
        )
    )
    grain, grant = h.start_run()
    assert grain.execute(claim(h, grant)).status is ToolCallStatus.PROCEED
    due = h.clock.now() + timedelta(seconds=90)
    (run,) = h.rows(runs, grain.run_id)
    assert run.next_due_at == due  # the claim's timeout is the run's durable reminder
    # the sweep runs over every tenant: look for this run only
    assert (h.tenant, grain.run_id) not in reconcilers.due_dispatches(
        h.db, due - timedelta(seconds=1)
    ).keys

    h.clock.advance(90)
    assert (h.tenant, grain.run_id) in reconcilers.due_dispatches(h.db, h.clock.now()).keys
    woken = h.wake(grain)
    assert woken.tool_calls_expired == 1
    (row,) = h.rows(tool_calls, grain.run_id)
    assert row.state == ToolCallState.EXPIRED and row.error
    assert "ToolCallExpired" in h.event_types(grain.run_id)

    later = h.grain(grain.run_id)
    assert later.execute(claim(h, grant)).status is ToolCallStatus.EXPIRED
    with pytest.raises(errors.ToolCallExpired):
        later.execute(complete(h, grant))
    assert len(h.audits(grain.run_id, "tool-call-late-result")) == 1
    (row,) = h.rows(tool_calls, grain.run_id)
    assert row.result_hash is None
    assert h.load(grain.run_id).run.state is RunState.RUNNING


def test_tool_calls_with_a_stale_token_or_after_the_run_ended_are_refused_and_audited(
    h: Harness,
):
    grain, grant = h.start_run()
    with pytest.raises(errors.StaleFencingToken):
        grain.execute(claim(h, grant, fencing_token=grant.fencing_token + 1))
    assert len(h.audits(grain.run_id, "stale-fencing-token")) == 1

    h.succeed(grain, grant, 1)
    assert h.load(grain.run_id).run.state is RunState.COMPLETED
    with pytest.raises(errors.RunTerminal):
        grain.execute(claim(h, grant, "call-after-the-end"))
    (audit,) = h.audits(grain.run_id, "tool-call-after-run-ended")
    assert (audit.actor, audit.detail["call_id"]) == (WORKER, "call-after-the-end")
    assert h.rows(tool_calls, grain.run_id) == []
    assert [a.kind for a in h.rows(audit_log, grain.run_id)] == [
        "stale-fencing-token",
        "tool-call-after-run-ended",
    ]
