"""The engine's commits (issue 33): a group commit applies each document by one function
(``runcontrol_apply_document``, the chain 0026 -> 0014 restated once) and appends the
documents' outbox, journal, answer, result and audit rows in one INSERT per table and tenant
(``runcontrol_apply_many``, ``0029_group_apply.sql``; the writers ``runcontrol_append_<table>``
rendered by ``make sql`` into ``0029_writers.sql``). The output writer (0022's
``runcontrol_append_output``, restated) NOTIFYs only while a listener has registered.

Revision ID: 0029
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

# The documents are unchanged and apply as before: the previous release runs on it.
oldest_code = "0026"

HERE = Path(__file__).resolve().parent.parent
STEPS = ("0029_writers.sql", "0029_group_apply.sql")


def upgrade() -> None:
    for name in STEPS:
        op.execute((HERE / name).read_text())


def downgrade() -> None:
    raise NotImplementedError("0029 has no downgrade: restore from a backup taken before it")
