"""``UnitOfWork.commit_changes``: a command's one ``runcontrol_apply`` statement and its commit.

Two paths. A unit of work that has sent nothing yet (a cached grain's command) runs the statement
in autocommit, so it is its own transaction, then puts the connection back to ``autocommit =
False``. One that has already read (a load) first ends its read transaction, then sends the
statement the same way (both go through the process's group commit, ``store/group.py``). Both must
commit the whole transition (run row, outbox, journal) or nothing, translate a lost race and a
duplicate idempotency key into their typed errors, and hand the pooled connection back ready for
an ordinary transaction.

``one_connection`` is a Database whose pool holds a single connection, so each unit of work gets
the very connection the previous one gave back: what ``commit_changes`` left on it is what the
next unit of work sees.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import pq
from store_support import (
    accepted,
    assert_completed_once,
    ctx,
    principal,
    publish,
    request,
    runs_for_key,
    snapshot,
    submit,
)

from runcontrol.bootstrap import Container, build
from runcontrol.config import Settings
from runcontrol.domain import (
    AttemptOutcome,
    RunAggregate,
    canonical_hash,
    errors,
)
from runcontrol.grain import RunGrain
from runcontrol.store import Database, DuplicateSubmission, UnitOfWork

PATHS = ("fresh", "after-read")


@pytest.fixture
def one_connection(owner_url: str, db: Database) -> Iterator[Database]:
    """The session database (``db`` has migrated it) through a pool of one connection."""
    database = Database(owner_url, pool_size=1)
    yield database
    database.dispose()


def raw(uow: UnitOfWork) -> psycopg.Connection[Any]:
    """The psycopg connection under the unit of work (sends nothing once the scope is set)."""
    driver = uow.conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    return driver


def renew(container: Container, agg: RunAggregate, run: Any) -> None:
    """A transition that bumps the version and rewrites the lease (the clock moves first, so
    the new ``expires_at`` differs from the stored one)."""
    container.env.clock.advance(1)
    grant = run.grant
    agg.renew_lease(
        ctx(container), grant.attempt_id, grant.holder, grant.fencing_token, container.env.options
    )


def complete(container: Container, agg: RunAggregate, run: Any) -> None:
    """The holder's success: attempt, step and run settle, with three events and journal rows."""
    grant = run.grant
    agg.report_outcome(
        ctx(container),
        grant.attempt_id,
        grant.holder,
        grant.fencing_token,
        AttemptOutcome.SUCCEEDED,
        container.env.options,
        outcome_hash=canonical_hash({"result": 1}),
    )


def loaded(db: Database, tenant: str, run_id: UUID) -> RunAggregate:
    """The run as a grain caches it: loaded in a unit of work that has ended."""
    with UnitOfWork(db, tenant) as uow:
        return uow.load(run_id)


def another_activation_commits(container: Container, run: Any) -> None:
    """Another activation wins the race: it renews the lease and commits first."""
    with UnitOfWork(container.db, run.tenant) as uow:
        winner = uow.load(run.run_id)
        renew(container, winner, run)
        uow.commit_changes(winner)


# ---------------------------------------------------------------------- (a) the connection


@pytest.mark.parametrize("outcome", ("committed", "lost-race"))
def test_fresh_commit_changes_hands_the_next_unit_of_work_a_transactional_connection(
    container, tenant, make_leased_run, one_connection, outcome
):
    """After the autocommit path, whether its statement committed or failed, the pooled
    connection is back in ``autocommit = False``: the next unit of work's reads and writes are
    one transaction, so a failing save after a load and a first save leaves nothing."""
    run = make_leased_run(tenant)
    start = snapshot(container.db, tenant, run.run_id)
    with UnitOfWork(one_connection, tenant) as uow:
        cached = uow.load(run.run_id)
        connection = raw(uow)
    if outcome == "lost-race":
        another_activation_commits(container, run)
    renew(container, cached, run)
    expected = (
        pytest.raises(errors.ConcurrencyConflict) if outcome == "lost-race" else nullcontext()
    )
    with expected, UnitOfWork(one_connection, tenant) as uow:
        uow.commit_changes(cached)  # nothing sent yet in this unit of work: autocommit
    before = snapshot(container.db, tenant, run.run_id)
    assert before["run"][0][1] == start["run"][0][1] + 1  # ours or the winner's renewal

    with pytest.raises(errors.ConcurrencyConflict), UnitOfWork(one_connection, tenant) as uow:
        assert raw(uow) is connection, "the pool handed out another connection"
        assert connection.autocommit is False
        stale = uow.load(run.run_id)
        agg = uow.load(run.run_id)
        renew(container, agg, run)
        uow.save(agg)  # written inside this unit of work's transaction...
        stale.cancel(ctx(container), "ops", "stop")
        uow.save(stale)  # ...which this lost race (the version moved) must roll back whole

    assert snapshot(container.db, tenant, run.run_id) == before


