"""Invariant 9: every row carries tenant_id and a tenant can read or change no other tenant's
rows, enforced by PostgreSQL row-level security rather than by WHERE clauses.

Every statement here is hand-written SQL without a tenant filter, run as the app role inside
``db.tenant(A)``: whatever keeps tenant B's rows out is the database, not the query.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, MetaData, create_engine
from sqlalchemy.exc import DBAPIError
from support import drive, report

from runcontrol.domain import AttemptOutcome, StepSpec, WorkflowDefinition, errors
from runcontrol.store import APP_ROLE, SYSTEM_ROLE, rls
from runcontrol.store.tables import INSERT_ONLY_TABLES, READ_ONLY_TABLES, TENANT_TABLES, metadata

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
            report(run.grain, run.grant, AttemptOutcome.SUCCEEDED, holder="intruder")
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


# ------------------------------------------------------- every tenant table, from the schema

# The one predicate every tenant table's policy must have (pg_policies' normalised text).
TENANT_PREDICATE = "(tenant_id = current_setting('runcontrol.tenant_id'::text, true))"


def schema_tenant_tables(conn: Connection) -> list[str]:
    """Every table of the schema with a ``tenant_id`` column: what isolation must cover,
    read from the catalog, so a table added by a migration cannot be missed here."""
    return list(
        conn.exec_driver_sql(
            "SELECT c.table_name FROM information_schema.columns c"
            " JOIN information_schema.tables t USING (table_schema, table_name)"
            " WHERE c.table_schema = 'public' AND c.column_name = 'tenant_id'"
            "   AND t.table_type = 'BASE TABLE' ORDER BY c.table_name"
        ).scalars()
    )


def _value(conn: Connection, table: str, column: Any, tenant: str, checks: list[str]) -> Any:
    """A value a NOT NULL column without a default accepts: the first literal a CHECK on it
    names (a state enumeration), else one of its type."""
    name, kind = column.column_name, column.data_type
    if name == "tenant_id":
        return tenant
    for check in checks:
        if re.search(rf"\b{name}\b", check):
            literal = re.search(r"'([^']*)'::text", check)
            if literal:
                return literal.group(1)
    if kind == "uuid":
        return str(uuid.uuid4())
    if kind in ("integer", "bigint", "smallint", "numeric", "double precision", "real"):
        return 1
    if kind == "boolean":
        return False
    if kind.startswith("timestamp") or kind == "date":
        return NOW
    if kind in ("jsonb", "json"):
        return "{}"
    if kind == "bytea":
        return b"\x00"
    if kind == "ARRAY":
        return "{}"  # an empty array of any element type
    return f"{table}-{name}-{uuid.uuid4().hex[:8]}"


def synthesize_row(conn: Connection, table: str, tenant: str) -> None:
    """One row of ``table`` for ``tenant``, built from the catalog alone (foreign keys and
    triggers off: the caller's transaction has ``session_replication_role = replica``)."""
    columns = conn.exec_driver_sql(
        "SELECT column_name, data_type, is_nullable, column_default, is_identity,"
        "       is_generated FROM information_schema.columns"
        " WHERE table_schema = 'public' AND table_name = %s ORDER BY ordinal_position",
        (table,),
    ).all()
    checks = list(
        conn.exec_driver_sql(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = 'c'",
            (table,),
        ).scalars()
    )
    values = {
        c.column_name: _value(conn, table, c, tenant, checks)
        for c in columns
        if c.column_name == "tenant_id"
        or (
            c.is_nullable == "NO"
            and c.column_default is None
            and c.is_identity == "NO"
            and c.is_generated == "NEVER"
        )
    }
    names = ", ".join(values)
    marks = ", ".join(["%s"] * len(values))
    conn.exec_driver_sql(
        f"INSERT INTO {table} ({names}) VALUES ({marks})",
        tuple(json.dumps(v) if isinstance(v, list) else v for v in values.values()),
    )


def test_every_tenant_table_in_the_schema_keeps_the_tenants_apart(owner_engine, tenant):
    """Both tenants have a row in every tenant table the schema has (the fixture above leaves
    half of them empty, where "sees none" passes on nothing); scoped to tenant A, the app
    role sees none of B's and changes none. All in one transaction, rolled back: the rows
    are synthetic, and the session's other tests never see them."""
    a, b = tenant, f"{tenant}-b"
    with owner_engine.connect() as conn, conn.begin() as tx:
        tables = schema_tenant_tables(conn)
        assert set(tables) == set(TENANT_TABLES), "tables.py and the schema disagree"
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        for table in tables:
            for who in (a, b):
                synthesize_row(conn, table, who)
        conn.exec_driver_sql("SET LOCAL session_replication_role = DEFAULT")
        conn.exec_driver_sql(f"SET LOCAL ROLE {APP_ROLE}")
        conn.exec_driver_sql("SELECT set_config('runcontrol.tenant_id', %s, true)", (a,))
        for table in tables:
            seen = conn.exec_driver_sql(
                f"SELECT tenant_id, count(*) FROM {table} WHERE tenant_id IN (%s, %s)"
                " GROUP BY tenant_id",
                (a, b),
            ).all()
            assert dict(seen) == {a: 1}, (table, seen)  # its own row, none of B's
            if table in UPDATABLE:
                changed = conn.exec_driver_sql(
                    f"UPDATE {table} SET tenant_id = tenant_id WHERE tenant_id = %s", (b,)
                )
                assert changed.rowcount == 0, table
        conn.exec_driver_sql("RESET ROLE")
        for table in tables:  # B's rows are there: A saw none because of the policies
            assert (
                conn.exec_driver_sql(
                    f"SELECT count(*) FROM {table} WHERE tenant_id = %s", (b,)
                ).scalar_one()
                == 1
            ), table
        tx.rollback()


def test_every_tenant_table_has_the_tenant_policy_and_no_wider_one(owner_engine):
    """The predicate, not only a count: a ``USING (true)`` in a later migration fails here."""
    with owner_engine.connect() as conn:
        tables = schema_tenant_tables(conn)
        policies = conn.exec_driver_sql(
            "SELECT tablename, policyname, permissive, cmd, qual, with_check FROM pg_policies"
            " WHERE schemaname = 'public'"
        ).all()
    for table in tables:
        mine = [p for p in policies if p.tablename == table]
        isolation = [p for p in mine if p.policyname == "tenant_isolation"]
        assert len(isolation) == 1, (table, mine)
        (policy,) = isolation
        assert (policy.permissive, policy.cmd) == ("PERMISSIVE", "ALL"), policy
        assert policy.qual == policy.with_check == TENANT_PREDICATE, policy
        # Any other permissive policy would widen what the tenant sees (policies OR together).
        wider = [
            p
            for p in mine
            if p.permissive == "PERMISSIVE"
            and p.policyname != "tenant_isolation"
            and not (
                table in ("recovery_journal_legacy", "outbox") and p.policyname == "retention_purge"
            )
        ]
        assert not wider, (table, wider)


# ------------------------------------------------- the policies are the ones tables.py marks

Policies = set[tuple[Any, ...]]


def row_security(conn: Connection, schema: str) -> Policies:
    """Each table of ``schema`` with row-level security (on, forced) and each of its policies,
    in the catalog's normalised text."""
    tables = conn.exec_driver_sql(
        "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s"
        " AND c.relkind = 'r' AND (c.relrowsecurity OR c.relforcerowsecurity)",
        (schema,),
    ).all()
    policies = conn.exec_driver_sql(
        "SELECT tablename, policyname, permissive, array_to_string(roles, ','), cmd, qual,"
        " with_check FROM pg_policies WHERE schemaname = %s",
        (schema,),
    ).all()
    return {tuple(r) for r in tables} | {tuple(p) for p in policies}


def marked_row_security(conn: Connection, target: MetaData) -> Policies:
    """What ``target``'s tables and ``rls.statements`` make of an empty schema (rolled back)."""
    with conn.begin_nested() as nested:
        conn.exec_driver_sql("CREATE SCHEMA rls_marked")
        conn.exec_driver_sql("SET LOCAL search_path = rls_marked")
        target.create_all(conn, checkfirst=False)
        conn.exec_driver_sql(rls.statements(target))
        found = row_security(conn, "rls_marked")
        conn.exec_driver_sql("SET LOCAL search_path = public")
        nested.rollback()
    return found


def test_the_migrated_row_security_is_what_tables_py_marks(owner_engine):
    """Every policy of the migrated schema, and RLS on and forced, are those of the tables'
    marks (``tenant_table``, rendered by ``rls.statements``): a tenant table without its policy,
    or a policy on a table that is not marked, fails here."""
    with owner_engine.connect() as conn, conn.begin() as tx:
        assert marked_row_security(conn, metadata) == row_security(conn, "public")
        changed = copy.deepcopy(metadata)  # not vacuous: one mark less, one more
        changed.tables["rate_buckets"].info[rls.POLICIES] = ()
        audit = changed.tables["audit_log"].info
        audit[rls.POLICIES] = (*audit[rls.POLICIES], rls.RETENTION_PURGE)
        differ = marked_row_security(conn, changed) ^ row_security(conn, "public")
        assert {(row[0], row[1]) for row in differ} == {
            ("rate_buckets", True),  # RLS on (forced) and its tenant policy: 2 rows
            ("rate_buckets", "tenant_isolation"),
            ("audit_log", "retention_purge"),
        }
        tx.rollback()
