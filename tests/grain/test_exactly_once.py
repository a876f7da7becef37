"""Exactly-once effect per command id: a resend gets the stored answer, never a second effect.

Each test commits a command, then sends the very same command (same ``command_id``) again,
through the activation that committed it, through a fresh activation (as after the host died
between the commit and the answer), or through an activation that loaded the run after the
commit; and counts rows and events to prove the effect happened once.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta

import orjson
import pytest
from grain_harness import SHARED, Harness, outcome_hash
from sqlalchemy import text
from support import (
    cancel_command,
    decide_command,
    drive,
    proposal,
    renew,
    renew_command,
    report_command,
    request_approval,
)

from runcontrol import reconcilers
from runcontrol.commands import (
    DispatchRun,
    SubmitRun,
    fingerprint,
)
from runcontrol.domain import AttemptOutcome, Decision, RunState, StepSpec, errors
from runcontrol.grain import RunGrain
from runcontrol.store import answers as stored
from runcontrol.store.tables import (
    approval_decisions,
    attempt_results,
    cancellation_intents,
    command_answers,
)

WINDOW_S = 24 * 3600  # the default answer retention


def waiting(h: Harness):
    grain, grant = h.start_run(StepSpec("write", "agent-a", side_effect_class=SHARED))
    approval = request_approval(grain, grant)
    assert approval is not None
    decide = decide_command(grain, approval, h.reviewer(), proposal_hash=proposal(), reason="fine")
    return grain, grant, decide


def fresh(h: Harness, grain: RunGrain) -> RunGrain:
    """A new activation of the run, as on a restarted host."""
    return h.grain(grain.run_id)


def answers(h: Harness, run_id: uuid.UUID) -> list:
    return h.rows(command_answers, run_id)


def test_a_decision_resent_gets_its_answer_not_a_conflict(h: Harness):
    grain, _, decide = waiting(h)
    first = grain.execute(decide)
    events = len(h.outbox(grain.run_id))

    assert grain.execute(decide) == first  # the same activation
    assert fresh(h, grain).execute(decide) == first  # after the host died
    assert len(h.rows(approval_decisions, grain.run_id)) == 1
    assert len(h.outbox(grain.run_id)) == events
    # A new decision (new command id) is still refused by the state machine.
    with pytest.raises(errors.ApprovalAlreadyDecided):
        grain.execute(dataclasses.replace(decide, command_id=str(uuid.uuid4())))


def test_a_command_id_reused_for_another_command_is_refused_not_answered(h: Harness):
    """The same command id with different content (an HTTP client reusing an Idempotency-Key
    for another decision) is an ``IdempotencyConflict``, on the activation that committed it
    and on a fresh one: never the first command's answer, never a second effect."""
    grain, _, decide = waiting(h)
    first = grain.execute(decide)
    other = dataclasses.replace(decide, decision=Decision.REJECT, reason="changed my mind")
    with pytest.raises(errors.IdempotencyConflict):
        grain.execute(other)
    with pytest.raises(errors.IdempotencyConflict):
        fresh(h, grain).execute(other)
    assert fresh(h, grain).execute(decide) == first  # the real resend still gets its answer
    assert len(h.rows(approval_decisions, grain.run_id)) == 1


def test_an_outcome_resent_after_a_restart_is_answered_once(h: Harness):
    grain, grant = h.start_run(StepSpec("a", "agent-a"), StepSpec("b", "agent-b"))
    report = report_command(grain, grant, AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash())
    first = grain.execute(report)
    types = h.event_types(grain.run_id)

    again = fresh(h, grain).execute(report)
    assert again == first
    assert h.event_types(grain.run_id) == types
    assert types.count("AttemptOutcomeRecorded") == 1
    assert types.count("AttemptDispatched") == 2  # the next step, dispatched once


def test_an_outcome_resent_after_a_restart_is_answered_from_its_result_row(h: Harness):
    """A report that stores a result writes no answer row: its result row names the command
    and its fingerprint (0041), and a resend to a fresh activation gets the attempt as stored:
    the very answer (the same bytes), no second effect."""
    grain, grant = h.start_run(StepSpec("a", "agent-a"), StepSpec("b", "agent-b"))
    report = report_command(grain, grant, AttemptOutcome.SUCCEEDED, result={"n": 1})
    first = grain.execute(report)
    assert report.command_id not in {row.command_id for row in answers(h, grain.run_id)}
    (row,) = h.rows(attempt_results, grain.run_id)
    assert (row.command_id, row.fingerprint) == (report.command_id, fingerprint(report))
    version = h.load(grain.run_id).run.version
    since = h.clock.now() - timedelta(seconds=WINDOW_S)
    found = drive(h.env.store.stored_answer(h.tenant, grain.run_id, report.command_id, since))
    assert found == (first, fingerprint(report))

    again = fresh(h, grain).execute(report)
    assert orjson.dumps(stored.encode(again)) == orjson.dumps(stored.encode(first))
    assert h.load(grain.run_id).run.version == version
    assert h.event_types(grain.run_id).count("AttemptOutcomeRecorded") == 1


