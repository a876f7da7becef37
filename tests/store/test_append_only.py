"""Invariant 10: the recovery journal (and the other evidence tables: audit_log,
approval_decisions, cancellation_intents) are append-only at the database level. Since 0033 the
journal's entries are carried by the event rows (``outbox.journal``; ``recovery_journal`` is a
view of them and of the entries written before, ``recovery_journal_legacy``).

Two independent layers: the app role has no UPDATE/DELETE privilege (permission), and a trigger
refuses UPDATE/DELETE/TRUNCATE even for the table owner; of an event row it lets change only
its publication mark and its payload to NULL (the events' retention), and delete only one that
carries no journal entry. The one sanctioned removal of journal entries is retention:
``runcontrol_purge_journal(cutoff)``, executable by the system role only, deleting only entries
(the event rows carrying them) older than the cutoff.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson
import pytest
from sqlalchemy.exc import DBAPIError
from support import cancel, report

from runcontrol.domain import AttemptOutcome, errors
from runcontrol.store.tables import APPEND_ONLY_TABLES

INSUFFICIENT_PRIVILEGE = "42501"


def sqlstate(exc: pytest.ExceptionInfo[DBAPIError]) -> str | None:
    return getattr(exc.value.orig, "sqlstate", None)


@pytest.fixture
def evidence(make_leased_run, tenant):
    """A run with journal rows, an audit_log row (a refused report) and a cancellation intent."""
    run = make_leased_run(tenant)
    with pytest.raises(errors.LeaseNotHeld):
        report(run.grain, run.grant, AttemptOutcome.SUCCEEDED, holder="intruder")
    assert cancel(run.grain) == "Cancelling"
    return run


# Where a transition's evidence is kept: the append-only tables and the event rows.
EVIDENCE = (*APPEND_ONLY_TABLES, "outbox")


@pytest.mark.parametrize("table", EVIDENCE)
@pytest.mark.parametrize(
    "statement",
    ["UPDATE {t} SET tenant_id = tenant_id", "DELETE FROM {t}"],
    ids=["update", "delete"],
)
def test_app_role_may_not_update_or_delete(db, evidence, table, statement):
    with pytest.raises(DBAPIError) as exc, db.tenant(evidence.tenant) as conn:
        conn.exec_driver_sql(statement.format(t=table))
    assert sqlstate(exc) == INSUFFICIENT_PRIVILEGE
    assert "permission denied" in str(exc.value)


def test_app_role_cannot_use_the_purge_switch(db, evidence):
    with pytest.raises(DBAPIError) as exc, db.tenant(evidence.tenant) as conn:
        conn.exec_driver_sql("SELECT set_config('runcontrol.retention_purge', 'on', true)")
        conn.exec_driver_sql("DELETE FROM outbox WHERE run_id = %s", (evidence.run_id,))
    assert sqlstate(exc) == INSUFFICIENT_PRIVILEGE


@pytest.mark.parametrize("table", ("outbox", "audit_log", "cancellation_intents"))
@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE {t} SET tenant_id = tenant_id || '-moved' WHERE run_id = %s",
        "DELETE FROM {t} WHERE run_id = %s",
        "TRUNCATE {t} CASCADE",  # outbox: its feed rows refer to it
    ],
    ids=["update", "delete", "truncate"],
)
def test_even_the_owner_is_stopped_by_the_trigger(owner_engine, evidence, table, statement):
    sql = statement.format(t=table)
    with owner_engine.connect() as conn:
        assert (
            conn.exec_driver_sql(
                f"SELECT count(*) FROM {table} WHERE run_id = %s", (evidence.run_id,)
            ).scalar_one()
            > 0
        )
        conn.rollback()
        with pytest.raises(DBAPIError) as exc, conn.begin():
            conn.exec_driver_sql(sql, () if "TRUNCATE" in sql else (evidence.run_id,))
    assert sqlstate(exc) == INSUFFICIENT_PRIVILEGE
    assert "append-only" in str(exc.value)


def test_every_append_only_table_has_its_triggers(owner_engine):
    with owner_engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " WHERE NOT t.tgisinternal AND t.tgenabled <> 'D'"
        ).all()
    triggers = {(r.relname, r.tgname) for r in rows}
    for table in EVIDENCE:
        assert (table, f"{table}_append_only") in triggers
        assert (table, f"{table}_no_truncate") in triggers
    assert ("outbox", "outbox_keeps_journal") in triggers


def test_an_event_row_changes_only_by_its_payloads_retention(owner_engine, evidence):
    """Even the owner: an event row's payload may be dropped (the events' retention); nothing
    else of it changes, its publication neither (0039: the relay's floor, no mark on the row),
    and a row carrying journal entries is not deleted (a row without is: the events'
    retention)."""
    allowed = (
        "UPDATE outbox SET payload = NULL WHERE run_id = %s",
        "DELETE FROM outbox WHERE run_id = %s AND journal IS NULL",
    )
    refused = (
        "UPDATE outbox SET published_at = now() WHERE run_id = %s",
        "UPDATE outbox SET feed_position = 1 WHERE run_id = %s",
        "UPDATE outbox SET payload = '{}' WHERE run_id = %s",
        "UPDATE outbox SET journal = NULL WHERE run_id = %s AND journal IS NOT NULL",
        "UPDATE outbox SET journal = journal || journal WHERE run_id = %s AND journal IS NOT NULL",
        "DELETE FROM outbox WHERE run_id = %s AND journal IS NOT NULL",
    )
    with owner_engine.connect() as conn:
        for sql in allowed:
            with conn.begin() as tx:
                assert conn.exec_driver_sql(sql, (evidence.run_id,)).rowcount > 0, sql
                tx.rollback()
        for sql in refused:
            with pytest.raises(DBAPIError) as exc, conn.begin():
                conn.exec_driver_sql(sql, (evidence.run_id,))
            assert "append-only" in str(exc.value), sql


def test_retention_purge_by_system_role_removes_only_entries_older_than_cutoff(
    db, owner_engine, tenant
):
    # Journal entries dated decades before anything else in the session database, so the
    # (all-tenant) purge below can touch nothing another test wrote.
    run_id = uuid.uuid4()
    old = datetime(1971, 1, 1, tzinfo=UTC)
    recent = datetime(1971, 12, 1, tzinfo=UTC)
    cutoff = datetime(1971, 6, 1, tzinfo=UTC)
    with db.tenant(tenant) as conn:
        for seq, when in ((1, old), (2, recent)):  # each on an event row of its own
            entry = {
                "sequence": seq,
                "entity": "Run",
                "entity_id": str(run_id),
                "from_state": None,
                "to_state": "Accepted",
                "cause": "SubmitRun",
                "actor": "alice",
                "occurred_at": when.isoformat(),
            }
            conn.exec_driver_sql(
                "INSERT INTO outbox (event_id, tenant_id, project_id, run_id, seq, topic,"
                " event_type, producer, schema_version, payload, occurred_at, journal)"
                " VALUES (%s, %s, 'p', %s, %s, 'run', 'RunAccepted', 'test', 1, '{}', %s, %s)",
                (uuid.uuid4(), tenant, run_id, seq, when, orjson.dumps([entry]).decode()),
            )

    def sequences() -> list[int]:
        with db.system_tx() as conn:
            return list(
                conn.exec_driver_sql(
                    "SELECT sequence FROM recovery_journal WHERE run_id = %s ORDER BY sequence",
                    (run_id,),
                ).scalars()
            )

    # Neither the app role nor a plain DELETE by the system role may remove them.
    with pytest.raises(DBAPIError) as exc, db.tenant(tenant) as conn:
        conn.exec_driver_sql("SELECT runcontrol_purge_journal(%s)", (cutoff,))
    assert sqlstate(exc) == INSUFFICIENT_PRIVILEGE
    with pytest.raises(DBAPIError) as exc, db.system_tx() as conn:
        conn.exec_driver_sql("DELETE FROM outbox WHERE run_id = %s", (run_id,))
    assert "append-only" in str(exc.value)  # the system role's DELETE: the trigger's refusal
    with pytest.raises(DBAPIError) as exc, owner_engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM outbox WHERE run_id = %s", (run_id,))
    assert "append-only" in str(exc.value)
    assert sequences() == [1, 2]

    with db.system_tx() as conn:
        removed = conn.exec_driver_sql(
            "SELECT runcontrol_purge_journal(%s)", (cutoff,)
        ).scalar_one()
        # The switch is off again for the rest of the transaction.
        switch = conn.exec_driver_sql(
            "SELECT current_setting('runcontrol.retention_purge', true)"
        ).scalar_one()
    assert removed >= 1
    assert switch == "off"
    assert sequences() == [2]
