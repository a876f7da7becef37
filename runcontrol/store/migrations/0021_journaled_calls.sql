-- Migration 0021: journaled calls (issue 30). A step's journaled call (step.run) stores its
-- first value in its own insert-only table, journaled_calls, keyed by (run, step, name,
-- occurrence): the primary key keeps one value per key even if two statements raced past the
-- run's version guard. A tool call's completion may store its result too (result_json).
--
-- Journaled calls follow the event history's retention (RunControl:Outbox:RetentionDays), as
-- results do: the retention reconciler deletes them on the system path; the app role only
-- reads and inserts.

ALTER TABLE tool_calls ADD COLUMN result_json TEXT;

CREATE TABLE journaled_calls (
	run_id UUID NOT NULL,
	step_id UUID NOT NULL,
	name TEXT NOT NULL,
	occurrence INTEGER NOT NULL,
	tenant_id TEXT NOT NULL,
	attempt_id UUID NOT NULL,
	fencing_token BIGINT NOT NULL,
	value_hash TEXT NOT NULL,
	bytes BIGINT NOT NULL,
	recorded_at TIMESTAMP WITH TIME ZONE NOT NULL,
	value_json TEXT,
	error JSONB,
	PRIMARY KEY (run_id, step_id, name, occurrence),
	FOREIGN KEY(run_id) REFERENCES runs (run_id),
	FOREIGN KEY(step_id) REFERENCES steps (step_id),
	FOREIGN KEY(attempt_id) REFERENCES attempts (attempt_id)
);

ALTER TABLE journaled_calls ENABLE ROW LEVEL SECURITY;
ALTER TABLE journaled_calls FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON journaled_calls
    USING (tenant_id = current_setting('runcontrol.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true));
GRANT SELECT, INSERT ON journaled_calls TO runcontrol_app;
GRANT SELECT, DELETE ON journaled_calls TO runcontrol_system;
