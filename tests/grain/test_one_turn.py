"""Several commands of one run in one turn (``runcontrol.grain.turn``, issue 42 point 3): decided
in order on the cached run, committed as one document with every answer, one notice; each
answered as if sent alone. A refusal inside the turn (or a lost race at its commit) commits
nothing of it: its commands are decided again alone."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from grain_harness import Harness, outcome_hash
from support import SyncGrain, acquire, drive, held, renew_command, report_command

from runcontrol.commands import AppendOutput, RenewLease, ReportOutcome, SubmitRun
from runcontrol.domain import AttemptOutcome, LeaseGrant, RunState, StepSpec, errors
from runcontrol.grain import RunGrain, together, turn
from runcontrol.grain.bus import SUBSCRIBERS, Committed


@pytest.fixture
def told() -> Iterator[list[Committed]]:
    notices: list[Committed] = []

    def record(grain: RunGrain, notice: Committed) -> None:
        notices.append(notice)

    SUBSCRIBERS.append(record)
    yield notices
    SUBSCRIBERS.remove(record)


def fan_out(h: Harness) -> tuple[SyncGrain, list[LeaseGrant]]:
    """A run of two steps dispatched together, both leased."""
    h.publish(StepSpec("a", "agent-a", depends_on=()), StepSpec("b", "agent-a", depends_on=()))
    grain, _ = h.submit()
    return grain, [acquire(grain, a.attempt_id) for a in h.open_attempts(grain.run_id)]


def succeeded(grain: SyncGrain, grant: LeaseGrant, n: int) -> ReportOutcome:
    return report_command(
        grain, grant, AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash(n), result={"outcome": n}
    )


def test_two_reports_of_one_run_commit_as_one_document(h: Harness, told: list[Committed]) -> None:
    grain, (first, second) = fan_out(h)
    version = h.load(grain.run_id).run.version
    documents, statements = h.c.store.documents_sent, h.c.store.statements_sent
    told.clear()
    reports = [succeeded(grain, first, 1), succeeded(grain, second, 2)]

    outcomes = drive(turn(grain.grain, reports))

    assert [ok for ok, _ in outcomes] == [True, True], outcomes
    assert [a.attempt_id for _, a in outcomes] == [first.attempt_id, second.attempt_id]
    assert (h.c.store.documents_sent - documents, h.c.store.statements_sent - statements) == (1, 1)
    (notice,) = told
    assert [c for c, _ in notice.each] == reports
    run = h.load(grain.run_id).run
    assert run.state is RunState.COMPLETED
    assert run.version == version + 1  # one guarded write of the run, not two
    # each answer is stored with the effect: a resend of either gets it, and commits nothing
    documents = h.c.store.documents_sent
    again = [grain.execute(r) for r in reports]
    assert [a.attempt_id for a in again] == [first.attempt_id, second.attempt_id]
    fresh = SyncGrain(RunGrain(h.env, h.tenant, grain.run_id))  # the stored answers, by id
    assert fresh.execute(reports[1]).attempt_id == second.attempt_id
    assert h.c.store.documents_sent == documents


def test_a_renewal_and_its_report_in_one_turn(h: Harness) -> None:
    grain, grant = h.start_run(StepSpec("only", "agent-a"))
    commands = [
        renew_command(grain, grant),
        report_command(grain, grant, AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash()),
    ]
    documents = h.c.store.documents_sent
    (renewed, renewal), (reported, attempt) = drive(turn(grain.grain, commands))
    assert renewed and renewal.attempt_id == grant.attempt_id
    assert reported and attempt.outcome is AttemptOutcome.SUCCEEDED
    assert h.c.store.documents_sent - documents == 1
    assert h.load(grain.run_id).run.state is RunState.COMPLETED


def test_a_refusal_inside_the_turn_sends_each_command_alone(
    h: Harness, told: list[Committed]
) -> None:
    grain, (first, second) = fan_out(h)
    told.clear()
    stale = renew_command(grain, second, fencing_token=second.fencing_token + 5)
    commands = [succeeded(grain, first, 1), stale, renew_command(grain, second)]

    outcomes = drive(turn(grain.grain, commands))

    assert outcomes[0][0] and outcomes[0][1].attempt_id == first.attempt_id
    assert not outcomes[1][0] and isinstance(outcomes[1][1], errors.StaleFencingToken)
    assert outcomes[2][0] and outcomes[2][1].attempt_id == second.attempt_id
    # alone: the report and the renewal each their own commit, the refusal none
    assert [type(n.command) for n in told] == [ReportOutcome, RenewLease]
    agg = h.load(grain.run_id)
    assert agg.attempt(first.attempt_id).outcome is AttemptOutcome.SUCCEEDED
    assert agg.run.state is RunState.RUNNING


def test_together_groups_a_runs_declared_commands(h: Harness) -> None:
    grain, (first, second) = fan_out(h)
    other, other_grant = h.start_run(StepSpec("only", "agent-a"))
    output = AppendOutput(**held(grain, first, {}), chunks=())
    submit = SubmitRun(
        tenant_id=h.tenant, run_id=uuid.uuid4(), principal=h.principal(), request=h.request()
    )
    commands = [
        succeeded(grain, first, 1),
        renew_command(other, other_grant),
        output,  # written beside the mailbox: not in a turn, and no bar to one
        renew_command(grain, second),
        submit,
    ]
    assert together(commands) == [[0, 3], [1], [2], [4]]
    # one command of a run is no turn; a repeated command id is two sends, not one turn
    assert together(commands[:2]) == [[0], [1]]
    assert together([commands[0], commands[0]]) == [[0], [1]]
