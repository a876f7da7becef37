-- Rendered from runcontrol/store/tables.py by `make sql` (runcontrol/store/writers.py):
-- do not edit. The writers this migration changes; each is frozen here as of this revision.

-- writer: runcontrol_insert_runs
CREATE OR REPLACE FUNCTION runcontrol_insert_runs(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO runs (
            run_id, tenant_id, project_id, environment_id, idempotency_key, workflow_id, release_id,
            release_hash, policy_id, policy_revision, model_profile_id, state, input_hash,
            snapshot_id, budget_reservation_id, requested_by, max_cost_usd, max_minutes,
            deadline_at, failure_class, failure_reason, outcome_hash, correlation_id, input,
            version, event_seq, journal_seq, fencing_seq, next_due_at, created_at, updated_at,
            suspended_at, rerun_of, result_hash, result_bytes)
        SELECT
            run_id, tenant_id, project_id, environment_id, idempotency_key, workflow_id, release_id,
            release_hash, policy_id, policy_revision, model_profile_id, state, input_hash,
            snapshot_id, budget_reservation_id, requested_by, max_cost_usd, max_minutes,
            deadline_at, failure_class, failure_reason, outcome_hash, correlation_id, input,
            version, event_seq, journal_seq, fencing_seq, next_due_at, created_at, updated_at,
            suspended_at, rerun_of, result_hash, result_bytes
        FROM jsonb_populate_record(NULL::runs, doc)
        ON CONFLICT (tenant_id, project_id, idempotency_key) DO NOTHING;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_insert_runs(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_insert_runs(jsonb) TO runcontrol_app;

-- writer: runcontrol_update_runs
CREATE OR REPLACE FUNCTION runcontrol_update_runs(doc jsonb, expected_version bigint)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    UPDATE runs SET
            tenant_id = r.tenant_id, project_id = r.project_id, environment_id = r.environment_id,
            idempotency_key = r.idempotency_key, workflow_id = r.workflow_id,
            release_hash = r.release_hash, policy_id = r.policy_id, state = r.state,
            input_hash = r.input_hash, budget_reservation_id = r.budget_reservation_id,
            requested_by = r.requested_by, max_cost_usd = r.max_cost_usd,
            max_minutes = r.max_minutes, deadline_at = r.deadline_at,
            failure_class = r.failure_class, failure_reason = r.failure_reason,
            outcome_hash = r.outcome_hash, correlation_id = r.correlation_id, input = r.input,
            version = r.version, event_seq = r.event_seq, journal_seq = r.journal_seq,
            fencing_seq = r.fencing_seq, next_due_at = r.next_due_at, created_at = r.created_at,
            updated_at = r.updated_at, suspended_at = r.suspended_at, rerun_of = r.rerun_of,
            result_hash = r.result_hash, result_bytes = r.result_bytes
        FROM jsonb_populate_record(NULL::runs, doc) r
        WHERE runs.run_id = r.run_id AND runs.version = expected_version;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_update_runs(jsonb, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_update_runs(jsonb, bigint) TO runcontrol_app;

-- writer: runcontrol_write_attempt_results
CREATE OR REPLACE FUNCTION runcontrol_write_attempt_results(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO attempt_results (
            attempt_id, tenant_id, step_id, run_id, outcome_hash, bytes, created_at, result_json,
            result_ref)
        SELECT
            attempt_id, tenant_id, step_id, run_id, outcome_hash, bytes, created_at, result_json,
            result_ref
        FROM jsonb_populate_recordset(NULL::attempt_results, doc);
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_attempt_results(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_attempt_results(jsonb) TO runcontrol_app;
