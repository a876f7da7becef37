"""A submission's budget reservation made by the run's own ``runcontrol_apply`` statement, and
NOTIFYs on ``runcontrol_config`` when a policy revision or a release alias changes.

The SQL is ``0007_reserve_with_run.sql`` beside ``0001_schema.sql``, whole; its header says why.

Revision ID: 0007
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

SQL = Path(__file__).resolve().parent.parent / "0007_reserve_with_run.sql"


def upgrade() -> None:
    op.execute(SQL.read_text())


def downgrade() -> None:
    raise NotImplementedError("0007 has no downgrade: restore from a backup taken before it")
