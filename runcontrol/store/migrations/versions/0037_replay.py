"""Replay against a newer release (issue 44, docs/replay.md): a run's ``replay_of`` (the run it
replays) and ``replay`` (its options: liveCalls, approvals), written by the run writers at
acceptance; a journaled call's ``request_hash`` (the hash of the call's arguments, what a
replay matches it by). The run and journaled-call writers take the new columns (applied by
name, written by ``make sql``); a document without them (the previous release's) writes NULL:
not a replay, a call without arguments.

Revision ID: 0037
"""

from __future__ import annotations

from alembic import op

from runcontrol.store.functions import apply

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None

# Only adds (nullable columns): the previous release runs on it unchanged.
oldest_code = "0036"

SCHEMA = """
ALTER TABLE runs ADD COLUMN IF NOT EXISTS replay_of UUID;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS replay JSONB;
ALTER TABLE journaled_calls ADD COLUMN request_hash TEXT;
"""

FUNCTIONS = {
    "runcontrol_insert_runs": "108ea5e958c9ae2fd4f8f80826e1dab0",
    "runcontrol_update_runs": "00d92311da08d6ec924dfe4f1712ef78",
    "runcontrol_patch_runs": "cedc8739b3f226eb36de45632498289f",
    "runcontrol_write_journaled_calls": "7363ef630a3f8a706c02e497f3d0d17a",
}


def upgrade() -> None:
    op.execute(SCHEMA)
    apply(FUNCTIONS)


def downgrade() -> None:
    raise NotImplementedError("0037 has no downgrade: restore from a backup taken before it")
