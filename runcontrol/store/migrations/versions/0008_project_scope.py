"""Project scope in the database: a restrictive row-level security policy on the tables that
carry ``project_id`` (runs, outbox), for the app role's reads.

A transaction that sets ``runcontrol.project_id`` (``Database.tenant(..., project_id=...)``,
which the HTTP edge does for every caller whose roles stop at its project) sees only that
project's runs and events, whatever its statement's WHERE clause says. Left unset (the write
path, tenant-wide roles) it restricts nothing: the tenant policy of 0001 still applies. Only
SELECT is restricted, so no write ever depends on it.

Revision ID: 0008
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

PROJECT_TABLES = ("runs", "outbox")


def upgrade() -> None:
    for table in PROJECT_TABLES:
        op.execute(
            f"""CREATE POLICY project_scope ON {table} AS RESTRICTIVE FOR SELECT
                TO runcontrol_app
                USING (coalesce(current_setting('runcontrol.project_id', true), '')
                       IN ('', project_id))"""
        )


def downgrade() -> None:
    for table in PROJECT_TABLES:
        op.execute(f"DROP POLICY IF EXISTS project_scope ON {table}")
