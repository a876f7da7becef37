"""A virtual shard's move (issue 41; store/move.py, docs/sharding.md "Moving a tenant"):
``vshard_moves`` (each move's next step, journaled in the directory's database, at most one
open move per shard) and ``shard_fences`` (in every shard database: a tenant whose rows left
it). ``runcontrol_check_fence`` refuses a fenced tenant's document in its own transaction
(RC421: route again); ``runcontrol_apply_document`` and ``runcontrol_append_output`` call it
first (applied by name as ``runcontrol/store/sql/`` makes them today; written by ``make sql``).

Revision ID: 0034
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

from runcontrol.store.functions import apply

revision = "0034"
down_revision = "0032"
branch_labels = None
depends_on = None

# Adds two tables and a check that refuses nothing until a move writes a fence (and a move
# needs this release): the previous release runs on it unchanged.
oldest_code = "0032"

SCHEMA = """
CREATE TABLE vshard_moves (
    move_id uuid NOT NULL,
    vshard integer NOT NULL,
    source integer NOT NULL,
    target integer NOT NULL,
    step text NOT NULL,
    tenants jsonb,
    started_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    error text,
    CONSTRAINT vshard_moves_pkey PRIMARY KEY (move_id)
);
CREATE UNIQUE INDEX uq_vshard_moves_open ON vshard_moves (vshard)
    WHERE step NOT IN ('done', 'aborted');
GRANT SELECT ON vshard_moves TO runcontrol_system;
"""

FUNCTIONS = {
    "runcontrol_append_output": "866e1c5affcb4f548db0f78eff35ee84",
    "runcontrol_apply_document": "2db2085e1d66b2d7b3ee59e602f98e88",
    "runcontrol_check_fence": "2ee75f1464ec5898a6e250e89bbf0a3e",
}


FENCES = Path(__file__).resolve().parent.parent / "0034_shard_fences.sql"


def upgrade() -> None:
    op.execute(SCHEMA)
    op.execute(FENCES.read_text())
    apply(FUNCTIONS)


def downgrade() -> None:
    raise NotImplementedError("0034 has no downgrade: restore from a backup taken before it")
