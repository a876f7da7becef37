"""Claims answered again: an index on the stored answers of ``AcquireLease`` by command id.

A worker's claim carries a claim id it makes once and resends until answered; the lease the
claim granted is stored as the ``AcquireLease`` answer under that id (for whichever run the
claim found), so a resend after a lost answer looks it up by id alone, across runs, and gets
the same lease back instead of leaving it to expire unworked (docs/reliability.md, finding 4).

Revision ID: 0013
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX ix_command_answers_claims ON command_answers (command_id)"
        " WHERE command = 'AcquireLease'"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_command_answers_claims")
