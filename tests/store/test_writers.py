"""The SQL functions (``runcontrol/store/sql/``) and the writers rendered from ``tables.py``
(``runcontrol/store/writers.py``).

- every function is as the revision chain last applied it (a function or a ``Column`` changed
  without ``make sql`` fails here), and the migrated database runs exactly them;
- adding a column takes its ``ALTER`` and its one re-rendered writer, and ``runcontrol_apply``
  writes it unchanged (done here on a database of its own);
- invariant 2 at the database level: a run's pins never change, whoever updates the row.
"""

from __future__ import annotations

import copy
import uuid

import orjson
import pytest
from sqlalchemy import Column, MetaData, Text, create_engine, text
from sqlalchemy import exc as sa_exc
from support import drive
from test_schema_source import Prepared, everything, stored_template

from runcontrol.config import Settings
from runcontrol.store import Database, Store, functions, rows, writers
from runcontrol.store.commit import conclude, prepare
from runcontrol.store.tables import RUN_PINS, metadata, views

PIN_VALUES = {
    "release_id": "rel-other",
    "policy_revision": "99",
    "model_profile_id": "other-profile",
    "snapshot_id": str(uuid.uuid4()),
    "priority": 5,
    "flow": '[{"name": "w", "key": "other", "limit": 9, "strategy": "queue", "scope": "run"}]',
    "parent_run_id": str(uuid.uuid4()),
    "parent_step_id": str(uuid.uuid4()),
    "depth": 3,
    "template_id": "other-template",
    "template_version": 7,
    "replay_of": str(uuid.uuid4()),
    "replay": '{"liveCalls": true, "approvals": "fail"}',
}


def with_column(table: str, name: str) -> MetaData:
    changed = copy.deepcopy(metadata)
    changed.tables[table].append_column(Column(name, Text))
    return changed


# ---------------------------------------------------------------------- written once


def test_every_function_is_as_the_revision_chain_applies_it():
    assert functions.changed() == {}, (
        "a SQL function or a table changed since the newest migration: run `make sql` and "
        "commit the revision it writes"
    )


def test_the_check_fails_for_a_column_added_without_make_sql():
    assert list(functions.changed(with_column("attempts", "added_later"))) == [
        "runcontrol_write_attempts",
        "runcontrol_patch_attempts",
    ]


def test_a_generated_revision_records_what_changed_and_fails_closed():
    text = functions.revision_text("0031", "0030", {"runcontrol_apply": "ab" * 16})
    module: dict[str, object] = {}
    exec(compile(text, "0031_functions.py", "exec"), module)
    assert (module["revision"], module["down_revision"]) == ("0031", "0030")
    assert module["FUNCTIONS"] == {"runcontrol_apply": "ab" * 16}
    assert "oldest_code" not in module  # fail closed until said otherwise


def test_every_function_is_written_once_and_the_database_runs_it(owner_engine):
    units = writers.render()
    assert len({u.name for u in units}) == len(units)
    current = functions.current()  # raises for a hand-written file named as a writer
    assert {u.name: u.sql for u in units}.items() <= current.items()
    with owner_engine.connect() as conn:
        source = dict(
            conn.exec_driver_sql(
                "SELECT proname, prosrc FROM pg_proc WHERE proname LIKE 'runcontrol%%'"
            ).all()
        )
        triggers = set(
            conn.exec_driver_sql(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = 'runs'::regclass"
            ).scalars()
        )
    for name, written in current.items():
        assert source.get(name) == functions.body(written), (
            f"{name}: the migration did not apply it"
        )
    assert set(source) == set(current)  # and nothing else
    assert "runs_keep_pins" in triggers


def test_every_table_a_document_writes_has_a_writer():
    """One per row mapper (the run's are two) and the stored answers: a new table the write
    path writes cannot be left to hand-written SQL. The journal's entries are written on their
    event's row (0033): its mapper's table is a view."""
    mapped = {m.table.name for m in rows.MAPPERS.values()} - set(views.tables)
    assert {"runs", *writers.WRITTEN} == mapped | {"command_answers"}
    assert len(writers.WRITTEN) == len(set(writers.WRITTEN))


def test_writers_upsert_mutable_tables_and_only_insert_into_appended_ones():
    sql = {u.name: u.sql for u in writers.render()}
    for name in ("steps", "attempts", "leases", "tool_calls", "approval_requests"):
        assert "ON CONFLICT" in sql[f"runcontrol_write_{name}"], name
    for name in ("outbox", "audit_log", "approval_decisions"):
        assert "ON CONFLICT" not in sql[f"runcontrol_write_{name}"], name
        assert "UPDATE" not in sql[f"runcontrol_write_{name}"], name
    # the serial ids are the database's to assign
    assert "(\n            id," not in sql["runcontrol_write_outbox"]


# ---------------------------------------------------------------------- adding a column


