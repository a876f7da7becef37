"""Flow control, part 1 (issue 21): ``runs.priority`` and ``runs.flow`` (the run's
workflow-wide concurrency keys, pinned), ``steps.flow`` and ``steps.held``, the tables
``flow_slots`` and ``flow_waiters``, the admission and queueing functions
``runcontrol_apply`` calls for documents that carry slots, and the triggers that free a slot
in the transaction making its holder terminal (``0017_flow_control.sql``), then the writers
``make sql`` rendered for the new columns (``0017_writers.sql``).

Revision ID: 0017
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# 0016's code would dispatch a held step without its slots (it reads neither steps.held nor
# the waiters): code from 0017 on only (an upgrade to it stops the old hosts first).
oldest_code = "0017"

HERE = Path(__file__).resolve().parent.parent
STEPS = ("0017_flow_control.sql", "0017_writers.sql")


def upgrade() -> None:
    for name in STEPS:
        op.execute((HERE / name).read_text())


def downgrade() -> None:
    raise NotImplementedError("0017 has no downgrade: restore from a backup taken before it")
