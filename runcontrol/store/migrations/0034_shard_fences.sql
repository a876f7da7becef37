-- A shard's fences (0034, issue 41; store/move.py): in every shard database, a tenant whose
-- rows left it. Run by 0034, and by the baseline (0029) too, which applies today's
-- runcontrol_apply_document, and so its fence check, which reads this table. Either may find
-- it made: each statement may run again.
CREATE TABLE IF NOT EXISTS shard_fences (
    tenant_id text NOT NULL,
    vshard integer NOT NULL,
    moved_to integer NOT NULL,
    epoch bigint NOT NULL,
    fenced_at timestamp with time zone NOT NULL,
    CONSTRAINT shard_fences_pkey PRIMARY KEY (tenant_id)
);
ALTER TABLE shard_fences ENABLE ROW LEVEL SECURITY;
ALTER TABLE shard_fences FORCE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON shard_fences;
CREATE POLICY tenant_isolation ON shard_fences
    USING (tenant_id = current_setting('runcontrol.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true));
GRANT SELECT ON shard_fences TO runcontrol_app, runcontrol_system;
