"""A command's one ``runcontrol_apply`` statement (``runcontrol/store/commit.py``).

``prepare`` turns what the aggregate recorded into one document; ``Store.send`` commits it as
one autocommit statement, its own transaction; ``conclude`` turns the database's answer into the
command's typed error. The statement must commit the whole transition (run row, outbox, journal)
or nothing, answer a lost race and a used idempotency key with their typed errors, and leave its
connection ready for the next command.

``one_connection`` is a container whose store pools a single connection, so each command after
a failed statement runs on the very connection that statement failed on.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from uuid import UUID

import pytest
from store_support import (
    accepted,
    assert_completed_once,
    complete,
    load,
    principal,
    publish,
    renewed,
    request,
    runs_for_key,
    send,
    sent,
    sent_since,
    snapshot,
    submit,
)
from support import SyncGrain, drive

from runcontrol.bootstrap import Container, build
from runcontrol.clock import ManualClock
from runcontrol.commands import ReportOutcome
from runcontrol.config import Settings
from runcontrol.domain import AttemptOutcome, canonical_hash, errors
from runcontrol.grain import RunGrain
from runcontrol.store import Database, DuplicateSubmission


@pytest.fixture
def one_connection(db: Database, clock: ManualClock) -> Iterator[Container]:
    """A container on the session database whose store pools one connection."""
    built = build(Settings(pool_size=1), db=db, clock=clock, migrate=False)
    yield built
    drive(built.store.close())


def another_activation_commits(container: Container, run) -> None:
    """Another activation wins the race: it renews the lease and commits first."""
    send(
        container,
        run.tenant,
        renewed(container, load(container, run.tenant, run.run_id), run.grant),
    )


# ---------------------------------------------------------------------- one command, one statement


@pytest.mark.parametrize("activation", ("cached", "cold"))
def test_a_command_commits_run_outbox_and_journal_in_one_statement_before_it_answers(
    container, tenant, make_leased_run, activation
):
    """Cached: the activation that leased the run reports (it reads nothing). Cold: a fresh
    activation loads the run (one read transaction), then commits. Either way the command is
    one statement carrying one document, committed whole by the time the command answers."""
    db = container.db
    run = make_leased_run(tenant)
    before = snapshot(db, tenant, run.run_id)
    grain = (
        run.grain
        if activation == "cached"
        else SyncGrain(RunGrain(container.env, tenant, run.run_id))
    )
    start = sent(container)

    attempt = grain.execute(
        ReportOutcome(
            tenant_id=tenant,
            run_id=run.run_id,
            attempt_id=run.grant.attempt_id,
            holder=run.grant.holder,
            fencing_token=run.grant.fencing_token,
            outcome=AttemptOutcome.SUCCEEDED,
            outcome_hash=canonical_hash({"result": 1}),
        )
    )

    assert str(attempt.state) == "Succeeded"
    assert sent_since(container, start) == (1, 1)
    assert_completed_once(db, tenant, run.run_id, before)  # read on another connection
    after = snapshot(db, tenant, run.run_id)
    assert all(released is not None for _, _, released in after["leases"])


# ---------------------------------------------------------------------- a lost race


def test_a_lost_race_is_a_conflict_leaves_no_trace_and_its_connection_serves_the_retry(
    container, tenant, make_leased_run, one_connection
):
    """The version guard fails as ``ConcurrencyConflict`` (not a raw database error), nothing
    of the losing transition is visible, and the loser reloads and decides again on the same
    pooled connection: that commits whole."""
    run = make_leased_run(tenant)
    stale = load(one_connection, tenant, run.run_id)
    another_activation_commits(container, run)
    before = snapshot(container.db, tenant, run.run_id)

    with pytest.raises(errors.ConcurrencyConflict):
        send(one_connection, tenant, complete(one_connection, stale, run.grant))

    assert snapshot(container.db, tenant, run.run_id) == before
    send(
        one_connection,
        tenant,
        complete(one_connection, load(one_connection, tenant, run.run_id), run.grant),
    )
    after = snapshot(container.db, tenant, run.run_id)
    assert after["run"][0][:2] == ("Completed", before["run"][0][1] + 1)
    assert [t for _, t in after["outbox"][len(before["outbox"]) :]] == [
        "AttemptOutcomeRecorded",
        "RunStateChanged",
        "RunCompleted",
    ]


# ---------------------------------------------------------------------- duplicate submission


def rows_of(db: Database, tenant: str, run_id: UUID) -> dict[str, int]:
    with db.tenant(tenant) as conn:
        return {
            table: conn.exec_driver_sql(
                f"SELECT count(*) FROM {table} WHERE run_id = %s", (run_id,)
            ).scalar_one()
            for table in ("runs", "steps", "attempts", "outbox", "recovery_journal")
        }


def test_duplicate_submission_through_the_grain_answers_the_run_that_won(
    container, tenant, one_connection
):
    """A key already used fails the insert inside the submission's one statement; the grain
    answers with the existing run, read on the connection the statement failed on."""
    publish(container, tenant)
    env = one_connection.env
    first = submit(
        SyncGrain(RunGrain(env, tenant, uuid.uuid4())), principal(tenant), request("dup-key")
    )
    loser = SyncGrain(RunGrain(env, tenant, uuid.uuid4()))

    again = submit(loser, principal(tenant), request("dup-key"))

    assert (again.run_id, again.created) == (first.run_id, False)
    assert (again.release_id, again.snapshot_id) == (first.release_id, first.snapshot_id)
    assert runs_for_key(container.db, tenant, "dup-key") == [first.run_id]
    assert set(rows_of(container.db, tenant, loser.run_id).values()) == {0}


def test_duplicate_submission_after_a_read_is_reported_and_rolled_back(
    container, tenant, one_connection
):
    """The key read unused, a concurrent submission then won the insert, and ours fails:
    ``DuplicateSubmission``, nothing of our run exists, and the connection serves the next
    read."""
    publish(container, tenant)
    store = one_connection.store
    agg = accepted(one_connection, tenant, "raced-key")
    run_id = agg.run.run_id
    assert drive(store.run_id_for_key(tenant, "proj-1", "raced-key")) is None
    winner = submit(
        SyncGrain(RunGrain(container.env, tenant, uuid.uuid4())),
        principal(tenant),
        request("raced-key"),
    )

    with pytest.raises(DuplicateSubmission):
        send(one_connection, tenant, agg)

    assert runs_for_key(container.db, tenant, "raced-key") == [winner.run_id]
    assert set(rows_of(container.db, tenant, run_id).values()) == {0}
    assert drive(store.run_id_for_key(tenant, "proj-1", "raced-key")) == winner.run_id
