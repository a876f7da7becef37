-- Migration 0015: results (issue 20). An attempt's outcome stores what it produced in its own
-- insert-only table, attempt_results (its writer, rendered from tables.py, is in
-- 0015_writers.sql with the runs writers, which now carry the run's result hash and size).
--
-- runcontrol_apply writes the document's results: 0015_apply_writes_results.sql, run after
-- the writers.
--
-- Results follow the event history's retention (RunControl:Outbox:RetentionDays): the
-- retention reconciler deletes them on the system path; the app role only reads and inserts.

ALTER TABLE runs ADD COLUMN result_hash TEXT;
ALTER TABLE runs ADD COLUMN result_bytes BIGINT;

CREATE TABLE attempt_results (
	attempt_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	step_id UUID NOT NULL,
	run_id UUID NOT NULL,
	outcome_hash TEXT NOT NULL,
	bytes BIGINT NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	result_json TEXT,
	result_ref JSONB,
	PRIMARY KEY (attempt_id),
	FOREIGN KEY(attempt_id) REFERENCES attempts (attempt_id),
	FOREIGN KEY(step_id) REFERENCES steps (step_id),
	FOREIGN KEY(run_id) REFERENCES runs (run_id)
);

CREATE INDEX ix_attempt_results_run ON attempt_results (run_id);

ALTER TABLE attempt_results ENABLE ROW LEVEL SECURITY;
ALTER TABLE attempt_results FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON attempt_results
    USING (tenant_id = current_setting('runcontrol.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true));
GRANT SELECT, INSERT ON attempt_results TO runcontrol_app;
GRANT SELECT, DELETE ON attempt_results TO runcontrol_system;
