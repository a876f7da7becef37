"""restore-check's command on one run (``SettleRestoredLeases``): every open lease revoked and
audited, its attempt ``Uncertain`` (cause ``restored-from-backup``), and the run going on by
its rules: a shared-write step fails the run for an
operator, a read step is retried. A resend answers the same; a second check changes nothing.
"""

from __future__ import annotations

from grain_harness import SHARED, Harness
from support import request_approval

from runcontrol.commands import SettleRestoredLeases
from runcontrol.domain import (
    ApprovalState,
    AttemptState,
    FailureClass,
    RunState,
    StepSpec,
    StepState,
)
from runcontrol.store.tables import leases

RESTORED = "restored-from-backup"


def settle(grain, command_id: str | None = None) -> list[str]:
    command = SettleRestoredLeases(tenant_id=grain.tenant_id, run_id=grain.run_id)
    if command_id is not None:
        command = SettleRestoredLeases(
            tenant_id=grain.tenant_id, run_id=grain.run_id, command_id=command_id
        )
    return grain.execute(command)


def test_a_shared_write_lease_settles_uncertain_and_fails_the_run_for_an_operator(h: Harness):
    grain, grant = h.start_run(StepSpec("write", "agent-a", side_effect_class=SHARED))
    settled = settle(grain, "restore-1")
    assert settled == [str(grant.attempt_id)]
    assert settle(grain, "restore-1") == settled  # a resend: the stored answer

    agg = h.load(grain.run_id)
    attempt = agg.attempts[grant.attempt_id]
    assert attempt.state is AttemptState.UNCERTAIN
    assert attempt.settled_by == "restore-check"
    assert agg.run.state is RunState.FAILED
    assert agg.run.failure_class is FailureClass.UNCERTAIN
    assert not agg.leases
    (lease,) = h.rows(leases, grain.run_id)
    assert lease.release_cause == RESTORED and lease.released_at is not None
    (audit,) = h.audits(grain.run_id, RESTORED)
    assert audit.detail["lease_id"] == str(grant.lease_id)
    assert audit.detail["fencing_token"] == grant.fencing_token
    assert audit.actor == "restore-check"
    types = h.event_types(grain.run_id)
    revoked = types.index("LeaseRevoked")
    assert types[revoked:] == [
        "LeaseRevoked",
        "AttemptOutcomeRecorded",
        "RunStateChanged",  # Running -> Failed
        "RunFailed",
    ]
    causes = [j.cause for j in h.journal(grain.run_id)]
    assert causes.count(RESTORED) == 1  # the attempt

    assert settle(grain) == []  # a second check: nothing open, nothing changed
    assert h.event_types(grain.run_id) == types


def test_a_read_lease_settles_uncertain_and_its_step_is_retried(h: Harness):
    grain, grant = h.start_run(StepSpec("read", "agent-a", max_attempts=3))
    assert settle(grain) == [str(grant.attempt_id)]
    agg = h.load(grain.run_id)
    assert agg.attempts[grant.attempt_id].state is AttemptState.UNCERTAIN
    assert agg.run.state is RunState.RUNNING
    (step,) = agg.steps
    assert step.state is StepState.PENDING  # a retry under a new attempt, later
    assert "StepRetryScheduled" in h.event_types(grain.run_id)


def test_a_run_waiting_for_approval_holds_no_lease_and_is_left_alone(h: Harness):
    """Its attempt is parked before the side effect it asked about: nothing to settle."""
    grain, grant = h.start_run(StepSpec("write", "agent-a", side_effect_class=SHARED))
    approval = request_approval(grain, grant)
    before = h.event_types(grain.run_id)
    assert settle(grain) == []
    assert h.event_types(grain.run_id) == before
    agg = h.load(grain.run_id)
    assert agg.attempts[grant.attempt_id].state is AttemptState.PARKED
    assert agg.approval(approval.approval_id).state is ApprovalState.PENDING


def test_a_run_without_an_open_lease_is_left_alone(h: Harness):
    grain, grant = h.start_run()
    h.succeed(grain, grant)
    before = h.event_types(grain.run_id)
    assert settle(grain) == []
    assert h.event_types(grain.run_id) == before
