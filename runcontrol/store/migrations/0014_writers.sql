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
            suspended_at, rerun_of)
        SELECT
            run_id, tenant_id, project_id, environment_id, idempotency_key, workflow_id, release_id,
            release_hash, policy_id, policy_revision, model_profile_id, state, input_hash,
            snapshot_id, budget_reservation_id, requested_by, max_cost_usd, max_minutes,
            deadline_at, failure_class, failure_reason, outcome_hash, correlation_id, input,
            version, event_seq, journal_seq, fencing_seq, next_due_at, created_at, updated_at,
            suspended_at, rerun_of
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
            updated_at = r.updated_at, suspended_at = r.suspended_at, rerun_of = r.rerun_of
        FROM jsonb_populate_record(NULL::runs, doc) r
        WHERE runs.run_id = r.run_id AND runs.version = expected_version;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_update_runs(jsonb, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_update_runs(jsonb, bigint) TO runcontrol_app;

-- writer: runcontrol_keep_run_pins
CREATE OR REPLACE FUNCTION runcontrol_keep_run_pins()
RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.release_id IS DISTINCT FROM OLD.release_id
            OR NEW.policy_revision IS DISTINCT FROM OLD.policy_revision
            OR NEW.model_profile_id IS DISTINCT FROM OLD.model_profile_id
            OR NEW.snapshot_id IS DISTINCT FROM OLD.snapshot_id THEN
        RAISE EXCEPTION 'a run''s pins never change after acceptance (%)',
            'release_id, policy_revision, model_profile_id, snapshot_id'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $fn$;
CREATE OR REPLACE TRIGGER runs_keep_pins BEFORE UPDATE
    OF release_id, policy_revision, model_profile_id, snapshot_id
    ON runs FOR EACH ROW EXECUTE FUNCTION runcontrol_keep_run_pins();

-- writer: runcontrol_write_steps
CREATE OR REPLACE FUNCTION runcontrol_write_steps(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO steps (
            step_id, tenant_id, run_id, ordinal, name, agent_id, skill_id, state, max_attempts,
            gate, side_effect_class, not_before, failure_class, outcome_hash)
        SELECT
            step_id, tenant_id, run_id, ordinal, name, agent_id, skill_id, state, max_attempts,
            gate, side_effect_class, not_before, failure_class, outcome_hash
        FROM jsonb_populate_recordset(NULL::steps, doc)
        ON CONFLICT (step_id) DO UPDATE SET
            tenant_id = EXCLUDED.tenant_id, run_id = EXCLUDED.run_id, ordinal = EXCLUDED.ordinal,
            name = EXCLUDED.name, agent_id = EXCLUDED.agent_id, skill_id = EXCLUDED.skill_id,
            state = EXCLUDED.state, max_attempts = EXCLUDED.max_attempts, gate = EXCLUDED.gate,
            side_effect_class = EXCLUDED.side_effect_class, not_before = EXCLUDED.not_before,
            failure_class = EXCLUDED.failure_class, outcome_hash = EXCLUDED.outcome_hash;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_steps(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_steps(jsonb) TO runcontrol_app;

-- writer: runcontrol_write_attempts
CREATE OR REPLACE FUNCTION runcontrol_write_attempts(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO attempts (
            attempt_id, tenant_id, step_id, run_id, agent_id, number, state, lease_id,
            fencing_token, holder, outcome, outcome_hash, failure_class, dispatched_at, settled_at,
            settled_by, progress_seq)
        SELECT
            attempt_id, tenant_id, step_id, run_id, agent_id, number, state, lease_id,
            fencing_token, holder, outcome, outcome_hash, failure_class, dispatched_at, settled_at,
            settled_by, progress_seq
        FROM jsonb_populate_recordset(NULL::attempts, doc)
        ON CONFLICT (attempt_id) DO UPDATE SET
            tenant_id = EXCLUDED.tenant_id, step_id = EXCLUDED.step_id, run_id = EXCLUDED.run_id,
            agent_id = EXCLUDED.agent_id, number = EXCLUDED.number, state = EXCLUDED.state,
            lease_id = EXCLUDED.lease_id, fencing_token = EXCLUDED.fencing_token,
            holder = EXCLUDED.holder, outcome = EXCLUDED.outcome,
            outcome_hash = EXCLUDED.outcome_hash, failure_class = EXCLUDED.failure_class,
            dispatched_at = EXCLUDED.dispatched_at, settled_at = EXCLUDED.settled_at,
            settled_by = EXCLUDED.settled_by, progress_seq = EXCLUDED.progress_seq;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_attempts(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_attempts(jsonb) TO runcontrol_app;

-- writer: runcontrol_write_leases
CREATE OR REPLACE FUNCTION runcontrol_write_leases(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO leases (
            lease_id, tenant_id, attempt_id, run_id, holder, fencing_token, granted_at, expires_at,
            released_at, release_cause)
        SELECT
            lease_id, tenant_id, attempt_id, run_id, holder, fencing_token, granted_at, expires_at,
            released_at, release_cause
        FROM jsonb_populate_recordset(NULL::leases, doc)
        ON CONFLICT (lease_id) DO UPDATE SET
            tenant_id = EXCLUDED.tenant_id, attempt_id = EXCLUDED.attempt_id,
            run_id = EXCLUDED.run_id, holder = EXCLUDED.holder,
            fencing_token = EXCLUDED.fencing_token, granted_at = EXCLUDED.granted_at,
            expires_at = EXCLUDED.expires_at, released_at = EXCLUDED.released_at,
            release_cause = EXCLUDED.release_cause;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_leases(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_leases(jsonb) TO runcontrol_app;

-- writer: runcontrol_write_tool_calls
CREATE OR REPLACE FUNCTION runcontrol_write_tool_calls(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO tool_calls (
            tool_call_id, tenant_id, run_id, call_id, attempt_id, request_hash, claimed_by,
            fencing_token, claimed_at, expires_at, state, result_hash, completed_at, error)
        SELECT
            tool_call_id, tenant_id, run_id, call_id, attempt_id, request_hash, claimed_by,
            fencing_token, claimed_at, expires_at, state, result_hash, completed_at, error
        FROM jsonb_populate_recordset(NULL::tool_calls, doc)
        ON CONFLICT (tool_call_id) DO UPDATE SET
            tenant_id = EXCLUDED.tenant_id, run_id = EXCLUDED.run_id, call_id = EXCLUDED.call_id,
            attempt_id = EXCLUDED.attempt_id, request_hash = EXCLUDED.request_hash,
            claimed_by = EXCLUDED.claimed_by, fencing_token = EXCLUDED.fencing_token,
            claimed_at = EXCLUDED.claimed_at, expires_at = EXCLUDED.expires_at,
            state = EXCLUDED.state, result_hash = EXCLUDED.result_hash,
            completed_at = EXCLUDED.completed_at, error = EXCLUDED.error;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_tool_calls(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_tool_calls(jsonb) TO runcontrol_app;

-- writer: runcontrol_write_approval_requests
CREATE OR REPLACE FUNCTION runcontrol_write_approval_requests(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO approval_requests (
            approval_id, tenant_id, run_id, step_id, attempt_id, action_class, proposal_hash,
            policy_revision, approver_rule, required_approvals, requested_by, created_at,
            expires_at, state, decided_by, decided_at, reason, version)
        SELECT
            approval_id, tenant_id, run_id, step_id, attempt_id, action_class, proposal_hash,
            policy_revision, approver_rule, required_approvals, requested_by, created_at,
            expires_at, state, decided_by, decided_at, reason, version
        FROM jsonb_populate_recordset(NULL::approval_requests, doc)
        ON CONFLICT (approval_id) DO UPDATE SET
            tenant_id = EXCLUDED.tenant_id, run_id = EXCLUDED.run_id, step_id = EXCLUDED.step_id,
            attempt_id = EXCLUDED.attempt_id, action_class = EXCLUDED.action_class,
            proposal_hash = EXCLUDED.proposal_hash, policy_revision = EXCLUDED.policy_revision,
            approver_rule = EXCLUDED.approver_rule,
            required_approvals = EXCLUDED.required_approvals, requested_by = EXCLUDED.requested_by,
            created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at,
            state = EXCLUDED.state, decided_by = EXCLUDED.decided_by,
            decided_at = EXCLUDED.decided_at, reason = EXCLUDED.reason, version = EXCLUDED.version;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_approval_requests(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_approval_requests(jsonb) TO runcontrol_app;

-- writer: runcontrol_write_approval_decisions
CREATE OR REPLACE FUNCTION runcontrol_write_approval_decisions(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO approval_decisions (
            approval_id, decided_by, tenant_id, run_id, decision, proposal_hash, reason,
            break_glass, decided_at)
        SELECT
            approval_id, decided_by, tenant_id, run_id, decision, proposal_hash, reason,
            break_glass, decided_at
        FROM jsonb_populate_recordset(NULL::approval_decisions, doc);
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_approval_decisions(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_approval_decisions(jsonb) TO runcontrol_app;

-- writer: runcontrol_write_cancellation_intents
CREATE OR REPLACE FUNCTION runcontrol_write_cancellation_intents(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO cancellation_intents (
            intent_id, tenant_id, run_id, requested_by, reason, requested_at)
        SELECT
            intent_id, tenant_id, run_id, requested_by, reason, requested_at
        FROM jsonb_populate_recordset(NULL::cancellation_intents, doc);
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_cancellation_intents(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_cancellation_intents(jsonb) TO runcontrol_app;

-- writer: runcontrol_write_outbox
CREATE OR REPLACE FUNCTION runcontrol_write_outbox(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO outbox (
            event_id, tenant_id, project_id, run_id, seq, topic, event_type, step_id, attempt_id,
            correlation_id, causation_id, producer, schema_version, payload, occurred_at,
            published_at)
        SELECT
            event_id, tenant_id, project_id, run_id, seq, topic, event_type, step_id, attempt_id,
            correlation_id, causation_id, producer, schema_version, payload, occurred_at,
            published_at
        FROM jsonb_populate_recordset(NULL::outbox, doc);
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_outbox(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_outbox(jsonb) TO runcontrol_app;

-- writer: runcontrol_write_recovery_journal
CREATE OR REPLACE FUNCTION runcontrol_write_recovery_journal(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO recovery_journal (
            tenant_id, run_id, sequence, entity, entity_id, from_state, to_state, cause, actor,
            occurred_at)
        SELECT
            tenant_id, run_id, sequence, entity, entity_id, from_state, to_state, cause, actor,
            occurred_at
        FROM jsonb_populate_recordset(NULL::recovery_journal, doc);
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_recovery_journal(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_recovery_journal(jsonb) TO runcontrol_app;

-- writer: runcontrol_write_audit_log
CREATE OR REPLACE FUNCTION runcontrol_write_audit_log(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO audit_log (
            tenant_id, run_id, kind, actor, detail, occurred_at)
        SELECT
            tenant_id, run_id, kind, actor, detail, occurred_at
        FROM jsonb_populate_recordset(NULL::audit_log, doc);
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_audit_log(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_audit_log(jsonb) TO runcontrol_app;

-- writer: runcontrol_write_command_answers
CREATE OR REPLACE FUNCTION runcontrol_write_command_answers(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO command_answers (
            tenant_id, run_id, command_id, command, answer, created_at, fingerprint)
        SELECT
            tenant_id, run_id, command_id, command, answer, created_at, fingerprint
        FROM jsonb_populate_recordset(NULL::command_answers, doc);
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_command_answers(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_command_answers(jsonb) TO runcontrol_app;
