"""A test's migration of the kind a next release ships: a nullable column nobody writes yet
(``runs.upgrade_note``), declared to keep the code at the shipped head working.

Applied with ``Database.migrate(..., more_versions=[this folder])`` (the real machinery); the
shipped code does not know this revision, so to it the schema is a newer release's.

Revision ID: 9001
"""

from __future__ import annotations

from alembic import op

from runcontrol.store.database import MIGRATIONS
from runcontrol.store.schema import shipped_revisions

revision = "9001"
down_revision = shipped_revisions(str(MIGRATIONS))[-1]  # follows whatever the head is
branch_labels = None
depends_on = None

oldest_code = down_revision  # only adds: the release before it runs on it unchanged


def upgrade() -> None:
    op.execute("ALTER TABLE runs ADD COLUMN upgrade_note text")


def downgrade() -> None:
    op.execute("ALTER TABLE runs DROP COLUMN upgrade_note")
