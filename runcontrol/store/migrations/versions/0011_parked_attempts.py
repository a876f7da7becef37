"""Parked attempts (an attempt waiting for a human decision holds no lease): invariant 4's
index, one non-terminal attempt per step, counts ``Parked`` as non-terminal too.

Revision ID: 0011
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP INDEX IF EXISTS uq_attempts_open_per_step")
    op.execute(
        "CREATE UNIQUE INDEX uq_attempts_open_per_step ON attempts (step_id) "
        "WHERE state IN ('Dispatched', 'Leased', 'Parked')"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS uq_attempts_open_per_step")
    op.execute(
        "CREATE UNIQUE INDEX uq_attempts_open_per_step ON attempts (step_id) "
        "WHERE state IN ('Dispatched', 'Leased')"
    )
