"""Exactly-once effect per command id (``command_answers``), ``runcontrol_apply`` restated
whole with the answer insert and without test hooks, and the unused ``inbox`` dropped.

The SQL is ``0006_command_answers.sql`` beside ``0001_schema.sql``, whole; its header says why.

Revision ID: 0006
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

SQL = Path(__file__).resolve().parent.parent / "0006_command_answers.sql"


def upgrade() -> None:
    op.execute(SQL.read_text())


def downgrade() -> None:
    raise NotImplementedError("0006 has no downgrade: restore from a backup taken before it")
