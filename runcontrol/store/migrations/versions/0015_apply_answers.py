"""``runcontrol_apply`` stores several answers per document (``answers``): fused grants.

The SQL is ``0015_apply_answers.sql``, whose header says why the function is restated.

Revision ID: 0015
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

SQL = Path(__file__).resolve().parent.parent / "0015_apply_answers.sql"


def upgrade() -> None:
    op.execute(SQL.read_text())


def downgrade() -> None:
    raise NotImplementedError("0015 has no downgrade: restore from a backup taken before it")
