"""Schedules (issue 32 item 1): the ``schedules`` table (a tenant's schedules, with the
sweep's durable state: the last nominal fire time handled and the next one due) and
``schedule_fires`` (one row per fire time handled: started, skipped or buffered, and the run it
started), both under row-level security. The scheduler's sweep (the system role) reads due
schedules and writes fires; the API (the app role) creates, changes and deletes schedules in
the caller's tenant.

Revision ID: 0023
"""

from __future__ import annotations

from alembic import op

revision = "0023"
down_revision = "0024"
branch_labels = None
depends_on = None

# Only new tables: the previous release runs on it unchanged (it never reads them).
oldest_code = "0020"

SQL = """
CREATE TABLE schedules (
	schedule_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	project_id TEXT NOT NULL,
	owner TEXT NOT NULL,
	owner_roles JSONB NOT NULL,
	owner_scopes JSONB NOT NULL,
	spec JSONB NOT NULL,
	paused BOOLEAN NOT NULL,
	note TEXT,
	last_nominal_at TIMESTAMP WITH TIME ZONE,
	next_fire_at TIMESTAMP WITH TIME ZONE,
	buffered_at TIMESTAMP WITH TIME ZONE,
	started BIGINT NOT NULL,
	skipped BIGINT NOT NULL,
	missed BIGINT NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
	CONSTRAINT schedules_pkey PRIMARY KEY (schedule_id)
);
CREATE INDEX ix_schedules_tenant ON schedules (tenant_id, created_at);
CREATE INDEX ix_schedules_due ON schedules (next_fire_at) WHERE NOT paused;

CREATE TABLE schedule_fires (
	schedule_id UUID NOT NULL,
	nominal_at TIMESTAMP WITH TIME ZONE NOT NULL,
	tenant_id TEXT NOT NULL,
	kind TEXT NOT NULL,
	outcome TEXT NOT NULL,
	run_id UUID,
	submitted_at TIMESTAMP WITH TIME ZONE,
	cancels JSONB,
	error TEXT,
	recorded_at TIMESTAMP WITH TIME ZONE NOT NULL,
	CONSTRAINT schedule_fires_pkey PRIMARY KEY (schedule_id, nominal_at),
	CONSTRAINT fk_schedule_fires_schedule FOREIGN KEY (schedule_id)
		REFERENCES schedules (schedule_id) ON DELETE CASCADE
);
CREATE INDEX ix_schedule_fires_unsubmitted ON schedule_fires (schedule_id)
	WHERE outcome = 'started' AND submitted_at IS NULL;

DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['schedules', 'schedule_fires'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format($p$CREATE POLICY tenant_isolation ON %I
            USING (tenant_id = current_setting('runcontrol.tenant_id', true))
            WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true))$p$, t);
    END LOOP;
END $$;
-- A caller bound to its project sees and changes its project's schedules only, as its runs.
CREATE POLICY project_scope ON schedules AS RESTRICTIVE TO runcontrol_app
    USING (coalesce(current_setting('runcontrol.project_id', true), '') IN ('', project_id));

GRANT SELECT, INSERT, UPDATE, DELETE ON schedules TO runcontrol_app;
GRANT SELECT, INSERT, UPDATE ON schedule_fires TO runcontrol_app;
GRANT SELECT, UPDATE ON schedules TO runcontrol_system;
GRANT SELECT, INSERT, UPDATE ON schedule_fires TO runcontrol_system;
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    raise NotImplementedError("0023 has no downgrade: restore from a backup taken before it")
