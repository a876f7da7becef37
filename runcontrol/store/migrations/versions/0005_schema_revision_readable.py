"""The service roles may read the schema revision (``alembic_version``).

Processes that do not migrate (run hosts, the scheduler) check at start that the database is at
the revision their code needs (``Database.require_current_schema``), and refuse to run on an
older one: code that writes a document an older ``runcontrol_apply`` ignores part of would lose
that part silently (0004's budget release, for one).

Revision ID: 0005
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

ROLES = "runcontrol_app, runcontrol_system"


def upgrade() -> None:
    op.execute(f"GRANT SELECT ON alembic_version TO {ROLES}")


def downgrade() -> None:
    op.execute(f"REVOKE SELECT ON alembic_version FROM {ROLES}")
