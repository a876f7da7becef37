"""Migrations: re-running them is harmless, the migrated schema is what tables.py says, and the
baseline (0029, the squashed 0001..0029) applies every SQL function by name.

The Alembic migrations are the authority on the schema; ``runcontrol/store/tables.py`` is what
the code queries with. ``alembic.autogenerate.compare_metadata`` diffs the two: tables, columns,
types, nullability, unique constraints, indexes and foreign keys. It does not compare the
predicates of partial indexes, so a second check pins which indexes are partial.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Integer, create_engine

from runcontrol.store import Database, functions
from runcontrol.store.database import MIGRATIONS
from runcontrol.store.functions import revisions
from runcontrol.store.tables import metadata

CATALOG = {
    "policies": "SELECT count(*) FROM pg_policy",
    "triggers": "SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal",
    "roles": "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'runcontrol%%'",
    "tables": "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
    "functions": "SELECT count(*) FROM pg_proc WHERE proname LIKE 'runcontrol%%'",
}


def head_revision() -> str:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


def diff(owner_engine, target=metadata) -> list[object]:
    # SQLAlchemy reflects a NOT VALID check (0025) with an option it then cannot validate.
    with warnings.catch_warnings(), owner_engine.connect() as conn:
        warnings.filterwarnings("ignore", "Can't validate argument 'dialect_options'")
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, target))


def test_migrate_twice_is_a_no_op(db, owner_url, owner_engine, make_leased_run, tenant):
    run = make_leased_run(tenant)

    def catalog() -> dict[str, int]:
        with owner_engine.connect() as conn:
            return {k: conn.exec_driver_sql(sql).scalar_one() for k, sql in CATALOG.items()}

    before = catalog()
    db.migrate()
    other = Database(owner_url)  # a second process starting against the same database
    try:
        other.migrate()
    finally:
        other.dispose()
    assert catalog() == before
    with owner_engine.connect() as conn:
        versions = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars()
        assert list(versions) == [head_revision()]
    with db.tenant(tenant) as conn:  # data and grants survive
        state = conn.exec_driver_sql(
            "SELECT state FROM runs WHERE run_id = %s", (run.run_id,)
        ).scalar_one()
    assert state == "Running"


def test_migrated_schema_matches_table_metadata(owner_engine):
    # Nothing needed filtering: the schema SQL names every constraint and index the metadata
    # names, and compare_metadata already skips alembic's own version table.
    assert diff(owner_engine) == []


def test_metadata_comparison_is_not_vacuous(owner_engine):
    changed = copy.deepcopy(metadata)
    changed.tables["runs"].append_column(Column("not_in_the_database", Integer))
    found = diff(owner_engine, changed)
    assert [(d[0], d[3].name) for d in found if isinstance(d, tuple)] == [
        ("add_column", "not_in_the_database")
    ]


def test_partial_indexes_match_metadata(owner_engine):
    declared = {
        index.name: index.unique
        for table in metadata.tables.values()
        for index in table.indexes
        if index.dialect_options["postgresql"]["where"] is not None
    }
    with owner_engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT i.relname, x.indisunique FROM pg_index x"
            " JOIN pg_class i ON i.oid = x.indexrelid"
            " JOIN pg_namespace n ON n.oid = i.relnamespace"
            " WHERE n.nspname = 'public' AND x.indpred IS NOT NULL"
        ).all()
    assert {r.relname: r.indisunique for r in rows} == declared
    assert declared["uq_attempts_open_per_step"] and declared["uq_leases_current_per_attempt"]


def test_the_baseline_is_the_root_and_applies_every_function_by_name():
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    scripts = ScriptDirectory.from_config(cfg)
    assert scripts.get_bases() == ["0029"] == revisions()[:1]
    baseline = scripts.get_revision("0029").module
    later = [s for s in scripts.walk_revisions() if s.revision != "0029"]
    # a function added later: named by a revision of its own; one removed: dropped by one
    added = {name for s in later for name in getattr(s.module, "FUNCTIONS", {})}
    assert set(functions.current()) <= set(baseline.FUNCTIONS) | added
    for gone in set(baseline.FUNCTIONS) - set(functions.current()):
        assert any(f"DROP FUNCTION IF EXISTS {gone}(" in Path(s.path).read_text() for s in later)


APPLY_ACL = (
    "SELECT has_function_privilege('runcontrol_app', 'runcontrol_apply(jsonb)', 'EXECUTE'),"
    " has_function_privilege('runcontrol_system', 'runcontrol_apply(jsonb)', 'EXECUTE')"
)


def test_the_baseline_runs_documents_and_grants_the_write_function_to_the_app_role(fresh_url):
    database = Database(fresh_url)
    engine = create_engine(fresh_url)
    try:
        database.migrate("0029")
        with engine.connect() as conn:
            assert conn.exec_driver_sql(APPLY_ACL).one() == (True, False)
            conn.exec_driver_sql('SELECT runcontrol_apply(\'{"tenant": "t"}\'::jsonb)')
    finally:
        engine.dispose()
        database.dispose()
