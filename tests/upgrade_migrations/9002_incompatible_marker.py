"""A test's migration that keeps no older code working: it declares no ``oldest_code``, so the
marker becomes its own revision and every release before it refuses the schema. (What it
changes is harmless; a real one would drop or tighten what the older release writes.)

Revision ID: 9002
"""

from __future__ import annotations

from alembic import op

revision = "9002"
down_revision = "9001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("COMMENT ON COLUMN runs.upgrade_note IS 'written by 9002 code only'")


def downgrade() -> None:
    op.execute("COMMENT ON COLUMN runs.upgrade_note IS NULL")