def test_a_new_column_rerenders_only_its_table_writer():
    """What `make sql` applies in a new revision after a ``Column`` is added to steps: that
    table's writers alone, naming the column in its INSERT, SELECT and upsert SET, and in its
    patch's SET (issue 42)."""
    changed = with_column("steps", "note")
    assert list(functions.changed(changed)) == ["runcontrol_write_steps", "runcontrol_patch_steps"]
    steps = functions.current(changed)["runcontrol_write_steps"]
    assert steps.count("note") == 4  # the INSERT's list, the SELECT's and both sides of the SET
    assert "note = EXCLUDED.note" in steps
    patch = functions.current(changed)["runcontrol_patch_steps"]
    assert "note = CASE WHEN e.value ? 'note' THEN r.note ELSE steps.note END" in patch


def test_adding_a_column_is_an_alter_and_one_writer(scratch: Database, tenant: str):
    """The revision a new column needs, played on a scratch database: the ``ALTER`` and the
    re-rendered writer. ``runcontrol_apply`` is not restated, and writes the column."""
    writer = functions.current(with_column("steps", "note"))["runcontrol_write_steps"]
    owner = create_engine(scratch.owner_url)
    try:
        with owner.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE steps ADD COLUMN note TEXT")
            conn.exec_driver_sql(writer.replace("%", "%%"))
    finally:
        owner.dispose()

    changes = everything(tenant)
    stored_template(scratch, tenant, changes)
    pending = prepare(tenant, Prepared(changes), Settings().options())
    assert pending is not None
    doc = orjson.loads(pending.doc)
    doc["steps"][0]["note"] = "written by the unchanged runcontrol_apply"
    store = Store(scratch.app_url, size=1)
    try:
        (answer,) = drive(store.send([orjson.dumps(doc).decode()]))
    finally:
        drive(store.close())
    conclude(pending, answer)
    with scratch.tenant(tenant) as conn:
        notes = conn.exec_driver_sql("SELECT note FROM steps").scalars().all()
    assert notes == ["written by the unchanged runcontrol_apply"]


# ---------------------------------------------------------------------- invariant 2


@pytest.mark.parametrize("pin", RUN_PINS)
def test_the_app_role_cannot_change_a_pin(db: Database, make_leased_run, tenant: str, pin: str):
    run = make_leased_run(tenant)
    with pytest.raises(sa_exc.ProgrammingError, match="pins never change after acceptance"):
        with db.tenant(tenant) as conn:
            conn.exec_driver_sql(
                f"UPDATE runs SET {pin} = %s WHERE run_id = %s", (PIN_VALUES[pin], run.run_id)
            )
    with db.tenant(tenant) as conn:  # setting a pin to its own value, and the rest, still work
        updated = conn.exec_driver_sql(
            f"UPDATE runs SET {pin} = {pin}, correlation_id = 'c' WHERE run_id = %s",
            (run.run_id,),
        )
        assert updated.rowcount == 1


def test_not_even_the_owner_can_change_a_pin(owner_engine, make_leased_run, tenant: str):
    run = make_leased_run(tenant)
    with pytest.raises(sa_exc.ProgrammingError, match="pins never change"):
        with owner_engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE runs SET release_id = 'rel-other' WHERE run_id = %s", (run.run_id,)
            )


@pytest.mark.parametrize("mode", ["update", "patch"])
def test_a_document_that_changes_a_pin_leaves_it_as_accepted(
    db: Database, make_leased_run, tenant: str, mode: str
):
    """The run's writers do not name the pins: a document carrying other values (a defect
    upstream) commits its other changes and the pins stay as accepted (a whole row, and a
    patch of the columns that changed: 0026)."""
    run = make_leased_run(tenant)
    with db.tenant(tenant) as conn:
        before = conn.exec_driver_sql(
            f"SELECT {', '.join(RUN_PINS)}, version FROM runs WHERE run_id = %s", (run.run_id,)
        ).one()
        row = conn.exec_driver_sql(
            "SELECT to_jsonb(r) FROM runs r WHERE run_id = %s", (run.run_id,)
        ).scalar_one()
    row.update(PIN_VALUES, version=before.version + 1, correlation_id="moved")
    doc = {"tenant": tenant, "mode": mode, "expected_version": before.version, "run": row}
    with db.tenant(tenant) as conn:
        conn.execute(
            text("SELECT runcontrol_apply(CAST(:doc AS jsonb))"),
            {"doc": orjson.dumps(doc).decode()},
        )
    with db.tenant(tenant) as conn:
        after = conn.exec_driver_sql(
            f"SELECT {', '.join(RUN_PINS)}, version, correlation_id FROM runs WHERE run_id = %s",
            (run.run_id,),
        ).one()
    assert tuple(after)[: len(RUN_PINS)] == tuple(before)[: len(RUN_PINS)]
    assert (after.version, after.correlation_id) == (before.version + 1, "moved")
