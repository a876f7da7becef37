"""``HandBackAttempt`` through a real grain and PostgreSQL: the lease holder gives its attempt
back before the lease ends; it settles at once as an expired lease's would, the step is retried
under its policy, a resend gets the stored answer, and a stale holder is refused and audited."""

from __future__ import annotations

import pytest
from grain_harness import CeilingRandom, Harness
from support import fenced

from runcontrol.commands import HandBackAttempt, WakeResult
from runcontrol.domain import AttemptState, RunState, StepSpec, StepState, errors


def hand_back(h: Harness, grant, **overrides) -> HandBackAttempt:
    return HandBackAttempt(**fenced(grant, h.tenant, **overrides), reason="worker going away")


def test_a_handed_back_attempt_settles_now_and_its_retry_completes_the_run(h: Harness):
    h.env.rng = CeilingRandom()
    grain, first = h.start_run(StepSpec("s", "agent-a", max_attempts=3))
    command = hand_back(h, first)

    settled = grain.execute(command)  # long before the lease's expiry plus grace
    assert settled.state is AttemptState.TIMED_OUT and settled.settled_by == first.holder
    assert grain.execute(command) == settled  # a resend: the stored answer, no second effect
    agg = h.load(grain.run_id)
    assert agg.leases == {} and agg.steps[0].state is StepState.PENDING
    assert h.event_types(grain.run_id)[-3:] == [
        "LeaseHandedBack",
        "AttemptOutcomeRecorded",
        "StepRetryScheduled",
    ]

    h.clock.advance(1)  # the retry's backoff (1 s with the ceiling jitter)
    assert h.wake(grain) == WakeResult(dispatched=True)
    second = h.lease(grain, "worker-2")
    assert second.attempt_number == 2 and second.fencing_token > first.fencing_token
    h.succeed(grain, second)
    assert h.load(grain.run_id).run.state is RunState.COMPLETED


def test_a_stale_holder_cannot_hand_back_and_is_audited(h: Harness):
    grain, first = h.start_run(StepSpec("s", "agent-a", max_attempts=3))
    with pytest.raises(errors.StaleFencingToken):
        grain.execute(hand_back(h, first, fencing_token=first.fencing_token + 1))
    assert [a.kind for a in h.audits(grain.run_id)] == ["stale-fencing-token"]
    assert h.load(grain.run_id).attempts[first.attempt_id].state is AttemptState.LEASED