# ---------------------------------------------------------------------- (b) commits and races


@pytest.mark.parametrize("path", PATHS)
def test_commit_changes_commits_run_outbox_and_journal_before_the_unit_of_work_ends(
    container, tenant, make_leased_run, path
):
    db = container.db
    run = make_leased_run(tenant)
    before = snapshot(db, tenant, run.run_id)
    if path == "fresh":
        agg = loaded(db, tenant, run.run_id)
        complete(container, agg, run)
        with UnitOfWork(db, tenant) as uow:
            uow.commit_changes(agg)
            seen_inside = snapshot(db, tenant, run.run_id)  # another connection, before exit
    else:
        with UnitOfWork(db, tenant) as uow:
            agg = uow.load(run.run_id)
            complete(container, agg, run)
            uow.commit_changes(agg)
            seen_inside = snapshot(db, tenant, run.run_id)

    after = snapshot(db, tenant, run.run_id)
    assert seen_inside == after, "commit_changes returned before its transaction committed"
    assert_completed_once(db, tenant, run.run_id, before)
    assert all(released is not None for _, _, released in after["leases"])


@pytest.mark.parametrize("path", PATHS)
def test_commit_changes_that_lost_a_race_is_a_conflict_and_leaves_no_trace(
    container, tenant, make_leased_run, one_connection, path
):
    """The version guard fails on either path as ``ConcurrencyConflict`` (not a raw database
    error), nothing of the losing
    transition is visible, and the connection that lost serves the retry."""
    run = make_leased_run(tenant)
    if path == "fresh":
        agg = loaded(one_connection, tenant, run.run_id)
        another_activation_commits(container, run)
        before = snapshot(container.db, tenant, run.run_id)
        complete(container, agg, run)
        with pytest.raises(errors.ConcurrencyConflict), UnitOfWork(one_connection, tenant) as uow:
            uow.commit_changes(agg)
    else:
        with pytest.raises(errors.ConcurrencyConflict), UnitOfWork(one_connection, tenant) as uow:
            agg = uow.load(run.run_id)
            another_activation_commits(container, run)  # after our read, before our write
            before = snapshot(container.db, tenant, run.run_id)
            complete(container, agg, run)
            uow.commit_changes(agg)

    assert snapshot(container.db, tenant, run.run_id) == before
    # The loser reloads and decides again on the same pooled connection: it commits whole.
    with UnitOfWork(one_connection, tenant) as uow:
        assert raw(uow).autocommit is False
        agg = uow.load(run.run_id)
        complete(container, agg, run)
        uow.commit_changes(agg)
    after = snapshot(container.db, tenant, run.run_id)
    assert after["run"][0][:2] == ("Completed", before["run"][0][1] + 1)
    assert [t for _, t in after["outbox"][len(before["outbox"]) :]] == [
        "AttemptOutcomeRecorded",
        "RunStateChanged",
        "RunCompleted",
    ]


# ---------------------------------------------------------------------- (c) duplicate submission


def rows_of(db: Database, tenant: str, run_id: UUID) -> dict[str, int]:
    with db.tenant(tenant) as conn:
        return {
            table: conn.exec_driver_sql(
                f"SELECT count(*) FROM {table} WHERE run_id = %s", (run_id,)
            ).scalar_one()
            for table in ("runs", "steps", "attempts", "outbox", "recovery_journal")
        }


def test_duplicate_submission_through_the_grain_answers_the_run_that_won(
    container, tenant, one_connection, clock
):
    """The grain's submit is the autocommit path: a key already used fails the insert inside
    the one statement, and the grain answers with the existing run, read on the same pooled
    connection (which must be transactional again for the tenant scope to hold)."""
    publish(container, tenant)
    env = build(Settings(), db=one_connection, clock=clock, migrate=False).env
    first = submit(RunGrain(env, tenant, uuid.uuid4()), principal(tenant), request("dup-key"))
    loser = RunGrain(env, tenant, uuid.uuid4())

    again = submit(loser, principal(tenant), request("dup-key"))

    assert (again.run_id, again.created) == (first.run_id, False)
    assert (again.release_id, again.snapshot_id) == (first.release_id, first.snapshot_id)
    assert runs_for_key(container.db, tenant, "dup-key") == [first.run_id]
    assert set(rows_of(container.db, tenant, loser.run_id).values()) == {0}
    with UnitOfWork(one_connection, tenant) as uow:
        assert raw(uow).autocommit is False


