"""RunAggregate rules, driven purely in memory with a fixed clock and deterministic ids.

Sequences of commands: gap-free event and journal numbering, legal moves only, and the
run's next reminder.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from domain_harness import (
    GRACE,
    LEASE,
    LOCAL_STEP,
    READ_STEP,
    RUN_ID,
    TENANT,
    WRITE_STEP,
    Harness,
    approval_harness,
    proposal,
)

from runcontrol.domain import (
    AttemptOutcome,
    Decision,
    RunState,
    errors,
)
from runcontrol.domain.events import TOPICS
from runcontrol.domain.machines import (
    APPROVAL_TRANSITIONS,
    ATTEMPT_TRANSITIONS,
    RUN_TRANSITIONS,
    STEP_TRANSITIONS,
)
from runcontrol.domain.run.leases import acquire_lease
from runcontrol.domain.run.outcomes import expire_lease

# ============================================================================ sequences


def _assert_gap_free(h: Harness) -> None:
    assert [e.seq for e in h.events] == list(range(1, len(h.events) + 1))
    assert [j.sequence for j in h.journal] == list(range(1, len(h.journal) + 1))
    assert h.run.event_seq == len(h.events)
    assert h.run.journal_seq == len(h.journal)


def _assert_journal_legal(h: Harness) -> None:
    tables = {
        "Run": RUN_TRANSITIONS,
        "Step": STEP_TRANSITIONS,
        "Attempt": ATTEMPT_TRANSITIONS,
        "ApprovalRequest": APPROVAL_TRANSITIONS,
    }
    for entry in h.journal:
        if entry.from_state is not None:
            assert (entry.from_state, entry.to_state) in tables[entry.entity], entry


class TestSequences:
    def test_event_and_journal_sequences_are_gap_free_through_a_busy_run(self):
        h = Harness([READ_STEP, WRITE_STEP, LOCAL_STEP])
        attempt, grant = h.start(0)
        # Refused commands in between consume no sequence numbers.
        with pytest.raises(errors.StaleFencingToken):
            h.report(grant, token=7)
        h.agg.take_audits()
        h.advance(LEASE + GRACE + 1)
        assert h.expire_lease(attempt)
        h.now = h.step(0).not_before
        _, grant = h.start(0)
        h.report(grant)
        gated, grant = h.start(1)
        first = h.request_approval(grant, proposal(1))
        h.decide(first, "rita", Decision.REQUEST_CHANGES)
        with pytest.raises(errors.ApprovalGone):
            h.decide(first)
        grant = h.lease(gated, "worker-2")
        second = h.request_approval(grant, proposal(2))
        h.decide(second)
        grant = h.lease(gated, "worker-3")
        h.report(grant)
        _, grant = h.start(2)
        h.cancel()
        h.report(grant, AttemptOutcome.SUCCEEDED)
        assert h.run.state is RunState.CANCELLED
        _assert_gap_free(h)
        _assert_journal_legal(h)
        assert all(e.run_id == RUN_ID and e.tenant_id == TENANT for e in h.events)
        assert all(e.topic == TOPICS[e.event_type] for e in h.events)
        assert all(e.correlation_id == str(RUN_ID) for e in h.events)
        assert len({e.event_id for e in h.events}) == len(h.events)

    def test_each_batch_continues_where_the_last_one_ended(self):
        h = Harness([READ_STEP, LOCAL_STEP])
        _, grant = h.start(0)
        h.report(grant)
        _, grant = h.start(1)
        h.report(grant)
        last = 0
        for batch in h.batches:
            if batch.events:
                assert batch.events[0].seq == last + 1
                last = batch.events[-1].seq
        assert last == len(h.events)

    def test_version_increments_once_per_non_empty_batch(self):
        h = Harness([READ_STEP])
        versions = [h.run.version]
        attempt, grant = h.start(0)
        for batch in h.batches[1:]:
            assert batch.expected_version == versions[-1]
            versions.append(versions[-1] + 1)
        assert h.run.version == versions[-1]
        acquire_lease(h.agg, h.ctx(), attempt.attempt_id, "worker-1", h.options)  # no-op
        assert h.commit().empty and h.run.version == versions[-1]
        h.report(grant)
        assert h.batches[-1].expected_version == versions[-1]
        assert h.run.version == versions[-1] + 1

    def test_journal_records_actor_time_and_cause(self):
        h = Harness()
        h.advance(60)
        attempt, grant = h.start(0)
        lease_entries = [j for j in h.batches[-1].journal if j.entity == "Attempt"]
        assert [(j.cause, j.actor, j.occurred_at) for j in lease_entries] == [
            ("LeaseGranted", "worker-1", h.now)
        ]
        assert lease_entries[0].entity_id == attempt.attempt_id
        h.report(grant)
        causes = [(j.entity, j.cause) for j in h.batches[-1].journal]
        assert causes == [
            ("Attempt", "OutcomeReported"),
            ("Step", "AttemptSucceeded"),
            ("Run", "LastStepSucceeded"),
        ]


# ============================================================================ reminders


class TestNextDue:
    def test_terminal_runs_need_nothing(self):
        h = Harness()
        h.cancel()
        assert h.agg.next_due(h.options) is None

    def test_a_leased_attempt_is_due_after_expiry_and_grace(self):
        h = Harness()
        _, grant = h.start(0)
        due = h.agg.next_due(h.options)
        assert due == grant.expires_at + timedelta(seconds=GRACE)
        assert expire_lease(h.agg, h.ctx(at=due), grant.attempt_id, h.options) is False
        later = due + timedelta(microseconds=1)
        assert expire_lease(h.agg, h.ctx(at=later), grant.attempt_id, h.options) is True

    def test_a_backoff_is_due_at_not_before(self):
        h = Harness()
        _, grant = h.start(0)
        h.report(grant, AttemptOutcome.FAILED)
        assert h.agg.next_due(h.options) == h.step(0).not_before

    def test_waiting_for_approval_is_due_at_approval_expiry_not_lease_expiry(self):
        h, _, _, approval = approval_harness()
        assert h.agg.next_due(h.options) == approval.expires_at
