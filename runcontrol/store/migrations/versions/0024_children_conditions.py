"""Child runs, conditions, results of steps no worker executes (issue 32): ``runs.
parent_run_id``, ``parent_step_id`` and ``depth`` (pinned: the run and step that started a
child run, and how deep it is; an index for a parent's children), and ``steps.condition``
(the release's ``when``), ``steps.result_json`` (a signal's body, a wait's end, a child run's
result) and ``steps.child`` (a run step's current child). Then the writers that write them
(``0024_writers.sql``, rendered by ``make sql``).

Revision ID: 0024
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0024"
down_revision = "0025"
branch_labels = None
depends_on = None

# Only adds nullable columns (and ``depth`` with a default): the previous release's documents
# leave them out and its reads ignore them.
oldest_code = "0020"

HERE = Path(__file__).resolve().parent.parent

SQL = """
ALTER TABLE runs
    ADD COLUMN parent_run_id UUID,
    ADD COLUMN parent_step_id UUID,
    ADD COLUMN depth INTEGER NOT NULL DEFAULT 0;
CREATE INDEX ix_runs_parent ON runs (tenant_id, parent_run_id, created_at)
    WHERE parent_run_id IS NOT NULL;
ALTER TABLE steps
    ADD COLUMN condition TEXT,
    ADD COLUMN result_json TEXT,
    ADD COLUMN child JSONB;
"""


def upgrade() -> None:
    op.execute(SQL)
    op.execute((HERE / "0024_writers.sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("0024 has no downgrade: restore from a backup taken before it")
