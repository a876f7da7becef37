"""Invariant 6 (an Uncertain outcome never retries automatically on a shared-write or riskier
step; it is surfaced) and the retry rule (a transient failure is retried up to maxAttempts with
exponential backoff; anything else fails the step at once)."""

from __future__ import annotations

import pytest
from grain_harness import CeilingRandom, Harness
from support import report

from runcontrol.commands import WakeResult
from runcontrol.config import Settings
from runcontrol.domain import (
    AttemptOutcome,
    AttemptState,
    FailureClass,
    RunState,
    SideEffectClass,
    StepSpec,
    StepState,
)

LEASE_AND_GRACE = 120 + 30


@pytest.mark.parametrize(
    ("side_effect", "retried"),
    [
        (SideEffectClass.READ, True),
        (SideEffectClass.LOCAL_WRITE, True),
        (SideEffectClass.SHARED_WRITE, False),
        (SideEffectClass.EXTERNAL_IRREVERSIBLE, False),
    ],
)
def test_reported_uncertain_is_retried_only_below_shared_write(h: Harness, side_effect, retried):
    h.env.rng = CeilingRandom()
    grain, grant = h.start_run(
        StepSpec("s", "agent-a", max_attempts=3, side_effect_class=side_effect)
    )
    report(grain, grant, AttemptOutcome.UNCERTAIN)
    h.clock.advance(3600)
    h.wake(grain)

    agg = h.load(grain.run_id)
    assert agg.attempts[grant.attempt_id].state is AttemptState.UNCERTAIN
    if retried:
        assert len(agg.attempts) == 2 and agg.run.state is RunState.RUNNING
        return
    assert len(agg.attempts) == 1
    assert agg.run.state is RunState.FAILED
    assert agg.run.failure_class is FailureClass.UNCERTAIN
    assert "operator" in (agg.run.failure_reason or "")
    assert agg.steps[0].state is StepState.FAILED
    failed = h.outbox(grain.run_id)[-1]
    assert (failed.event_type, failed.payload["failureClass"]) == ("RunFailed", "uncertain")


def test_expired_lease_on_a_shared_write_step_is_uncertain_and_not_retried(h: Harness):
    grain, grant = h.start_run(
        StepSpec("s", "agent-a", max_attempts=3, side_effect_class=SideEffectClass.SHARED_WRITE)
    )
    h.clock.advance(LEASE_AND_GRACE + 1)
    assert h.wake(grain) == WakeResult(leases_expired=1)
    h.clock.advance(3600)
    assert h.wake(grain) == WakeResult()

    agg = h.load(grain.run_id)
    (attempt,) = agg.attempts.values()
    assert attempt.state is AttemptState.UNCERTAIN
    assert attempt.failure_class is FailureClass.UNCERTAIN
    assert agg.run.state is RunState.FAILED
    assert agg.run.failure_class is FailureClass.UNCERTAIN
    assert "StepRetryScheduled" not in h.event_types(grain.run_id)


def test_transient_failure_is_retried_up_to_max_attempts_with_backoff(make_harness):
    h = make_harness(Settings(retries={"base_delay_seconds": 10, "max_delay_seconds": 300}))
    h.env.rng = CeilingRandom()  # full jitter at its ceiling: delays are exactly 10 s, 20 s
    h.publish(StepSpec("s", "agent-a", max_attempts=3))
    grain, _ = h.submit()
    tokens = []
    for number, delay in ((1, 10), (2, 20), (3, None)):
        grant = h.lease(grain)
        assert grant.attempt_number == number
        tokens.append(grant.fencing_token)
        failed_at = h.clock.now()
        report(grain, grant, AttemptOutcome.FAILED, failure_class=FailureClass.TRANSIENT)
        if delay is None:
            break
        step = h.load(grain.run_id).steps[0]
        assert step.state is StepState.PENDING
        assert (step.not_before - failed_at).total_seconds() == delay
        h.clock.advance(delay - 1)
        assert h.wake(grain) == WakeResult()  # backoff not over: nothing dispatched
        h.clock.advance(1)
        assert h.wake(grain) == WakeResult(dispatched=True)

    agg = h.load(grain.run_id)
    assert tokens == sorted(set(tokens))
    assert len(agg.attempts) == 3
    assert agg.run.state is RunState.FAILED
    assert agg.run.failure_class is FailureClass.TRANSIENT
    assert "after 3 attempt(s)" in (agg.run.failure_reason or "")
    scheduled = [e.payload for e in h.outbox(grain.run_id) if e.event_type == "StepRetryScheduled"]
    assert [p["nextAttemptNumber"] for p in scheduled] == [2, 3]
    h.clock.advance(3600)
    assert h.wake(grain) == WakeResult()
    assert len(h.load(grain.run_id).attempts) == 3


@pytest.mark.parametrize(
    "failure", [FailureClass.PERMANENT, FailureClass.VALIDATION, FailureClass.POLICY_DENIED]
)
def test_non_transient_failure_is_not_retried(h: Harness, failure):
    grain, grant = h.start_run(StepSpec("s", "agent-a", max_attempts=3))
    report(grain, grant, AttemptOutcome.FAILED, failure_class=failure)
    h.clock.advance(3600)
    h.wake(grain)
    agg = h.load(grain.run_id)
    assert len(agg.attempts) == 1
    assert (agg.run.state, agg.run.failure_class) == (RunState.FAILED, failure)
