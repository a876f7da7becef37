"""Results: ``attempt_results`` (insert-only, row-level security), the run's result hash and
size on ``runs``, and ``runcontrol_apply`` writing the document's results after 0014's
clauses (which it calls, not restates).

The SQL: ``0015_attempt_results.sql`` (the table and columns), then the writers ``make sql``
rendered for them (``0015_writers.sql``), then ``0015_apply_writes_results.sql`` (which calls
one of those writers).

Revision ID: 0015
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

HERE = Path(__file__).resolve().parent.parent
STEPS = ("0015_attempt_results.sql", "0015_writers.sql", "0015_apply_writes_results.sql")


def upgrade() -> None:
    for name in STEPS:
        op.execute((HERE / name).read_text())


def downgrade() -> None:
    raise NotImplementedError("0015 has no downgrade: restore from a backup taken before it")
