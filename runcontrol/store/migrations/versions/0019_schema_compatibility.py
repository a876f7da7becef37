"""The schema's compatibility marker (issue 23, rolling upgrades): ``alembic_version.oldest_code``,
the oldest code revision that may run on the schema, which ``Database.migrate`` writes in the
transaction that moves the revision (``runcontrol/store/schema.py``). From here on a migration
declares ``oldest_code``; without it, it keeps no older code working.

Revision ID: 0019
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# Only a column on alembic's own table: 0016's code would run on it unchanged (0016's code
# itself refuses any revision but its own; the processes already running go on).
oldest_code = "0016"


def upgrade() -> None:
    op.execute("ALTER TABLE alembic_version ADD COLUMN oldest_code text")


def downgrade() -> None:
    raise NotImplementedError("0019 has no downgrade: restore from a backup taken before it")
