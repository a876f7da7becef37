"""Step graphs: ``steps.depends_on`` (the names of the steps a step waits for, resolved at
acceptance; NULL on a row stored before it: the step before), and the steps' writer that
writes it (``0016_writers.sql``, rendered by ``make sql``).

Revision ID: 0016
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0016"
# 0015 (results, another branch) is not on main yet: whichever lands second points its
# down_revision at the other.
down_revision = "0014"
branch_labels = None
depends_on = None

HERE = Path(__file__).resolve().parent.parent
WRITERS = HERE / "0016_writers.sql"


def upgrade() -> None:
    op.execute("ALTER TABLE steps ADD COLUMN depends_on jsonb")
    op.execute(WRITERS.read_text())


def downgrade() -> None:
    raise NotImplementedError("0016 has no downgrade: restore from a backup taken before it")
