"""An index on the attempts each holder has leased, so a claim can offer a holder the attempt
it already holds first (a claim retried after its answer was lost gets it back) without
scanning every attempt ever made.

Revision ID: 0011
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX ix_attempts_leased_holder ON attempts (holder) WHERE state = 'Leased'")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_attempts_leased_holder")
