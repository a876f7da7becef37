"""A2A push notification configs (issue 31): ``a2a_push_configs`` (one per task, owner and
config id, under row-level security), each delivered through a webhook subscription of its
run: ``webhook_subscriptions`` gains ``run_id`` (only that run's events), ``event_types``
(only these types) and ``format`` (how a delivery is rendered; ``event``, the signed
envelope, for every subscription there was).

Revision ID: 0028
"""

from __future__ import annotations

from alembic import op

revision = "0028"
down_revision = "0026"
branch_labels = None
depends_on = None

# Adds a nullable column, one with a default, a table: the previous release runs on it
# unchanged. Its relay queues a subscription's events after ``starts_after``, which a run's
# subscription sets to the largest position: it never sends such a one another run's event.
oldest_code = "0023"

SQL = """
ALTER TABLE webhook_subscriptions ADD COLUMN run_id UUID;
ALTER TABLE webhook_subscriptions ADD COLUMN event_types TEXT[];
ALTER TABLE webhook_subscriptions ADD COLUMN format TEXT NOT NULL DEFAULT 'event';
CREATE INDEX ix_webhook_subscriptions_run ON webhook_subscriptions (run_id)
    WHERE run_id IS NOT NULL;

CREATE TABLE a2a_push_configs (
	run_id UUID NOT NULL,
	owner TEXT NOT NULL,
	config_id TEXT NOT NULL,
	tenant_id TEXT NOT NULL,
	subscription_id UUID NOT NULL,
	token TEXT,
	auth_scheme TEXT,
	auth_credentials TEXT,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
	CONSTRAINT a2a_push_configs_pkey PRIMARY KEY (run_id, owner, config_id),
	CONSTRAINT uq_a2a_push_configs_subscription UNIQUE (subscription_id),
	CONSTRAINT fk_a2a_push_configs_subscription FOREIGN KEY (subscription_id)
		REFERENCES webhook_subscriptions (subscription_id) ON DELETE CASCADE
);
ALTER TABLE a2a_push_configs ENABLE ROW LEVEL SECURITY;
ALTER TABLE a2a_push_configs FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON a2a_push_configs
    USING (tenant_id = current_setting('runcontrol.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true));

GRANT SELECT, INSERT, UPDATE, DELETE ON a2a_push_configs TO runcontrol_app;
GRANT SELECT ON a2a_push_configs TO runcontrol_system;
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    raise NotImplementedError("0028 has no downgrade: restore from a backup taken before it")
