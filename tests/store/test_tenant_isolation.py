"""Invariant 9: every row carries tenant_id and a tenant can read or change no other tenant's
rows, enforced by PostgreSQL row-level security rather than by WHERE clauses.

Every statement here is hand-written SQL without a tenant filter, run as the app role inside
``db.tenant(A)``: whatever keeps tenant B's rows out is the database, not the query.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import DBAPIError
from support import drive

from runcontrol.commands import ReportOutcome
from runcontrol.domain import AttemptOutcome, StepSpec, WorkflowDefinition, errors
from runcontrol.store import APP_ROLE, SYSTEM_ROLE
from runcontrol.store.tables import INSERT_ONLY_TABLES, READ_ONLY_TABLES, TENANT_TABLES

INSUFFICIENT_PRIVILEGE = "42501"
UPDATABLE = tuple(
    t for t in TENANT_TABLES if t not in INSERT_ONLY_TABLES and t not in READ_ONLY_TABLES
)
NOW = datetime(2026, 1, 1, tzinfo=UTC)
# Tables in which the two_tenants fixture gives tenant B rows.
POPULATED = (
    "runs",
    "steps",
    "attempts",
    "leases",
    "outbox",
    "releases",
    "release_aliases",
    "budget_reservations",
)


def sqlstate(exc: pytest.ExceptionInfo[DBAPIError]) -> str | None:
    return getattr(exc.value.orig, "sqlstate", None)


@pytest.fixture
def two_tenants(container, tenant, make_leased_run):
    """Tenant A and tenant B, each with a leased run (runs, steps, attempts, leases, outbox,
    journal, releases, aliases, budget reservations) and an audit record."""
    a = make_leased_run(tenant)
    b = make_leased_run(f"{tenant}-b")
    for run in (a, b):  # a refused report leaves an audit_log row in the run's tenant
        with pytest.raises(errors.LeaseNotHeld):
            run.grain.execute(
                ReportOutcome(
                    tenant_id=run.grain.tenant_id,
                    run_id=run.grain.run_id,
                    attempt_id=run.attempt_id,
                    holder="intruder",
                    fencing_token=run.grant.fencing_token,
                    outcome=AttemptOutcome.SUCCEEDED,
                )
            )
    return a, b


def test_tenant_sees_none_of_another_tenants_rows_in_any_table(db, two_tenants):
    a, b = two_tenants
    with db.tenant(a.tenant) as conn:
        for table in TENANT_TABLES:
            tenants = set(conn.exec_driver_sql(f"SELECT DISTINCT tenant_id FROM {table}").scalars())
            assert tenants <= {a.tenant}, table
        assert (
            conn.exec_driver_sql(
                "SELECT count(*) FROM runs WHERE run_id = %s", (b.run_id,)
            ).scalar_one()
            == 0
        )
        for table in ("steps", "attempts", "leases", "outbox", "recovery_journal", "audit_log"):
            count = conn.exec_driver_sql(
                f"SELECT count(*) FROM {table} WHERE run_id = %s", (b.run_id,)
            ).scalar_one()
            assert count == 0, table
        own = conn.exec_driver_sql(
            "SELECT count(*) FROM outbox WHERE run_id = %s", (a.run_id,)
        ).scalar_one()
        assert own > 0
    # The system role (BYPASSRLS) sweeps all tenants and sees both.
    with db.system_tx() as conn:
        seen = conn.exec_driver_sql(
            "SELECT DISTINCT tenant_id FROM runs WHERE run_id IN (%s, %s)", (a.run_id, b.run_id)
        ).scalars()
        assert set(seen) == {a.tenant, b.tenant}
        for table in ("steps", "attempts", "leases", "outbox", "recovery_journal", "audit_log"):
            count = conn.exec_driver_sql(
                f"SELECT count(DISTINCT tenant_id) FROM {table} WHERE run_id IN (%s, %s)",
                (a.run_id, b.run_id),
            ).scalar_one()
            assert count == 2, table


@pytest.mark.parametrize("table", UPDATABLE)
def test_update_of_another_tenants_rows_affects_none(db, two_tenants, table):
    a, b = two_tenants
    with db.system_tx() as conn:
        theirs = conn.exec_driver_sql(
            f"SELECT count(*) FROM {table} WHERE tenant_id = %s", (b.tenant,)
        ).scalar_one()
    with db.tenant(a.tenant) as conn:
        result = conn.exec_driver_sql(
            f"UPDATE {table} SET tenant_id = tenant_id WHERE tenant_id = %s", (b.tenant,)
        )
        assert result.rowcount == 0
    if table in POPULATED:
        assert theirs > 0
    with db.system_tx() as conn:  # and tenant B's rows are all still there
        assert (
            conn.exec_driver_sql(
                f"SELECT count(*) FROM {table} WHERE tenant_id = %s", (b.tenant,)
            ).scalar_one()
            == theirs
        )
    if table == "runs":
        with db.tenant(a.tenant) as conn:
            result = conn.exec_driver_sql(
                "UPDATE runs SET state = 'Failed' WHERE run_id = %s", (b.run_id,)
            )
            assert result.rowcount == 0
        with db.system_tx() as conn:
            state = conn.exec_driver_sql(
                "SELECT state FROM runs WHERE run_id = %s", (b.run_id,)
            ).scalar_one()
            assert state == "Running"


def test_app_role_cannot_delete_and_rls_filters_delete_for_a_role_that_could(
    db, owner_engine, two_tenants
):
    a, b = two_tenants
    # The app role has no DELETE privilege at all, on its own rows or anyone else's.
    for run_id in (a.run_id, b.run_id):
        with pytest.raises(DBAPIError) as exc, db.tenant(a.tenant) as conn:
            conn.exec_driver_sql("DELETE FROM leases WHERE run_id = %s", (run_id,))
        assert sqlstate(exc) == INSUFFICIENT_PRIVILEGE
    # A role that may DELETE but is subject to RLS (created and dropped in one rolled-back
    # transaction) deletes nothing of tenant B's while scoped to tenant A.
    with owner_engine.connect() as conn, conn.begin() as tx:
        conn.exec_driver_sql("CREATE ROLE rc_probe_deleter NOLOGIN NOBYPASSRLS")
        conn.exec_driver_sql("GRANT SELECT, DELETE ON leases TO rc_probe_deleter")
        conn.exec_driver_sql("SET LOCAL ROLE rc_probe_deleter")
        conn.exec_driver_sql("SELECT set_config('runcontrol.tenant_id', %s, true)", (a.tenant,))
        gone = conn.exec_driver_sql("DELETE FROM leases WHERE run_id = %s", (b.run_id,))
        assert gone.rowcount == 0
        tx.rollback()
    with db.system_tx() as conn:
        assert (
            conn.exec_driver_sql(
                "SELECT count(*) FROM leases WHERE run_id = %s", (b.run_id,)
            ).scalar_one()
            == 1
        )


def test_insert_or_move_into_another_tenant_is_rejected_by_with_check(db, two_tenants):
    a, b = two_tenants
    with pytest.raises(DBAPIError) as exc, db.tenant(a.tenant) as conn:
        conn.exec_driver_sql(
            "INSERT INTO audit_log (tenant_id, run_id, kind, actor, detail, occurred_at)"
            " VALUES (%s, %s, 'forged', 'mallory', '{}', now())",
            (b.tenant, b.run_id),
        )
    assert sqlstate(exc) == INSUFFICIENT_PRIVILEGE
    assert "row-level security" in str(exc.value)

    with pytest.raises(DBAPIError) as exc, db.tenant(a.tenant) as conn:
        conn.exec_driver_sql(
            "UPDATE runs SET tenant_id = %s WHERE run_id = %s", (b.tenant, a.run_id)
        )
    assert sqlstate(exc) == INSUFFICIENT_PRIVILEGE

    with db.system_tx() as conn:
        forged = conn.exec_driver_sql(
            "SELECT count(*) FROM audit_log WHERE kind = 'forged' AND run_id = %s", (b.run_id,)
        ).scalar_one()
        owner_of_a = conn.exec_driver_sql(
            "SELECT tenant_id FROM runs WHERE run_id = %s", (a.run_id,)
        ).scalar_one()
    assert (forged, owner_of_a) == (0, a.tenant)


def test_without_a_tenant_nothing_is_visible_or_insertable(db, two_tenants):
    a, _ = two_tenants
    # A pooled connection (the setting was set transaction-locally before and reverted to '')
    # and a brand-new session (the setting was never defined: NULL) behave alike.
    fresh = create_engine(db.app_url, poolclass=None)
    try:
        for engine in (db.app, fresh):
            with engine.connect() as conn:
                for table in TENANT_TABLES:
                    count = conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()
                    assert count == 0, table
                conn.rollback()
            with pytest.raises(DBAPIError) as exc, engine.begin() as conn:
                conn.exec_driver_sql(
                    "INSERT INTO command_answers"
                    " (tenant_id, run_id, command_id, command, answer, created_at)"
                    " VALUES (%s, %s, 'c', 'CancelRun', '{}', now())",
                    (a.tenant, uuid.uuid4()),
                )
            assert sqlstate(exc) == INSUFFICIENT_PRIVILEGE
    finally:
        fresh.dispose()


def test_app_role_cannot_switch_row_security_off_to_read_other_tenants(db, two_tenants):
    a, b = two_tenants
    # row_security = off may be SET, but for a role subject to RLS it does not bypass the
    # policies: a query they would filter raises instead of returning other tenants' rows.
    with pytest.raises(DBAPIError) as exc, db.tenant(a.tenant) as conn:
        conn.exec_driver_sql("SET row_security = off")
        conn.exec_driver_sql("SELECT count(*) FROM runs WHERE run_id = %s", (b.run_id,))
    assert sqlstate(exc) == INSUFFICIENT_PRIVILEGE
    assert "row-level security" in str(exc.value)


@pytest.mark.parametrize(
    "escape",
    [
        f"SET ROLE {SYSTEM_ROLE}",
        "ALTER TABLE runs DISABLE ROW LEVEL SECURITY",
        "ALTER TABLE runs NO FORCE ROW LEVEL SECURITY",
        "DROP POLICY tenant_isolation ON runs",
        "SELECT runcontrol_purge_journal(now())",
    ],
)
def test_app_role_cannot_escape_rls_by_other_means(db, tenant, escape):
    with pytest.raises(DBAPIError) as exc, db.tenant(tenant) as conn:
        conn.exec_driver_sql(escape)
    assert sqlstate(exc) == INSUFFICIENT_PRIVILEGE, exc.value


def test_roles_and_tables_are_configured_for_rls(db, owner_engine):
    with owner_engine.connect() as conn:
        roles = {
            r.rolname: r
            for r in conn.exec_driver_sql(
                "SELECT rolname, rolsuper, rolbypassrls, rolcreaterole, rolcreatedb"
                " FROM pg_roles WHERE rolname IN (%s, %s)",
                (APP_ROLE, SYSTEM_ROLE),
            )
        }
        tables = {
            r.relname: r
            for r in conn.exec_driver_sql(
                "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,"
                "       pg_get_userbyid(c.relowner) AS owner,"
                "       (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid) AS policies"
                " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'public' AND c.relkind = 'r'"
            )
        }
    app, system = roles[APP_ROLE], roles[SYSTEM_ROLE]
    assert (app.rolsuper, app.rolbypassrls, app.rolcreaterole, app.rolcreatedb) == (
        False,
        False,
        False,
        False,
    )
    assert (system.rolsuper, system.rolbypassrls) == (False, True)
    for name in TENANT_TABLES:
        t = tables[name]
        assert t.relrowsecurity and t.relforcerowsecurity, name
        assert t.policies >= 1, name
        assert t.owner not in (APP_ROLE, SYSTEM_ROLE), name


def test_identical_releases_of_two_tenants_stay_separate(container, tenant):
    """Regression: release ids were derived from the content alone, so a second tenant
    publishing the same definition collided with the first tenant's (invisible) row."""
    other = f"{tenant}-b"
    definition = WorkflowDefinition("shared-wf", (StepSpec("s", "agent-a"),))
    mine = container.releases.publish(tenant, definition, "p", NOW)
    theirs = container.releases.publish(other, definition, "p", NOW)
    assert mine.content_hash == theirs.content_hash
    assert mine.release_id != theirs.release_id
    assert container.releases.publish(tenant, definition, "p", NOW) == mine  # idempotent
    resolve = container.releases.resolve
    assert drive(resolve(tenant, "shared-wf", alias="latest", release_id=None)) == mine
    assert drive(resolve(other, "shared-wf", alias="latest", release_id=None)) == theirs
    with pytest.raises(errors.ReleaseNotFound):
        drive(resolve(tenant, "shared-wf", alias=None, release_id=theirs.release_id))
