"""Run templates (issue 44): the ``run_templates`` table (a row per version, under the tenant
and project policies), and a run's pinned ``template_id``/``template_version`` (the template it
was submitted from), written by the run writers at submission and never changed after it
(applied by name as ``store/writers.py`` makes them today, written by ``make sql``; not in
``runcontrol_keep_run_pins``' trigger: the baseline creates that trigger before this revision
adds the columns).
A document without them (the previous release's) inserts NULL: a run of no template.

Revision ID: 0032
"""

from __future__ import annotations

from alembic import op

from runcontrol.store.functions import apply

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

# Only adds (a table, two nullable columns): the previous release runs on it unchanged.
oldest_code = "0031"

SCHEMA = """
CREATE TABLE run_templates (
    template_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    tenant_id TEXT NOT NULL,
    project_id TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    release_alias TEXT NOT NULL,
    state TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    content JSONB NOT NULL,
    created_by TEXT NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE NOT NULL,
    decided_by TEXT,
    decided_at TIMESTAMP WITH TIME ZONE,
    reason TEXT,
    break_glass BOOLEAN NOT NULL,
    updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
    CONSTRAINT run_templates_pkey PRIMARY KEY (tenant_id, template_id, version)
);
CREATE INDEX ix_run_templates_list ON run_templates (tenant_id, created_at);
ALTER TABLE run_templates ENABLE ROW LEVEL SECURITY;
ALTER TABLE run_templates FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON run_templates
    USING (tenant_id = current_setting('runcontrol.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true));
CREATE POLICY project_scope ON run_templates
    AS RESTRICTIVE TO runcontrol_app
    USING (coalesce(current_setting('runcontrol.project_id', true), '') IN ('', project_id));
GRANT SELECT, INSERT, UPDATE ON run_templates TO runcontrol_app;
GRANT SELECT, UPDATE ON run_templates TO runcontrol_system;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS template_id TEXT;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS template_version INTEGER;
"""

FUNCTIONS = {
    "runcontrol_insert_runs": "a532ec4e82c8cb6a0f262ba885bb09f5",
    "runcontrol_update_runs": "0c4e33807689b7e2a9ffb6a96c8e4974",
    "runcontrol_patch_runs": "bc3ceb113c859f4e93020e847ae54257",
}


def upgrade() -> None:
    op.execute(SCHEMA)
    apply(FUNCTIONS)


def downgrade() -> None:
    raise NotImplementedError("0032 has no downgrade: restore from a backup taken before it")
