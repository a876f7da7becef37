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
            suspended_at, rerun_of, result_hash, result_bytes, priority, flow, parent_run_id,
            parent_step_id, depth)
        SELECT
            run_id, tenant_id, project_id, environment_id, idempotency_key, workflow_id, release_id,
            release_hash, policy_id, policy_revision, model_profile_id, state, input_hash,
            snapshot_id, budget_reservation_id, requested_by, max_cost_usd, max_minutes,
            deadline_at, failure_class, failure_reason, outcome_hash, correlation_id, input,
            version, event_seq, journal_seq, fencing_seq, next_due_at, created_at, updated_at,
            suspended_at, rerun_of, result_hash, result_bytes, priority, flow, parent_run_id,
            parent_step_id, depth
        FROM jsonb_populate_record(NULL::runs, doc)
        ON CONFLICT (tenant_id, project_id, idempotency_key) DO NOTHING;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_insert_runs(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_insert_runs(jsonb) TO runcontrol_app;

-- writer: runcontrol_keep_run_pins
CREATE OR REPLACE FUNCTION runcontrol_keep_run_pins()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.release_id IS DISTINCT FROM OLD.release_id
            OR NEW.policy_revision IS DISTINCT FROM OLD.policy_revision
            OR NEW.model_profile_id IS DISTINCT FROM OLD.model_profile_id
            OR NEW.snapshot_id IS DISTINCT FROM OLD.snapshot_id
            OR NEW.priority IS DISTINCT FROM OLD.priority
            OR NEW.flow IS DISTINCT FROM OLD.flow
            OR NEW.parent_run_id IS DISTINCT FROM OLD.parent_run_id
            OR NEW.parent_step_id IS DISTINCT FROM OLD.parent_step_id
            OR NEW.depth IS DISTINCT FROM OLD.depth THEN
        RAISE EXCEPTION 'a run''s pins never change after acceptance (%)',
            'release_id, policy_revision, model_profile_id, snapshot_id, priority, flow, parent_run_id, parent_step_id, depth'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $fn$;
CREATE OR REPLACE TRIGGER runs_keep_pins BEFORE UPDATE
    OF release_id, policy_revision, model_profile_id, snapshot_id, priority, flow, parent_run_id, parent_step_id, depth
    ON runs FOR EACH ROW EXECUTE FUNCTION runcontrol_keep_run_pins();

-- writer: runcontrol_write_steps
CREATE OR REPLACE FUNCTION runcontrol_write_steps(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO steps (
            step_id, tenant_id, run_id, ordinal, name, agent_id, skill_id, state, max_attempts,
            gate, side_effect_class, not_before, failure_class, outcome_hash, depends_on, kind,
            wait, due_at, signal, flow, rate_limits, held, condition, result_json, child)
        SELECT
            step_id, tenant_id, run_id, ordinal, name, agent_id, skill_id, state, max_attempts,
            gate, side_effect_class, not_before, failure_class, outcome_hash, depends_on, kind,
            wait, due_at, signal, flow, rate_limits, held, condition, result_json, child
        FROM jsonb_populate_recordset(NULL::steps, doc)
        ON CONFLICT (step_id) DO UPDATE SET
            tenant_id = EXCLUDED.tenant_id, run_id = EXCLUDED.run_id, ordinal = EXCLUDED.ordinal,
            name = EXCLUDED.name, agent_id = EXCLUDED.agent_id, skill_id = EXCLUDED.skill_id,
            state = EXCLUDED.state, max_attempts = EXCLUDED.max_attempts, gate = EXCLUDED.gate,
            side_effect_class = EXCLUDED.side_effect_class, not_before = EXCLUDED.not_before,
            failure_class = EXCLUDED.failure_class, outcome_hash = EXCLUDED.outcome_hash,
            depends_on = EXCLUDED.depends_on, kind = EXCLUDED.kind, wait = EXCLUDED.wait,
            due_at = EXCLUDED.due_at, signal = EXCLUDED.signal, flow = EXCLUDED.flow,
            rate_limits = EXCLUDED.rate_limits, held = EXCLUDED.held,
            condition = EXCLUDED.condition, result_json = EXCLUDED.result_json,
            child = EXCLUDED.child;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_steps(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_steps(jsonb) TO runcontrol_app;
