"""Streamed output (issue 30): ``output_chunks`` (insert-only, row-level security), the runs'
``output_heads`` and ``runcontrol_append_output``, the holders' fenced insert
(``0022_output.sql``).

Revision ID: 0022
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

# Only adds (two tables and a function nobody else calls): code that ran on 0020 runs on it
# unchanged, so the marker stays where 0018 put it.
oldest_code = "0018"

HERE = Path(__file__).resolve().parent.parent


def upgrade() -> None:
    op.execute((HERE / "0022_output.sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("0022 has no downgrade: restore from a backup taken before it")
