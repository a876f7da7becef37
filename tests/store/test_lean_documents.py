"""Lean documents (issue 33, migration 0026): a command's document carries only the run columns
that changed since the run was loaded or last committed (mode "patch"), and
``runcontrol_patch_runs`` updates only those, guarded by the version as before. The stored run
is then what the aggregate holds, column for column, as with whole rows; a column the document
leaves out keeps its stored value; an aggregate the store did not load sends its whole row.
Its steps, attempts and leases alike (issue 42): a row the store holds is sent as its key and
the columns that changed (``<table>_patch``), and the stored row is the aggregate's.
"""

from __future__ import annotations

from typing import Any

import orjson
from store_support import complete, load, prepared, renewed, send
from support import drive

from runcontrol.bootstrap import Container
from runcontrol.domain import RunAggregate
from runcontrol.store import Database, lean, rows
from runcontrol.store.commit import conclude

ALWAYS = {"run_id", "next_due_at"}


def _document(container: Container, tenant: str, agg: RunAggregate) -> tuple[Any, dict[str, Any]]:
    pending = prepared(container, tenant, agg)
    return pending, orjson.loads(pending.doc)


def _stored(db: Database, tenant: str, agg: RunAggregate) -> dict[str, Any]:
    """The run's row as the database holds it, as the aggregate's mapper writes one."""
    with db.tenant(tenant) as conn:
        row = conn.exec_driver_sql("SELECT * FROM runs WHERE run_id = %s", (agg.run.run_id,)).one()
    stored = dict(row._mapping)
    return {c: stored[c] for c in rows.to_row(agg.run)}


def _stored_children(db: Database, tenant: str, run_id: Any) -> dict[tuple[str, str], Any]:
    """Each step, attempt and lease row as the database holds it, by table and key."""
    held: dict[tuple[str, str], Any] = {}
    with db.tenant(tenant) as conn:
        for table, key in lean.KEYS.items():
            for row in conn.exec_driver_sql(f"SELECT * FROM {table} WHERE run_id = %s", (run_id,)):
                held[table, str(row._mapping[key])] = dict(row._mapping)
    return held


def test_a_renewal_sends_what_changed_and_the_row_is_the_aggregates(
    db: Database, container: Container, make_leased_run, tenant: str
) -> None:
    run = make_leased_run(tenant)
    agg = renewed(container, load(container, tenant, run.run_id), run.grant)
    pending, doc = _document(container, tenant, agg)
    assert doc["mode"] == "patch"
    assert set(doc["run"]) == ALWAYS | {"version", "updated_at"}
    assert "input" not in doc["run"]
    # the lease the store holds: its key and what changed (issue 42)
    assert "leases" not in doc
    assert [set(p) for p in doc["leases_patch"]] == [{"lease_id", "expires_at"}]
    (answer,) = drive(container.store.send([pending.doc]))
    conclude(pending, answer)
    assert _stored(db, tenant, agg) == rows.to_row(agg.run)

    # The next command's document is measured against that commit, not the load.
    agg = complete(container, agg, run.grant)
    pending, doc = _document(container, tenant, agg)
    assert {"state", "version", "event_seq", "journal_seq"} <= set(doc["run"])
    assert "input" not in doc["run"] and "created_at" not in doc["run"]
    assert not {"steps", "attempts", "leases"} & set(doc)
    (attempt,) = doc["attempts_patch"]
    assert {"attempt_id", "state", "outcome"} <= set(attempt) and "dispatched_at" not in attempt
    (answer,) = drive(container.store.send([pending.doc]))
    conclude(pending, answer)
    assert _stored(db, tenant, agg) == rows.to_row(agg.run)
    assert _stored(db, tenant, agg)["state"] == "Completed"
    # each step, attempt and lease row is the whole row the patches were measured from
    assert set(pending.children or ()) == {"steps", "attempts", "leases"}
    stored = _stored_children(db, tenant, agg.run.run_id)
    for table, found in (pending.children or {}).items():
        for row in found:
            key = str(row[lean.KEYS[table]])
            assert {c: stored[table, key][c] for c in row} == row, (table, key)


def test_a_column_the_document_leaves_out_keeps_its_stored_value(
    db: Database, container: Container, make_leased_run, tenant: str
) -> None:
    run = make_leased_run(tenant)
    agg = load(container, tenant, run.run_id)
    with db.tenant(tenant) as conn:  # written beside the aggregate (what a patch leaves alone)
        conn.exec_driver_sql(
            "UPDATE runs SET correlation_id = 'beside' WHERE run_id = %s", (run.run_id,)
        )
    send(container, tenant, renewed(container, agg, run.grant))
    assert _stored(db, tenant, agg)["correlation_id"] == "beside"


def test_a_lost_race_is_still_refused_and_the_retry_sends_the_whole_change(
    db: Database, container: Container, make_leased_run, tenant: str
) -> None:
    run = make_leased_run(tenant)
    first = renewed(container, load(container, tenant, run.run_id), run.grant)
    second = renewed(container, load(container, tenant, run.run_id), run.grant)
    send(container, tenant, first)
    pending, doc = _document(container, tenant, second)
    assert doc["mode"] == "patch"
    (answer,) = drive(container.store.send([pending.doc]))
    assert answer is not None and answer[0] == "RC409"  # the version guard holds
    agg = complete(container, load(container, tenant, run.run_id), run.grant)
    send(container, tenant, agg)
    assert _stored(db, tenant, agg) == rows.to_row(agg.run)


def test_an_aggregate_the_store_did_not_load_sends_its_whole_row(
    db: Database, container: Container, make_leased_run, tenant: str
) -> None:
    run = make_leased_run(tenant)
    loaded = load(container, tenant, run.run_id)
    agg = RunAggregate(
        loaded.run,
        loaded.steps,
        loaded.attempts.values(),
        loaded.leases.values(),
    )
    renewed(container, agg, run.grant)
    _, doc = _document(container, tenant, agg)
    assert doc["mode"] == "patch"
    assert set(doc["run"]) == set(rows.to_row(agg.run)) | {"next_due_at"}