def test_duplicate_submission_after_a_read_is_reported_and_rolled_back(
    container, tenant, one_connection
):
    """The after-read path: this unit of work read the key (unused), a concurrent submission
    then won the insert, and our insert fails. The failure is
    ``DuplicateSubmission``, nothing of our run exists, and the connection serves the next
    unit of work."""
    publish(container, tenant)
    env = container.env
    req = request("raced-key")
    agg = accepted(container, tenant, "raced-key")
    run_id = agg.run.run_id

    with pytest.raises(DuplicateSubmission), UnitOfWork(one_connection, tenant) as uow:
        assert uow.run_id_for_key("proj-1", "raced-key") is None
        winner = submit(RunGrain(env, tenant, uuid.uuid4()), principal(tenant), req)
        uow.commit_changes(agg)

    assert runs_for_key(container.db, tenant, "raced-key") == [winner.run_id]
    assert set(rows_of(container.db, tenant, run_id).values()) == {0}
    with UnitOfWork(one_connection, tenant) as uow:
        assert raw(uow).autocommit is False
        assert uow.run_id_for_key("proj-1", "raced-key") == winner.run_id


# ---------------------------------------------------------------------- on the wire


@contextmanager
def wire(connection: psycopg.Connection[Any], path: Path) -> Iterator[list[tuple[str, str, str]]]:
    """libpq's own trace of the protocol messages on ``connection``: (direction, type, body),
    "F" sent by us, "B" received, in the order libpq queued or read them."""
    messages: list[tuple[str, str, str]] = []
    with path.open("w") as fh:
        connection.pgconn.trace(fh.fileno())
        connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield messages
        finally:
            connection.pgconn.untrace()  # flushes the trace
    for line in path.read_text().splitlines():
        direction, _length, kind, *body = line.split("\t")
        messages.append((direction, kind, "\t".join(body)))


def sent_sql(messages: list[tuple[str, str, str]]) -> list[str]:
    return [body for d, kind, body in messages if d == "F" and kind in ("Parse", "Query")]


@pytest.mark.skipif(sys.platform != "linux", reason="psycopg traces libpq only on Linux")
@pytest.mark.parametrize("path", PATHS)
def test_commit_changes_on_the_wire(
    container, tenant, make_leased_run, one_connection, tmp_path, path
):
    """Fresh: one statement in one exchange (one Sync, one ReadyForQuery), no BEGIN, no COMMIT,
    and the server idle after it (committed). After a read: the read transaction commits, then
    the document is one autocommit statement, and the server ends idle."""
    run = make_leased_run(tenant)
    trace = tmp_path / "libpq.trace"
    if path == "fresh":
        with UnitOfWork(one_connection, tenant) as uow:
            agg = uow.load(run.run_id)
            connection = raw(uow)
        complete(container, agg, run)
        with UnitOfWork(one_connection, tenant) as uow:
            with wire(connection, trace) as messages:
                uow.commit_changes(agg)
            assert raw(uow) is connection
        statements = sent_sql(messages)
        assert len(statements) == 1 and "runcontrol_apply" in statements[0], statements
        assert [kind for d, kind, _ in messages if d == "F"].count("Sync") == 1
        ready = [body for d, kind, body in messages if d == "B" and kind == "ReadyForQuery"]
        assert [r.strip() for r in ready] == ["I"]
    else:
        with UnitOfWork(one_connection, tenant) as uow:
            agg = uow.load(run.run_id)
            complete(container, agg, run)
            with wire(raw(uow), trace) as messages:
                uow.commit_changes(agg)
        statements = sent_sql(messages)
        # The read transaction ends first; the document, checked by its version, then commits
        # as its own autocommit statement (possibly with others: group commit).
        assert len(statements) == 2, statements
        assert "COMMIT" in statements[0] and "runcontrol_apply" in statements[1], statements
        completed = [body for d, kind, body in messages if d == "B" and kind == "CommandComplete"]
        assert [c.strip() for c in completed] == ['"COMMIT"', '"SELECT 1"']
        ready = [body for d, kind, body in messages if d == "B" and kind == "ReadyForQuery"]
        assert [r.strip() for r in ready] == ["I", "I"]
    assert snapshot(container.db, tenant, run.run_id)["run"][0][0] == "Completed"
