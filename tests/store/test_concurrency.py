"""Optimistic concurrency: two activations of one run (two RunGrain objects, as after a host
restart or a dedicated + shared placement mix) racing conflicting commands.

Both grains are warmed first so each holds a cached copy of the same version: then both decide
on that version, and the ``UPDATE ... WHERE version = :v`` guard makes exactly one commit win.
The loser re-decides on fresh rows (or answers ConcurrencyConflict); either way the committed
state is the one a serial order would give.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from store_support import load, renewed, send
from support import (
    SyncGrain,
    cancel_command,
    fenced,
    race_async,
    renew_command,
    report_command,
)

from runcontrol.commands import AcquireLease, DispatchRun, RecordCall, ReportOutcome
from runcontrol.domain import AttemptOutcome, CommandContext, canonical_hash, errors
from runcontrol.domain.run.cancellation import cancel
from runcontrol.grain import RunGrain


def run_row(db, tenant, run_id) -> Any:
    with db.tenant(tenant) as conn:
        return conn.exec_driver_sql(
            "SELECT state, version, fencing_seq, event_seq, journal_seq FROM runs"
            " WHERE run_id = %s",
            (run_id,),
        ).one()


def assert_gap_free(db, tenant, run_id) -> None:
    with db.tenant(tenant) as conn:
        seqs = conn.exec_driver_sql(
            "SELECT seq FROM outbox WHERE run_id = %s ORDER BY seq", (run_id,)
        ).scalars()
        journal = conn.exec_driver_sql(
            "SELECT sequence FROM recovery_journal WHERE run_id = %s ORDER BY sequence",
            (run_id,),
        ).scalars()
        seqs, journal = list(seqs), list(journal)
    assert seqs == list(range(1, len(seqs) + 1))
    assert journal == list(range(1, len(journal) + 1))
    row = run_row(db, tenant, run_id)
    assert (row.event_seq, row.journal_seq) == (len(seqs), len(journal))


def warmed_pair(container, tenant, run_id) -> tuple[SyncGrain, SyncGrain]:
    """Two activations of one run, each caching the same version (dispatch() is a no-op read
    here: the only step already has its attempt). Raced with ``race_async``, their commands
    start in the same turn of the loop, so both decide on that version and their documents
    share one statement, each in its own subtransaction: the guard lets exactly one commit."""
    pair = (
        SyncGrain(RunGrain(container.env, tenant, run_id)),
        SyncGrain(RunGrain(container.env, tenant, run_id)),
    )
    for grain in pair:
        assert grain.execute(DispatchRun(tenant_id=grain.tenant_id, run_id=grain.run_id)) is None
    return pair


def test_two_activations_racing_for_one_lease_grant_exactly_one(container, tenant, make_leased_run):
    db = container.db
    run = make_leased_run(tenant, lease=False)
    v0 = run_row(db, tenant, run.run_id).version
    a, b = warmed_pair(container, tenant, run.run_id)

    results = race_async(
        a.grain.execute(
            AcquireLease(
                tenant_id=a.tenant_id, run_id=a.run_id, attempt_id=run.attempt_id, holder="worker-a"
            )
        ),
        b.grain.execute(
            AcquireLease(
                tenant_id=b.tenant_id, run_id=b.run_id, attempt_id=run.attempt_id, holder="worker-b"
            )
        ),
    )

    winners = [v for kind, v in results if kind == "ok"]
    losers = [v for kind, v in results if kind == "err"]
    assert len(winners) == 1 and len(losers) == 1, results
    assert isinstance(losers[0], errors.LeaseHeld | errors.ConcurrencyConflict), losers
    with db.tenant(tenant) as conn:
        leases = conn.exec_driver_sql(
            "SELECT holder, fencing_token, released_at FROM leases WHERE attempt_id = %s",
            (run.attempt_id,),
        ).all()
        granted = conn.exec_driver_sql(
            "SELECT count(*) FROM outbox WHERE run_id = %s AND event_type = 'LeaseGranted'",
            (run.run_id,),
        ).scalar_one()
    assert [(lease.holder, lease.fencing_token, lease.released_at) for lease in leases] == [
        (winners[0].holder, 1, None)
    ]
    assert granted == 1
    row = run_row(db, tenant, run.run_id)
    assert (row.version, row.fencing_seq) == (v0 + 1, 1)
    assert_gap_free(db, tenant, run.run_id)


@pytest.mark.parametrize("round_", range(3))
def test_outcome_racing_cancellation_commits_a_serial_order(
    container, tenant, make_leased_run, round_
):
    db = container.db
    run = make_leased_run(tenant)
    grant = run.grant
    v0 = run_row(db, tenant, run.run_id).version
    a, b = warmed_pair(container, tenant, run.run_id)

    results = race_async(
        a.grain.execute(
            report_command(
                a, grant, AttemptOutcome.SUCCEEDED, outcome_hash=canonical_hash({"r": round_})
            )
        ),
        b.grain.execute(cancel_command(b, "stop it")),
    )

    # Neither command is refused: each re-decides on what the other committed.
    assert [kind for kind, _ in results] == ["ok", "ok"], results
    row = run_row(db, tenant, run.run_id)
    with db.tenant(tenant) as conn:
        intents = conn.exec_driver_sql(
            "SELECT count(*) FROM cancellation_intents WHERE run_id = %s", (run.run_id,)
        ).scalar_one()
        step_state = conn.exec_driver_sql(
            "SELECT state FROM steps WHERE run_id = %s", (run.run_id,)
        ).scalar_one()
    if row.state == "Completed":  # the outcome won; the cancel found a terminal run
        assert results[1][1] == "Completed"
        assert (intents, row.version) == (0, v0 + 1)
    else:  # the cancel won; the outcome settled the attempt and so the cancellation
        assert row.state == "Cancelled"
        assert results[1][1] == "Cancelling"
        assert (intents, row.version) == (1, v0 + 2)
    assert step_state == "Succeeded"  # a completed effect stays visible either way
    assert_gap_free(db, tenant, run.run_id)


def test_a_document_decided_on_a_stale_version_is_a_concurrency_conflict(
    container, tenant, make_leased_run
):
    """Sent alone (``Store.send``): the guarded UPDATE finds no row at the loaded version, and
    nothing of the stale cancellation (intent, outbox, journal) is written."""
    db = container.db
    run = make_leased_run(tenant)
    ctx = CommandContext(now=container.env.clock.now(), actor="ops")
    before = run_row(db, tenant, run.run_id)

    stale = load(container, tenant, run.run_id)
    send(container, tenant, renewed(container, load(container, tenant, run.run_id), run.grant))

    cancel(stale, ctx, "ops", "stop")
    with pytest.raises(errors.ConcurrencyConflict):
        send(container, tenant, stale)

    row = run_row(db, tenant, run.run_id)
    assert (row.state, row.version) == ("Running", before.version + 1)
    with db.tenant(tenant) as conn:
        assert (
            conn.exec_driver_sql(
                "SELECT count(*) FROM cancellation_intents WHERE run_id = %s", (run.run_id,)
            ).scalar_one()
            == 0
        )
    assert_gap_free(db, tenant, run.run_id)


def test_refusal_decided_on_fresh_rows_is_answered_even_if_the_run_moves_again(
    container, tenant, make_leased_run, monkeypatch
):
    """A grain whose cache is stale re-decides once on fresh rows. If that fresh decision is a
    refusal, it is the answer (with its audit record), even when yet another activation commits
    between the reload and the version check: it must not loop or fail internally."""
    db = container.db
    run = make_leased_run(tenant)
    grant = run.grant
    holder_grain = SyncGrain(RunGrain(container.env, tenant, run.run_id))
    intruder = SyncGrain(RunGrain(container.env, tenant, run.run_id))
    assert intruder.execute(DispatchRun(tenant_id=tenant, run_id=run.run_id)) is None  # cached

    store = container.store
    real_run_version = store.run_version
    clock = container.env.clock
    moved: list[UUID] = []

    async def run_version_after_a_concurrent_commit(tenant_id: str, run_id: UUID) -> Any:
        # Another activation commits (a lease renewal bumps the version) just before the check.
        moved.append(run_id)
        clock.advance(1)
        await holder_grain.grain.execute(renew_command(holder_grain, grant))
        return await real_run_version(tenant_id, run_id)

    monkeypatch.setattr(store, "run_version", run_version_after_a_concurrent_commit)
    with pytest.raises(errors.LeaseNotHeld):
        intruder.execute(
            ReportOutcome(
                tenant_id=tenant,
                run_id=run.run_id,
                attempt_id=grant.attempt_id,
                holder="intruder",
                fencing_token=grant.fencing_token,
                outcome=AttemptOutcome.SUCCEEDED,
            )
        )
    monkeypatch.undo()

    assert moved == [run.run_id]  # checked once: the refusal on fresh rows is the answer
    with db.tenant(tenant) as conn:
        kinds = conn.exec_driver_sql(
            "SELECT kind FROM audit_log WHERE run_id = %s", (run.run_id,)
        ).scalars()
        assert list(kinds) == ["lease-not-held"]
    assert run_row(db, tenant, run.run_id).state == "Running"


def test_two_executions_racing_to_record_a_journaled_call_leave_one_record(
    container, tenant, make_leased_run
):
    """Two records of one journaled call with different values (two executions of the step,
    through two activations): one value is stored; the other's answer carries it, so both
    executions go on with the same value."""
    db = container.db
    run = make_leased_run(tenant)
    a, b = warmed_pair(container, tenant, run.run_id)

    def record(grain: SyncGrain, value: str) -> Any:
        return grain.grain.execute(
            RecordCall(**fenced(run.grant, tenant), name="plan", occurrence=1, value=value)
        )

    results = race_async(record(a, "from-a"), record(b, "from-b"))

    answers = [v for kind, v in results if kind == "ok"]
    assert len(answers) == 2, results
    (stored,) = [x for x in answers if x.recorded]
    (other,) = [x for x in answers if not x.recorded]
    with db.tenant(tenant) as conn:
        rows = conn.exec_driver_sql(
            "SELECT value_json, value_hash FROM journaled_calls WHERE run_id = %s",
            (run.run_id,),
        ).all()
        recorded = conn.exec_driver_sql(
            "SELECT count(*) FROM outbox WHERE run_id = %s AND event_type = 'CallRecorded'",
            (run.run_id,),
        ).scalar_one()
    assert len(rows) == 1 and recorded == 1
    assert rows[0].value_hash == stored.value_hash == other.value_hash
    assert other.value_json == rows[0].value_json
    assert_gap_free(db, tenant, run.run_id)
