"""Functions changed since 0034: runcontrol_apply_document, applied by name as
``runcontrol/store/sql/`` and ``store/writers.py`` make them today (written by ``make sql``).
It now calls the shard fence (0034) first and then refuses journal entries without their event
(0033): each revision recorded the function with only its own change.

Revision ID: 0035
"""

from __future__ import annotations

from runcontrol.store.functions import apply

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None

# The previous release's documents apply as in 0033 and 0034 (each kept 0032's working).
oldest_code = "0032"

FUNCTIONS = {
    "runcontrol_apply_document": "e556c892ede48c1b04e5115644316fae",
}


def upgrade() -> None:
    apply(FUNCTIONS)


def downgrade() -> None:
    raise NotImplementedError("0035 has no downgrade: restore from a backup taken before it")