def test_an_outcome_id_reused_for_another_report_is_refused_from_its_result_row(h: Harness):
    """The fingerprint on the result row refuses a report id reused for another result, on a
    fresh activation as on the one that committed it (not ``OutcomeAlreadyRecorded``: the
    report is not decided again)."""
    grain, grant = h.start_run(StepSpec("a", "agent-a"), StepSpec("b", "agent-b"))
    report = report_command(grain, grant, AttemptOutcome.SUCCEEDED, result={"n": 1})
    grain.execute(report)
    other = dataclasses.replace(report, result={"n": 2})
    with pytest.raises(errors.IdempotencyConflict):
        fresh(h, grain).execute(other)
    with pytest.raises(errors.IdempotencyConflict):
        grain.execute(other)


def test_a_cancel_resent_records_one_intent(h: Harness):
    grain, _ = h.start_run()
    cancel = cancel_command(grain)
    assert grain.execute(cancel) == "Cancelling"
    assert fresh(h, grain).execute(cancel) == "Cancelling"
    assert len(h.rows(cancellation_intents, grain.run_id)) == 1


def test_a_submission_resent_after_its_commit_answers_as_the_first_time(h: Harness):
    h.publish()
    submit = SubmitRun(
        tenant_id=h.tenant,
        run_id=uuid.uuid4(),
        principal=h.principal(),
        request=h.request("once"),
    )
    first = h.grain(submit.run_id).execute(submit)
    again = h.grain(submit.run_id).execute(submit)
    assert again == first and again.created
    assert len(h.outbox(submit.run_id)) == len(h.outbox(first.run_id))
    assert h.event_types(first.run_id).count("RunAccepted") == 1


def test_a_resend_reaching_an_activation_loaded_after_the_commit_has_no_second_effect(
    h: Harness,
):
    """Activation A commits a renewal; B loaded the run afterwards (for another command) and
    then receives the resend: it must find the answer in the store, not renew again."""
    grain, grant = h.start_run()
    renew = renew_command(grain, grant)
    h.clock.advance(5)
    first = grain.execute(renew)
    other = fresh(h, grain)
    assert other.execute(DispatchRun(tenant_id=h.tenant, run_id=grain.run_id)) is None
    version = h.load(grain.run_id).run.version
    h.clock.advance(5)
    assert other.execute(renew) == first  # the same expiry, not one 5 s later
    assert h.load(grain.run_id).run.version == version


def test_answers_are_stored_with_the_effect_and_only_for_commits(h: Harness):
    grain, grant = h.start_run()
    with pytest.raises(errors.StaleFencingToken):
        renew(grain, grant, fencing_token=grant.fencing_token + 7)
    stored = {(row.command, row.command_id) for row in answers(h, grain.run_id)}
    assert {name for name, _ in stored} == {"SubmitRun", "AcquireLease"}


def test_a_resend_past_the_window_is_a_new_command(h: Harness):
    grain, _, decide = waiting(h)
    grain.execute(decide)
    h.clock.advance(WINDOW_S + 1)
    with pytest.raises(errors.ApprovalAlreadyDecided):
        grain.execute(decide)  # the cached activation forgets it too
    with pytest.raises(errors.ApprovalAlreadyDecided):
        fresh(h, grain).execute(decide)
    assert h.load(grain.run_id).run.state is RunState.RUNNING


def test_retention_prunes_answers_past_the_window(h: Harness):
    grain, _, decide = waiting(h)
    grain.execute(decide)
    assert answers(h, grain.run_id)
    journal = journal_of(h, grain.run_id)
    assert journal
    reconcilers.retention(h.db, h.clock.now() + timedelta(hours=23), 365, answer_hours=24)
    assert answers(h, grain.run_id)
    reconcilers.retention(h.db, h.clock.now() + timedelta(hours=25), 365, answer_hours=24)
    assert answers(h, grain.run_id) == []
    assert journal_of(h, grain.run_id) == journal  # the run's journal is untouched by it


def journal_of(h: Harness, run_id: uuid.UUID) -> list[object]:
    with h.db.system_tx() as conn:
        return list(
            conn.execute(
                text("SELECT * FROM recovery_journal WHERE run_id = :r ORDER BY sequence"),
                {"r": run_id},
            )
        )
