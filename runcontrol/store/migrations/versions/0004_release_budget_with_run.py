"""A terminal run's embedded budget reservation is released by the run's own statement.

``runcontrol_apply`` (0002) gains one clause: ``doc->>'release_budget'`` (a timestamp) marks the
run's open reservation released, inside the same statement as the transition that made the run
terminal. The release was a second transaction after the commit, with its own round trips and
WAL flush, and a crash between the two left the reservation held (measured cost:
docs/benchmarks.md). The rest of the function is 0002's, unchanged; downgrade restores it.

Revision ID: 0004
"""

from __future__ import annotations

import runpy
from pathlib import Path

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# 0002's function text is the base: that migration is frozen, so this stays what was released.
_BASE: str = runpy.run_path(str(Path(__file__).with_name("0002_apply_function.py")))[
    "function_sql"
]()
_ANCHOR = "    IF doc ? 'notify_agents' THEN"
_RELEASE = """    IF doc ? 'release_budget' THEN
        UPDATE budget_reservations SET released_at = (doc->>'release_budget')::timestamptz
            WHERE run_id = (doc->'run'->>'run_id')::uuid AND released_at IS NULL;
    END IF;
"""


def upgrade() -> None:
    assert _BASE.count(_ANCHOR) == 1, "0002's function text changed"
    op.execute(
        _BASE.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1).replace(
            _ANCHOR, _RELEASE + _ANCHOR
        )
    )


def downgrade() -> None:
    op.execute(_BASE.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
