"""Step graphs, and steps no worker executes: ``steps.depends_on`` (the names of the steps a
step waits for, resolved at acceptance; NULL on a row stored before it: the step before),
``steps.kind`` (``agent``; ``wait`` or ``signal``: a timer or a signal settles it),
``steps.wait`` (what it waits for), ``steps.due_at`` (when the timer fires or the signal times
out), ``steps.signal`` (a signal step's signal once received, kept until the step waits), and
the steps' writer that writes them (``0016_writers.sql``, rendered by ``make sql``).

Revision ID: 0016
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

HERE = Path(__file__).resolve().parent.parent
WRITERS = HERE / "0016_writers.sql"


def upgrade() -> None:
    op.execute(
        "ALTER TABLE steps ADD COLUMN depends_on jsonb,"
        " ADD COLUMN kind text NOT NULL DEFAULT 'agent',"
        " ADD COLUMN wait jsonb,"
        " ADD COLUMN due_at timestamptz,"
        " ADD COLUMN signal jsonb"
    )
    op.execute(WRITERS.read_text())


def downgrade() -> None:
    raise NotImplementedError("0016 has no downgrade: restore from a backup taken before it")
