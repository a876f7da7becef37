"""Rate limits (issue 21 item 2): ``steps.rate_limits`` (the buckets a step's dispatch draws
on, fixed at acceptance from the pinned policy revision and the release), ``steps.held`` (why
a Pending step waits, and the reservation its dispatch uses), the ``rate_buckets`` table (row-
level security) and the functions that reserve and consume units (``0018_rate_limits.sql``),
then the steps' writer that writes the new columns (``0018_writers.sql``, rendered by
``make sql``).

Revision ID: 0018
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# 0017's code would dispatch a rate-limited step without its reservation: code from 0018 on.
oldest_code = "0018"

HERE = Path(__file__).resolve().parent.parent
STEPS = ("0018_rate_limits.sql", "0018_writers.sql")


def upgrade() -> None:
    for name in STEPS:
        op.execute((HERE / name).read_text())


def downgrade() -> None:
    raise NotImplementedError("0018 has no downgrade: restore from a backup taken before it")
