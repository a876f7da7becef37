"""What a grant carries (``runcontrol.workers.grants``), computed once from the run as
committed. Pure: no Ray, no I/O."""

from __future__ import annotations

from domain_harness import READ_STEP, TENANT, WRITE_STEP, Harness

from runcontrol.commands import AcquireLease
from runcontrol.domain import AttemptOutcome
from runcontrol.domain.run.outcomes import report_outcome
from runcontrol.workers.book import Match, Offer
from runcontrol.workers.grants import grant, lease_command
from runcontrol.workers.protocol import Credit


def test_a_grant_carries_the_runs_input_the_lease_and_the_runs_deadline() -> None:
    run = Harness((READ_STEP,))
    attempt = run.dispatch()
    lease = run.lease(attempt, "w-1")
    made = grant("claim-1", run.agg, lease, run.options)
    assert (made.claim_id, made.tenant_id, made.lease) == ("claim-1", TENANT, lease)
    assert made.input is run.run.input and made.results == {}  # a first step depends on nothing
    assert made.deadline_at == run.agg.deadline(run.options)
    assert made.fenced()["fencing_token"] == lease.fencing_token


def test_a_grant_found_again_by_its_claim_id_carries_no_deadline() -> None:
    run = Harness((READ_STEP,))
    lease = run.lease(run.dispatch(), "w-1")
    assert grant("claim-1", run.agg, lease, None).deadline_at is None


def test_a_later_steps_grant_carries_its_dependencies_results_by_step_name() -> None:
    run = Harness((READ_STEP, WRITE_STEP))
    _, first = run.start(0)
    report_outcome(
        run.agg,
        run.ctx(first.holder),
        first.attempt_id,
        first.holder,
        first.fencing_token,
        AttemptOutcome.SUCCEEDED,
        run.options,
        result={"files": 3},
    )
    run.commit()
    lease = run.lease(run.dispatch(1), "w-1")
    assert grant("claim-2", run.agg, lease, run.options).results == {"read": {"files": 3}}


def test_a_matchs_lease_is_acquired_under_the_credits_claim_id() -> None:
    run = Harness((READ_STEP,))
    attempt = run.dispatch()
    offer = Offer.of(run.agg, attempt, "reader")
    assert (offer.tenant_id, offer.run_id, offer.priority) == (TENANT, run.run.run_id, 3)
    match = Match("s", Credit("claim-1", "w-1", ("reader",)), offer)
    assert lease_command(match) == AcquireLease(
        tenant_id=TENANT,
        run_id=run.run.run_id,
        attempt_id=attempt.attempt_id,
        holder="w-1",
        command_id="claim-1",
    )
