"""Rate limits at the grain (issue 21 item 2): a dispatch over a bucket is held, not failed,
until the instant its reservation admits it, and then dispatches without reserving again; a
run without limits makes no reservation at all. Real Postgres (the buckets' SQL functions),
a manual clock."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from grain_harness import Harness, control
from support import SyncGrain, fenced, report

from runcontrol import reconcilers
from runcontrol.commands import ConsumeRateLimit, RetryStep, SubmitRun
from runcontrol.domain import (
    AttemptOutcome,
    FailureClass,
    RunState,
    StepSpec,
    StepState,
    errors,
)
from runcontrol.domain.rates import RATE_LIMIT
from runcontrol.ports.policy import DEFAULT_POLICY_ID, document_from_dict
from runcontrol.store import rates
from runcontrol.store.tables import runs


def limit_policy(h: Harness, rate_limits: dict[str, Any]) -> None:
    doc = document_from_dict(DEFAULT_POLICY_ID, "", {"rateLimits": rate_limits})
    h.c.policies.publish(h.tenant, doc, h.clock.now())


def only_step(h: Harness, grain: SyncGrain) -> Any:
    (step,) = h.load(grain.run_id).steps
    return step


def next_due(h: Harness, grain: SyncGrain) -> Any:
    (row,) = h.rows(runs, grain.run_id)
    return row.next_due_at


def test_a_tenant_limit_holds_the_dispatch_past_its_burst_until_its_instant(h: Harness) -> None:
    limit_policy(h, {"tenant": {"perSecond": 2, "burst": 2}})
    h.publish(StepSpec(name="only", agent_id="agent-a"))
    now = h.clock.now()
    first = [h.submit()[0] for _ in range(2)]
    for grain in first:  # the burst: dispatched at once
        assert only_step(h, grain).state is StepState.RUNNING
        assert only_step(h, grain).held is None
    third, _ = h.submit()
    step = only_step(h, third)
    assert h.load(third.run_id).run.state is RunState.ACCEPTED  # nothing dispatched yet
    assert step.state is StepState.PENDING  # held, not failed
    assert step.not_before == now + timedelta(seconds=0.5)
    assert step.held == {
        "kind": RATE_LIMIT,
        "bucket": "tenant",
        "until": (now + timedelta(seconds=0.5)).isoformat(),
        "attempt": 1,
    }
    assert next_due(h, third) == now + timedelta(seconds=0.5)  # the run's durable reminder
    assert h.open_attempts(third.run_id) == []
    gauges = reconcilers.sample_gauges(h.db, h.clock.now())
    assert gauges.held[(h.tenant, RATE_LIMIT)] == 1  # runcontrol_steps_held
    assert gauges.rate_tokens[(h.tenant, "tenant")] == 0.0  # runcontrol_rate_limit_tokens

    calls = h.env.store.calls
    h.wake(third)  # early: nothing
    assert only_step(h, third).state is StepState.PENDING
    h.clock.advance(0.5)
    h.wake(third)
    step = only_step(h, third)
    assert step.state is StepState.RUNNING and step.held is None
    assert h.env.store.calls == calls  # its reservation was recorded: nothing taken again
    (attempt,) = h.open_attempts(third.run_id)
    assert attempt.dispatched_at == now + timedelta(seconds=0.5)
    assert (h.tenant, RATE_LIMIT) not in reconcilers.sample_gauges(h.db, h.clock.now()).held


def test_held_dispatches_keep_their_order_each_with_its_own_instant(h: Harness) -> None:
    limit_policy(h, {"agents": {"planner": {"perSecond": 10, "burst": 1}}})
    h.publish(StepSpec(name="plan", agent_id="planner"))
    now = h.clock.now()
    grains = [h.submit()[0] for _ in range(4)]
    instants = [only_step(h, g).not_before for g in grains]
    assert instants[0] is None  # dispatched at once
    assert instants[1:] == [now + timedelta(seconds=0.1 * k) for k in (1, 2, 3)]
    assert {only_step(h, g).held["bucket"] for g in grains[1:]} == {"agent:planner"}
    h.clock.advance(0.2)
    for g in grains:
        h.wake(g)
    states = [only_step(h, g).state for g in grains]
    assert states == [StepState.RUNNING, StepState.RUNNING, StepState.RUNNING, StepState.PENDING]


def test_a_named_limit_takes_the_steps_units(h: Harness) -> None:
    limit_policy(h, {"named": {"model-tokens": {"perSecond": 10, "burst": 4}}})
    h.publish(StepSpec(name="gen", agent_id="agent-a", rate_limits=(("model-tokens", 3),)))
    now = h.clock.now()
    first, _ = h.submit()
    assert only_step(h, first).state is StepState.RUNNING
    second, _ = h.submit()  # 1 unit left of 4; 3 wanted: 0.2 s more
    assert only_step(h, second).not_before == now + timedelta(seconds=0.2)
    assert only_step(h, second).held["bucket"] == "named:model-tokens"
    with h.db.tenant(h.tenant) as conn:
        (state,) = rates.bucket_states(conn, now)
    assert state.bucket == "named:model-tokens" and state.tokens == pytest.approx(0.0)


def test_a_retry_reserves_again_after_its_backoff(h: Harness) -> None:
    limit_policy(h, {"tenant": {"perSecond": 0.01, "burst": 1}})  # one dispatch per 100 s
    now = h.clock.now()
    grain, grant = h.start_run(StepSpec(name="only", agent_id="agent-a", max_attempts=2))
    report(grain, grant, AttemptOutcome.FAILED, failure_class=FailureClass.TRANSIENT)
    step = only_step(h, grain)
    assert step.state is StepState.PENDING and step.held is None  # the backoff first
    assert step.not_before is not None and step.not_before < now + timedelta(seconds=100)
    h.clock.advance((step.not_before - h.clock.now()).total_seconds())
    h.wake(grain)  # the backoff is over: the bucket decides, for attempt 2
    step = only_step(h, grain)
    assert step.state is StepState.PENDING
    assert step.not_before == now + timedelta(seconds=100)
    assert step.held is not None and step.held["attempt"] == 2
    # An operator's retry skips a backoff, never a rate limit's hold (its instant is the
    # reservation).
    control(h, grain, RetryStep, step_id=step.step_id)
    assert only_step(h, grain).not_before == now + timedelta(seconds=100)
    assert h.open_attempts(grain.run_id) == []
    h.clock.advance((step.not_before - h.clock.now()).total_seconds())
    h.wake(grain)
    assert [a.number for a in h.open_attempts(grain.run_id)] == [2]


def test_a_release_drawing_on_an_undefined_limit_is_refused_at_submission(h: Harness) -> None:
    h.publish(StepSpec(name="gen", agent_id="agent-a", rate_limits=(("model-tokens", 1),)))
    with pytest.raises(errors.ValidationFailed, match="model-tokens"):
        h.submit()


def test_a_run_without_limits_makes_no_reservation(h: Harness) -> None:
    h.publish(StepSpec(name="a", agent_id="agent-a"), StepSpec(name="b", agent_id="agent-a"))
    grain, _ = h.submit()
    h.succeed(grain, h.lease(grain))
    h.succeed(grain, h.lease(grain))
    assert h.load(grain.run_id).run.state is RunState.COMPLETED
    store = h.env.store
    # No reservation (``calls``: every statement that is neither a load nor a commit), and
    # the same commits and reads as before rate limits: main at d7843f1 counts 5 statements,
    # 5 documents and 6 read transactions for this very run (measured with its own code).
    assert store.calls == 0
    assert (store.statements_sent, store.documents_sent, store.reads) == (5, 5, 6)
    assert all(s.rate_limits is None and s.held is None for s in h.load(grain.run_id).steps)


def test_a_reported_consumption_delays_the_next_dispatch_by_units_over_rate(h: Harness) -> None:
    limit_policy(h, {"named": {"model-tokens": {"perSecond": 100, "burst": 10}}})
    h.publish(StepSpec(name="gen", agent_id="agent-a", rate_limits=(("model-tokens", 1),)))
    now = h.clock.now()
    first, _ = h.submit()
    grant = h.lease(first)
    consume = ConsumeRateLimit(**fenced(grant, h.tenant), name="model-tokens", units=500)
    answer = first.execute(consume)
    assert (answer.bucket, answer.units) == ("named:model-tokens", 500.0)
    assert first.execute(consume) == answer  # a resend: the stored answer, nothing taken again
    # tat: now + 1/100 (the dispatch) + 500/100 (the report); a one-unit dispatch waits
    # until tat - (10 - 1)/100
    second, _ = h.submit()
    expected = now + timedelta(seconds=0.01 + 5.0 - 0.09)
    assert only_step(h, second).not_before == expected
    assert [e for e in h.event_types(first.run_id) if e == "RateLimitConsumed"] == [
        "RateLimitConsumed"
    ]


def test_a_consumption_from_a_stale_lease_is_refused_and_audited(h: Harness) -> None:
    limit_policy(h, {"named": {"model-tokens": {"perSecond": 100, "burst": 10}}})
    grain, grant = h.start_run(StepSpec(name="gen", agent_id="agent-a"))
    stale = {**fenced(grant, h.tenant), "fencing_token": grant.fencing_token + 1}
    with pytest.raises(errors.StaleFencingToken):
        grain.execute(ConsumeRateLimit(**stale, name="model-tokens", units=5))
    assert h.audits(grain.run_id)
    with h.db.tenant(h.tenant) as conn:
        assert rates.bucket_states(conn, h.clock.now()) == []  # nothing taken
    with pytest.raises(errors.ValidationFailed, match="no rate limit 'other'"):
        grain.execute(ConsumeRateLimit(**fenced(grant, h.tenant), name="other", units=5))


def test_a_resent_submission_takes_no_units_again(h: Harness) -> None:
    limit_policy(h, {"tenant": {"perSecond": 1, "burst": 5}})
    h.publish(StepSpec(name="only", agent_id="agent-a"))
    run_id = uuid.uuid4()
    submit = SubmitRun(
        tenant_id=h.tenant, run_id=run_id, principal=h.principal(), request=h.request()
    )
    first = h.grain(run_id).execute(submit)
    with h.db.tenant(h.tenant) as conn:
        (before,) = rates.bucket_states(conn, h.clock.now())
    again = h.grain(run_id).execute(submit)  # a new activation: no memo of the first answer
    assert again.run_id == first.run_id
    with h.db.tenant(h.tenant) as conn:
        (after,) = rates.bucket_states(conn, h.clock.now())
    assert after.tokens == before.tokens == 4.0
