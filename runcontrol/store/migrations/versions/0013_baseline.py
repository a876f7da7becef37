"""The baseline: the schema migrations 0001..0013 built, squashed into one (pre-release).

The roles come first (their password from the configuration, ``RUNCONTROL_APP_ROLE_PASSWORD``),
then ``0013_baseline.sql`` beside ``0014_writers.sql``, whole; its header says what it holds.
It keeps revision id 0013, so a database already at 0013 or later upgrades on as before; one at
an older revision is not upgraded (docs/operations.md).

Revision ID: 0013
"""

from __future__ import annotations

from pathlib import Path

from alembic import context, op

revision = "0013"
down_revision = None
branch_labels = None
depends_on = None

SQL = Path(__file__).resolve().parent.parent / "0013_baseline.sql"
ROLES = {
    "runcontrol_app": "LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB",
    "runcontrol_system": "LOGIN NOSUPERUSER BYPASSRLS NOCREATEROLE NOCREATEDB",
}


def _ensure_role(name: str, attributes: str, password: str | None) -> None:
    # Roles are cluster-wide: a second database on the same server finds them made.
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
    for name, attributes in ROLES.items():
        _ensure_role(name, attributes, password)
    database = op.get_bind().exec_driver_sql("SELECT current_database()").scalar()
    op.execute(f"GRANT CONNECT ON DATABASE {database} TO {', '.join(ROLES)}")
    op.execute(SQL.read_text())


def downgrade() -> None:
    raise NotImplementedError("the baseline has no downgrade")
