"""The engine's commits (issue 33): ``runcontrol_apply`` updates only the run columns a
"patch" document carries (``runcontrol_patch_runs``, rendered by ``make sql`` into
``0026_writers.sql``) and NOTIFYs a channel only while a listener has registered on it
(``runcontrol_listeners``, ``runcontrol_listen``, ``runcontrol_unlisten``), calling 0021's
apply, not restating it (``0026_lean_commits.sql``).

Revision ID: 0026
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0026"
down_revision = "0023"
branch_labels = None
depends_on = None

# Keeps no older code: the previous release's listeners LISTEN without registering, so the
# new release's commits would not wake them (their waiters would fall back to their
# timeouts). Its documents still apply as before.
oldest_code = "0026"

HERE = Path(__file__).resolve().parent.parent
STEPS = ("0026_writers.sql", "0026_lean_commits.sql")


def upgrade() -> None:
    for name in STEPS:
        op.execute((HERE / name).read_text())


def downgrade() -> None:
    raise NotImplementedError("0026 has no downgrade: restore from a backup taken before it")
