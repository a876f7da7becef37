"""Operator controls: ``runs.suspended_at`` (a suspended run dispatches and leases nothing new)
and ``runs.rerun_of`` (the finished run a rerun repeats), and ``runcontrol_apply`` restated
whole to write both.

The SQL is ``0012_operator_controls.sql`` beside ``0001_schema.sql``, whole; its header says why.

Revision ID: 0012
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

SQL = Path(__file__).resolve().parent.parent / "0012_operator_controls.sql"


def upgrade() -> None:
    op.execute(SQL.read_text())


def downgrade() -> None:
    raise NotImplementedError("0012 has no downgrade: restore from a backup taken before it")
