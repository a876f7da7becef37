"""Ordered progress (``attempts.progress_seq``) and at-most-once tool calls (``tool_calls``,
with row-level security), and ``runcontrol_apply`` restated whole to write both.

The SQL is ``0009_progress_and_tool_calls.sql`` beside ``0001_schema.sql``, whole; its header
says why.

Revision ID: 0009
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

SQL = Path(__file__).resolve().parent.parent / "0009_progress_and_tool_calls.sql"


def upgrade() -> None:
    op.execute(SQL.read_text())


def downgrade() -> None:
    raise NotImplementedError("0009 has no downgrade: restore from a backup taken before it")
