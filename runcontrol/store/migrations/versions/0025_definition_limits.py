"""What a definition may hold, at the database too (issue 34): a workflow's id and an alias
are at most the lengths ``runcontrol.domain.limits`` states (``MAX_WORKFLOW_ID``,
``MAX_NAME``), the bounds publication checks; ``store/tables.py`` declares the same checks
from the same constants and ``tests/store/test_definition_limits.py`` compares them with the
database's. ``NOT VALID``: rows stored before are not rescanned (a release beyond them could
never run; it stays readable).

Revision ID: 0025
"""

from __future__ import annotations

from alembic import op

revision = "0025"
down_revision = "0022"
branch_labels = None
depends_on = None

# Only checks on publication's rows: the previous release runs on it unchanged, except that
# publishing an id beyond the limits (one its own submissions could not name) now fails.
oldest_code = "0016"

SQL = """
ALTER TABLE releases ADD CONSTRAINT ck_releases_workflow_id
    CHECK (char_length(workflow_id) BETWEEN 1 AND 183) NOT VALID;
ALTER TABLE release_aliases ADD CONSTRAINT ck_release_aliases_workflow_id
    CHECK (char_length(workflow_id) BETWEEN 1 AND 183) NOT VALID;
ALTER TABLE release_aliases ADD CONSTRAINT ck_release_aliases_alias
    CHECK (char_length(alias) BETWEEN 1 AND 200) NOT VALID;
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    op.execute(
        "ALTER TABLE releases DROP CONSTRAINT ck_releases_workflow_id;"
        " ALTER TABLE release_aliases DROP CONSTRAINT ck_release_aliases_workflow_id;"
        " ALTER TABLE release_aliases DROP CONSTRAINT ck_release_aliases_alias;"
    )
