"""Journaled calls (issue 30): the ``journaled_calls`` table (insert-only, row-level
security; one value per run, step, name and occurrence), ``tool_calls.result_json`` (a
completion's result, so a repeat claim gets it back), their writers (``0021_writers.sql``,
rendered by ``make sql``) and ``runcontrol_apply`` writing the document's calls after 0017's
clauses, which it calls, not restates (``0021_apply_writes_calls.sql``).

Revision ID: 0021
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

# Only adds: a new table, a nullable column the previous release's documents leave out (its
# writer stores NULL then), and an apply that takes every document the previous one did.
oldest_code = "0020"

HERE = Path(__file__).resolve().parent.parent
STEPS = ("0021_journaled_calls.sql", "0021_writers.sql", "0021_apply_writes_calls.sql")


def upgrade() -> None:
    for name in STEPS:
        op.execute((HERE / name).read_text())


def downgrade() -> None:
    raise NotImplementedError("0021 has no downgrade: restore from a backup taken before it")
