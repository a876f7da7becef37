"""Invariant 11 and the journal half of invariant 3: per-run outbox events carry a gap-free,
strictly increasing sequence, and every state transition has exactly one journal entry, with
refused commands leaving neither (only their audit record)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from grain_harness import SHARED, CeilingRandom, Harness
from support import decide, report, request_approval

from runcontrol.domain import (
    AttemptOutcome,
    Decision,
    FailureClass,
    RunState,
    StepSpec,
    errors,
)


def test_full_run_has_gap_free_events_and_one_journal_entry_per_transition(h: Harness):
    h.env.rng = CeilingRandom()
    h.publish(
        StepSpec("read", "agent-a", max_attempts=2),
        StepSpec("write", "agent-b", side_effect_class=SHARED),
    )
    grain, _ = h.submit()
    run_id = grain.run_id

    first = h.lease(grain)
    report(grain, first, AttemptOutcome.FAILED, failure_class=FailureClass.TRANSIENT)
    h.clock.advance(1)
    h.wake(grain)
    retry = h.lease(grain)
    with pytest.raises(errors.StaleFencingToken):  # refused: audited, nothing else
        report(grain, first, AttemptOutcome.SUCCEEDED, attempt_id=retry.attempt_id)
    h.succeed(grain, retry)
    write = h.lease(grain, "worker-2")
    approval = request_approval(grain, write)
    with pytest.raises(errors.SeparationOfDuties):  # refused: nothing recorded
        decide(grain, approval, h.principal(), Decision.APPROVE, version=1)
    decide(grain, approval, h.reviewer(), Decision.APPROVE, version=1)
    resumed = h.lease(grain, "worker-3")  # the approval parked the attempt; any worker resumes
    h.succeed(grain, resumed, 2)

    agg = h.load(run_id)
    assert agg.run.state is RunState.COMPLETED
    events = h.outbox(run_id)
    journal = h.journal(run_id)

    # Gap-free, strictly increasing, and matching the counters on the run row.
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [j.sequence for j in journal] == list(range(1, len(journal) + 1))
    assert (agg.run.event_seq, agg.run.journal_seq) == (len(events), len(journal))
    assert [e.occurred_at for e in events] == sorted(e.occurred_at for e in events)

    # Each entity's journal entries chain from one state to the next, never repeating one,
    # and end at the state the entity is in.
    chains: dict[tuple[str, object], list] = defaultdict(list)
    for j in journal:
        assert j.from_state != j.to_state
        chains[(j.entity, j.entity_id)].append(j)
    for (entity, _), rows in chains.items():
        for prev, cur in zip(rows, rows[1:], strict=False):
            assert cur.from_state == prev.to_state, (entity, rows)
    current = {("Run", run_id): str(agg.run.state)}
    current |= {("Step", s.step_id): str(s.state) for s in agg.steps}
    current |= {("Attempt", a.attempt_id): str(a.state) for a in agg.attempts.values()}
    current |= {("ApprovalRequest", a.approval_id): str(a.state) for a in agg.approvals.values()}
    assert {key: rows[-1].to_state for key, rows in chains.items()} == current

    # Run transitions: one journal entry per RunAccepted / RunStateChanged event, in order.
    run_events = [
        (e.payload.get("fromState"), e.payload.get("toState", "Accepted"))
        for e in events
        if e.event_type in ("RunAccepted", "RunStateChanged")
    ]
    run_journal = [(j.from_state, j.to_state) for j in chains[("Run", run_id)]]
    assert (
        run_journal
        == run_events
        == [
            (None, "Accepted"),
            ("Accepted", "Running"),
            ("Running", "WaitingForApproval"),
            ("WaitingForApproval", "Running"),
            ("Running", "Completed"),
        ]
    )
    # Attempt transitions: one LeaseGranted / AttemptOutcomeRecorded event per journal entry.
    attempt_moves = [(j.from_state, j.to_state) for j in journal if j.entity == "Attempt"]
    types = [e.event_type for e in events]
    assert attempt_moves.count(("Dispatched", "Leased")) == types.count("LeaseGranted") == 4
    assert attempt_moves.count(("Leased", "Parked")) == types.count("AttemptParked") == 1
    assert attempt_moves.count(("Parked", "Dispatched")) == types.count("AttemptResumed") == 1
    assert sum(1 for f, t in attempt_moves if f == "Leased" and t != "Parked") == types.count(
        "AttemptOutcomeRecorded"
    )
    assert attempt_moves.count((None, "Dispatched")) == types.count("AttemptDispatched") == 3

    # The two refused commands left audit rows only where the rule says so.
    # (a refused decision is audited since the bulk decisions of issue 32, as every refusal is)
    assert [a.kind for a in h.audits(run_id)] == [
        "stale-fencing-token",
        "approval-decision-refused",
    ]
