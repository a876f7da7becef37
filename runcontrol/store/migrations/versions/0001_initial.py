"""Initial schema, roles, row-level security and the append-only journal.

Revision ID: 0001
"""

from __future__ import annotations

from pathlib import Path

from alembic import context, op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

SCHEMA = Path(__file__).resolve().parent.parent / "0001_schema.sql"

TENANT_TABLES = (
    "runs",
    "steps",
    "attempts",
    "leases",
    "approval_requests",
    "approval_decisions",
    "cancellation_intents",
    "recovery_journal",
    "outbox",
    "inbox",
    "audit_log",
    "releases",
    "release_aliases",
    "policies",
    "budget_reservations",
)
# The application may add rows to these but never change or remove them.
APPEND_ONLY = ("recovery_journal", "audit_log", "approval_decisions", "cancellation_intents")
APP_ROLE = "runcontrol_app"
SYSTEM_ROLE = "runcontrol_system"


def _ensure_role(name: str, attributes: str, password: str | None) -> None:
    op.execute(
        f"""DO $$ BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{name}') THEN
                CREATE ROLE {name} {attributes};
            END IF;
        END $$"""
    )
    op.execute(f"ALTER ROLE {name} {attributes}")
    if password:
        escaped = password.replace("'", "''")
        op.execute(f"ALTER ROLE {name} PASSWORD '{escaped}'")


def upgrade() -> None:
    password = context.config.attributes.get("role_password")
    op.execute(SCHEMA.read_text())
    _ensure_role(APP_ROLE, "LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB", password)
    _ensure_role(SYSTEM_ROLE, "LOGIN NOSUPERUSER BYPASSRLS NOCREATEROLE NOCREATEDB", password)
    op.execute(f"GRANT USAGE ON SCHEMA public TO {APP_ROLE}, {SYSTEM_ROLE}")
    op.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {APP_ROLE}")
    op.execute(f"GRANT CONNECT ON DATABASE {_database()} TO {APP_ROLE}, {SYSTEM_ROLE}")
    for table in TENANT_TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(
            f"""CREATE POLICY tenant_isolation ON {table}
                USING (tenant_id = current_setting('runcontrol.tenant_id', true))
                WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true))"""
        )
        app_grants = "SELECT, INSERT" if table in APPEND_ONLY else "SELECT, INSERT, UPDATE"
        op.execute(f"GRANT {app_grants} ON {table} TO {APP_ROLE}")
        op.execute(f"GRANT SELECT ON {table} TO {SYSTEM_ROLE}")
    # The system path sweeps all tenants: it reads everything, marks outbox rows published and
    # prunes what retention allows. It never rewrites run state: commands go through grains.
    op.execute(f"GRANT UPDATE (published_at), DELETE ON outbox TO {SYSTEM_ROLE}")
    op.execute(f"GRANT DELETE ON inbox TO {SYSTEM_ROLE}")
    op.execute(
        """CREATE FUNCTION runcontrol_forbid_mutation() RETURNS trigger
           LANGUAGE plpgsql AS $$
           BEGIN
               IF TG_OP = 'DELETE'
                  AND current_setting('runcontrol.retention_purge', true) = 'on'
                  AND current_user = (SELECT tableowner FROM pg_tables
                                      WHERE schemaname = TG_TABLE_SCHEMA
                                        AND tablename = TG_TABLE_NAME) THEN
                   RETURN OLD;
               END IF;
               RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
                   USING ERRCODE = 'insufficient_privilege';
           END $$"""
    )
    op.execute(
        """CREATE POLICY retention_purge ON recovery_journal FOR DELETE
           USING (current_setting('runcontrol.retention_purge', true) = 'on')"""
    )
    for table in APPEND_ONLY:
        op.execute(
            f"""CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table}
                FOR EACH ROW EXECUTE FUNCTION runcontrol_forbid_mutation()"""
        )
        op.execute(
            f"""CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table}
                FOR EACH STATEMENT EXECUTE FUNCTION runcontrol_forbid_mutation()"""
        )
    # Retention is the one sanctioned removal from the journal: a function owned by the schema
    # owner, callable by the system role, that deletes only entries older than the cutoff.
    op.execute(
        """CREATE FUNCTION runcontrol_purge_journal(cutoff timestamptz) RETURNS bigint
           LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
           DECLARE removed bigint;
           BEGIN
               PERFORM set_config('runcontrol.retention_purge', 'on', true);
               DELETE FROM recovery_journal WHERE occurred_at < cutoff;
               GET DIAGNOSTICS removed = ROW_COUNT;
               PERFORM set_config('runcontrol.retention_purge', 'off', true);
               RETURN removed;
           END $$"""
    )
    op.execute("REVOKE ALL ON FUNCTION runcontrol_purge_journal(timestamptz) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION runcontrol_purge_journal(timestamptz) TO {SYSTEM_ROLE}")


def _database() -> str:
    return str(op.get_bind().exec_driver_sql("SELECT current_database()").scalar())


def downgrade() -> None:
    raise NotImplementedError("the initial schema has no downgrade")
