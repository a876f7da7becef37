"""``runcontrol_apply`` calls per-table writers rendered from ``tables.py``, and a run's pins
never change (a trigger refuses it).

The writers are ``0014_writers.sql`` (rendered by ``make sql``, ``runcontrol/store/writers.py``);
the function that calls them is ``0014_apply_calls_writers.sql``, whose header says why. A later
migration that adds a column executes its own ``NNNN_writers.sql`` after its ``ALTER``.

Revision ID: 0014
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

HERE = Path(__file__).resolve().parent.parent
WRITERS = HERE / "0014_writers.sql"
SQL = HERE / "0014_apply_calls_writers.sql"


def upgrade() -> None:
    op.execute(WRITERS.read_text())
    op.execute(SQL.read_text())


def downgrade() -> None:
    raise NotImplementedError("0014 has no downgrade: restore from a backup taken before it")
