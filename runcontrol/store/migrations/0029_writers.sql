-- Rendered from runcontrol/store/tables.py by `make sql` (runcontrol/store/writers.py):
-- do not edit. The writers this migration changes; each is frozen here as of this revision.

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
