"""Functions changed since 0029: runcontrol_apply_document, applied by name as
``runcontrol/store/sql/`` and ``store/writers.py`` make them today (written by ``make sql``).
Its comments say what its clauses' order is for, instead of the migrations that added them.

Revision ID: 0030
"""

from __future__ import annotations

from runcontrol.store.functions import apply

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

# Comments only: the previous release's documents apply as before.
oldest_code = "0029"

FUNCTIONS = {
    "runcontrol_apply_document": "b1fdc7d12113f7e3c5e5b0d9bcc9336e",
}


def upgrade() -> None:
    apply(FUNCTIONS)


def downgrade() -> None:
    raise NotImplementedError("0030 has no downgrade: restore from a backup taken before it")
