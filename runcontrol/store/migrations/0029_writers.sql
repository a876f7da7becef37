-- Rendered from runcontrol/store/tables.py by `make sql` (runcontrol/store/writers.py):
-- do not edit. The writers this migration changes; each is frozen here as of this revision.

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
        WHERE runs.run_id = CAST(doc->>'run_id' AS UUID) AND runs.version = expected_version;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_update_runs(jsonb, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_update_runs(jsonb, bigint) TO runcontrol_app;

-- writer: runcontrol_patch_runs
CREATE OR REPLACE FUNCTION runcontrol_patch_runs(doc jsonb, expected_version bigint)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    UPDATE runs SET
            tenant_id = CASE WHEN doc ? 'tenant_id' THEN r.tenant_id ELSE runs.tenant_id END,
            project_id = CASE WHEN doc ? 'project_id' THEN r.project_id ELSE runs.project_id END,
            environment_id = CASE WHEN doc ? 'environment_id' THEN r.environment_id ELSE runs.environment_id END,
            idempotency_key = CASE WHEN doc ? 'idempotency_key' THEN r.idempotency_key ELSE runs.idempotency_key END,
            workflow_id = CASE WHEN doc ? 'workflow_id' THEN r.workflow_id ELSE runs.workflow_id END,
            release_hash = CASE WHEN doc ? 'release_hash' THEN r.release_hash ELSE runs.release_hash END,
            policy_id = CASE WHEN doc ? 'policy_id' THEN r.policy_id ELSE runs.policy_id END,
            state = CASE WHEN doc ? 'state' THEN r.state ELSE runs.state END,
            input_hash = CASE WHEN doc ? 'input_hash' THEN r.input_hash ELSE runs.input_hash END,
            budget_reservation_id = CASE WHEN doc ? 'budget_reservation_id' THEN r.budget_reservation_id ELSE runs.budget_reservation_id END,
            requested_by = CASE WHEN doc ? 'requested_by' THEN r.requested_by ELSE runs.requested_by END,
            max_cost_usd = CASE WHEN doc ? 'max_cost_usd' THEN r.max_cost_usd ELSE runs.max_cost_usd END,
            max_minutes = CASE WHEN doc ? 'max_minutes' THEN r.max_minutes ELSE runs.max_minutes END,
            deadline_at = CASE WHEN doc ? 'deadline_at' THEN r.deadline_at ELSE runs.deadline_at END,
            failure_class = CASE WHEN doc ? 'failure_class' THEN r.failure_class ELSE runs.failure_class END,
            failure_reason = CASE WHEN doc ? 'failure_reason' THEN r.failure_reason ELSE runs.failure_reason END,
            outcome_hash = CASE WHEN doc ? 'outcome_hash' THEN r.outcome_hash ELSE runs.outcome_hash END,
            correlation_id = CASE WHEN doc ? 'correlation_id' THEN r.correlation_id ELSE runs.correlation_id END,
            input = CASE WHEN doc ? 'input' THEN r.input ELSE runs.input END,
            version = CASE WHEN doc ? 'version' THEN r.version ELSE runs.version END,
            event_seq = CASE WHEN doc ? 'event_seq' THEN r.event_seq ELSE runs.event_seq END,
            journal_seq = CASE WHEN doc ? 'journal_seq' THEN r.journal_seq ELSE runs.journal_seq END,
            fencing_seq = CASE WHEN doc ? 'fencing_seq' THEN r.fencing_seq ELSE runs.fencing_seq END,
            next_due_at = CASE WHEN doc ? 'next_due_at' THEN r.next_due_at ELSE runs.next_due_at END,
            created_at = CASE WHEN doc ? 'created_at' THEN r.created_at ELSE runs.created_at END,
            updated_at = CASE WHEN doc ? 'updated_at' THEN r.updated_at ELSE runs.updated_at END,
            suspended_at = CASE WHEN doc ? 'suspended_at' THEN r.suspended_at ELSE runs.suspended_at END,
            rerun_of = CASE WHEN doc ? 'rerun_of' THEN r.rerun_of ELSE runs.rerun_of END,
            result_hash = CASE WHEN doc ? 'result_hash' THEN r.result_hash ELSE runs.result_hash END,
            result_bytes = CASE WHEN doc ? 'result_bytes' THEN r.result_bytes ELSE runs.result_bytes END
        FROM jsonb_populate_record(NULL::runs, doc) r
        WHERE runs.run_id = CAST(doc->>'run_id' AS UUID) AND runs.version = expected_version;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_patch_runs(jsonb, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_patch_runs(jsonb, bigint) TO runcontrol_app;

-- writer: runcontrol_append_outbox
CREATE OR REPLACE FUNCTION runcontrol_append_outbox(docs jsonb, applied int[], key text, tenant text)
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
        FROM jsonb_array_elements(docs) WITH ORDINALITY AS d(doc, place)
        CROSS JOIN LATERAL jsonb_populate_recordset(NULL::outbox, CASE jsonb_typeof(d.doc->key)
            WHEN 'object' THEN jsonb_build_array(d.doc->key) ELSE d.doc->key END)
            WITH ORDINALITY AS r
        WHERE d.place = ANY(applied) AND d.doc ? key AND d.doc->>'tenant' = tenant
        ORDER BY d.place, r.ordinality;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_append_outbox(jsonb, int[], text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_append_outbox(jsonb, int[], text, text) TO runcontrol_app;

-- writer: runcontrol_append_recovery_journal
CREATE OR REPLACE FUNCTION runcontrol_append_recovery_journal(docs jsonb, applied int[], key text, tenant text)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO recovery_journal (
            tenant_id, run_id, sequence, entity, entity_id, from_state, to_state, cause, actor,
            occurred_at)
        SELECT
            tenant_id, run_id, sequence, entity, entity_id, from_state, to_state, cause, actor,
            occurred_at
        FROM jsonb_array_elements(docs) WITH ORDINALITY AS d(doc, place)
        CROSS JOIN LATERAL jsonb_populate_recordset(NULL::recovery_journal, CASE jsonb_typeof(d.doc->key)
            WHEN 'object' THEN jsonb_build_array(d.doc->key) ELSE d.doc->key END)
            WITH ORDINALITY AS r
        WHERE d.place = ANY(applied) AND d.doc ? key AND d.doc->>'tenant' = tenant
        ORDER BY d.place, r.ordinality;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_append_recovery_journal(jsonb, int[], text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_append_recovery_journal(jsonb, int[], text, text) TO runcontrol_app;

-- writer: runcontrol_append_audit_log
CREATE OR REPLACE FUNCTION runcontrol_append_audit_log(docs jsonb, applied int[], key text, tenant text)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO audit_log (
            tenant_id, run_id, kind, actor, detail, occurred_at)
        SELECT
            tenant_id, run_id, kind, actor, detail, occurred_at
        FROM jsonb_array_elements(docs) WITH ORDINALITY AS d(doc, place)
        CROSS JOIN LATERAL jsonb_populate_recordset(NULL::audit_log, CASE jsonb_typeof(d.doc->key)
            WHEN 'object' THEN jsonb_build_array(d.doc->key) ELSE d.doc->key END)
            WITH ORDINALITY AS r
        WHERE d.place = ANY(applied) AND d.doc ? key AND d.doc->>'tenant' = tenant
        ORDER BY d.place, r.ordinality;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_append_audit_log(jsonb, int[], text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_append_audit_log(jsonb, int[], text, text) TO runcontrol_app;

-- writer: runcontrol_append_command_answers
CREATE OR REPLACE FUNCTION runcontrol_append_command_answers(docs jsonb, applied int[], key text, tenant text)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO command_answers (
            tenant_id, run_id, command_id, command, answer, created_at, fingerprint)
        SELECT
            tenant_id, run_id, command_id, command, answer, created_at, fingerprint
        FROM jsonb_array_elements(docs) WITH ORDINALITY AS d(doc, place)
        CROSS JOIN LATERAL jsonb_populate_recordset(NULL::command_answers, CASE jsonb_typeof(d.doc->key)
            WHEN 'object' THEN jsonb_build_array(d.doc->key) ELSE d.doc->key END)
            WITH ORDINALITY AS r
        WHERE d.place = ANY(applied) AND d.doc ? key AND d.doc->>'tenant' = tenant
        ORDER BY d.place, r.ordinality;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_append_command_answers(jsonb, int[], text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_append_command_answers(jsonb, int[], text, text) TO runcontrol_app;

-- writer: runcontrol_append_attempt_results
CREATE OR REPLACE FUNCTION runcontrol_append_attempt_results(docs jsonb, applied int[], key text, tenant text)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO attempt_results (
            attempt_id, tenant_id, step_id, run_id, outcome_hash, bytes, created_at, result_json,
            result_ref)
        SELECT
            attempt_id, tenant_id, step_id, run_id, outcome_hash, bytes, created_at, result_json,
            result_ref
        FROM jsonb_array_elements(docs) WITH ORDINALITY AS d(doc, place)
        CROSS JOIN LATERAL jsonb_populate_recordset(NULL::attempt_results, CASE jsonb_typeof(d.doc->key)
            WHEN 'object' THEN jsonb_build_array(d.doc->key) ELSE d.doc->key END)
            WITH ORDINALITY AS r
        WHERE d.place = ANY(applied) AND d.doc ? key AND d.doc->>'tenant' = tenant
        ORDER BY d.place, r.ordinality;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_append_attempt_results(jsonb, int[], text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_append_attempt_results(jsonb, int[], text, text) TO runcontrol_app;
