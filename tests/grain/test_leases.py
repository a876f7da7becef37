"""Invariant 5: one current lease per attempt; fencing tokens strictly increase; an outcome with
a stale token or from a non-holder is rejected *and audited* (the audit row commits although the
command fails); a second outcome is rejected. Plus lease expiry through the reminder
(RunGrain.wake) once the ManualClock passes expires_at + grace."""

from __future__ import annotations

import pytest
from grain_harness import CeilingRandom, Harness, outcome_hash
from support import WORKER, acquire, renew, report

from runcontrol.commands import AcquireLease, ReportOutcome, WakeResult
from runcontrol.domain import (
    AttemptOutcome,
    AttemptState,
    FailureClass,
    RunState,
    StepSpec,
    StepState,
    errors,
)

LEASE = 120  # Settings defaults: RunControl:Leases:DurationSeconds
GRACE = 30  # RunControl:Leases:RenewalGraceSeconds


def test_claims_are_idempotent_for_the_holder_and_refused_for_others(h: Harness):
    grain, grant = h.start_run()
    assert acquire(grain, grant.attempt_id) == grant
    with pytest.raises(errors.LeaseHeld):
        h.grain(grain.run_id).execute(
            AcquireLease(
                tenant_id=h.tenant,
                run_id=grain.run_id,
                attempt_id=grant.attempt_id,
                holder="worker-2",
            )
        )
    leases = h.load(grain.run_id).leases
    assert list(leases) == [grant.attempt_id]
    assert leases[grant.attempt_id].fencing_token == grant.fencing_token == 1


def test_expired_lease_times_out_and_the_retry_gets_a_greater_token(h: Harness):
    h.env.rng = CeilingRandom()
    grain, first = h.start_run(StepSpec("s", "agent-a", max_attempts=3))

    h.clock.advance(LEASE + GRACE)  # exactly at expires_at + grace: not yet
    assert h.wake(grain) == WakeResult()
    h.clock.advance(1)
    assert h.wake(grain) == WakeResult(leases_expired=1)

    agg = h.load(grain.run_id)
    attempt = agg.attempts[first.attempt_id]
    assert attempt.state is AttemptState.TIMED_OUT
    assert attempt.settled_by == "lease-expiry-reconciler"
    assert agg.leases == {}  # released, cause LeaseExpired
    assert agg.steps[0].state is StepState.PENDING
    assert h.event_types(grain.run_id)[-3:] == [
        "LeaseExpired",
        "AttemptOutcomeRecorded",
        "StepRetryScheduled",
    ]

    h.clock.advance(1)  # the retry's backoff (1 s with the ceiling jitter)
    assert h.wake(grain) == WakeResult(dispatched=True)
    second = h.lease(grain, "worker-2")
    assert second.attempt_id != first.attempt_id and second.attempt_number == 2
    assert second.fencing_token > first.fencing_token

    h.succeed(grain, second)
    assert h.load(grain.run_id).run.state is RunState.COMPLETED


def test_stale_token_and_non_holder_are_refused_and_audited(h: Harness):
    h.env.rng = CeilingRandom()
    grain, first = h.start_run(StepSpec("s", "agent-a", max_attempts=3))
    h.clock.advance(LEASE + GRACE + 1)
    h.wake(grain)
    h.clock.advance(1)
    h.wake(grain)
    second = h.lease(grain, "worker-2")
    before = h.load(grain.run_id).run.version
    events_before = h.outbox(grain.run_id)

    refused = [
        # The old holder returns with its old token, for its old attempt and the new one.
        (errors.StaleFencingToken, first.attempt_id, WORKER, first.fencing_token),
        (errors.StaleFencingToken, second.attempt_id, WORKER, first.fencing_token),
        # The current token from someone who does not hold the lease.
        (errors.LeaseNotHeld, second.attempt_id, WORKER, second.fencing_token),
    ]
    for error, attempt_id, holder, token in refused:
        with pytest.raises(error):
            h.grain(grain.run_id).execute(
                ReportOutcome(
                    tenant_id=h.tenant,
                    run_id=grain.run_id,
                    attempt_id=attempt_id,
                    holder=holder,
                    fencing_token=token,
                    outcome=AttemptOutcome.SUCCEEDED,
                )
            )
    with pytest.raises(errors.StaleFencingToken):
        renew(grain, second, fencing_token=first.fencing_token, holder="worker-2")

    audits = h.audits(grain.run_id)
    assert [(a.kind, a.actor, a.detail["fencing_token"]) for a in audits] == [
        ("stale-fencing-token", WORKER, first.fencing_token),
        ("stale-fencing-token", WORKER, first.fencing_token),
        ("lease-not-held", WORKER, second.fencing_token),
        ("stale-fencing-token", "worker-2", first.fencing_token),
    ]
    assert audits[1].detail["current_token"] == second.fencing_token
    # The refusals changed nothing else: no version bump, no events.
    assert h.load(grain.run_id).run.version == before
    assert h.outbox(grain.run_id) == events_before
    assert h.open_attempt(grain.run_id).attempt_id == second.attempt_id


def test_one_outcome_per_attempt(h: Harness):
    grain, grant = h.start_run(StepSpec("first", "agent-a"), StepSpec("second", "agent-b"))
    settled = h.succeed(grain, grant)
    version = h.load(grain.run_id).run.version

    # The same report retried (at-least-once delivery) has no further effect ...
    assert h.succeed(h.grain(grain.run_id), grant).settled_at == settled.settled_at
    assert h.load(grain.run_id).run.version == version
    # ... a different second outcome is refused and audited.
    with pytest.raises(errors.OutcomeAlreadyRecorded):
        report(grain, grant, AttemptOutcome.FAILED, failure_class=FailureClass.PERMANENT)
    with pytest.raises(errors.OutcomeAlreadyRecorded):
        report(grain, grant, AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash(2))
    assert [a.kind for a in h.audits(grain.run_id)] == ["duplicate-outcome"] * 2
    agg = h.load(grain.run_id)
    assert agg.attempts[grant.attempt_id].outcome is AttemptOutcome.SUCCEEDED
    assert agg.run.version == version
    assert h.event_types(grain.run_id).count("AttemptOutcomeRecorded") == 1


def test_renewal_extends_the_lease_and_postpones_expiry(h: Harness):
    grain, grant = h.start_run()
    h.clock.advance(LEASE - 10)
    renewed = renew(grain, grant)
    assert renewed.fencing_token == grant.fencing_token
    assert renewed.expires_at > grant.expires_at
    h.clock.advance(LEASE)  # past the original expiry + grace, within the renewed one
    assert h.wake(grain) == WakeResult()
    assert h.open_attempt(grain.run_id).state is AttemptState.LEASED
