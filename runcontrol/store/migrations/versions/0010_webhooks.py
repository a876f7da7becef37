"""Events out: the tenant-wide event feed (``event_feed``) and webhook subscriptions with
their deliveries. The SQL is ``0010_webhooks.sql`` beside ``0001_schema.sql``, whole; its
header says why each table exists.

Revision ID: 0010
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

SQL = Path(__file__).resolve().parent.parent / "0010_webhooks.sql"


def upgrade() -> None:
    op.execute(SQL.read_text())


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS webhook_deliveries, webhook_subscriptions, event_feed")
