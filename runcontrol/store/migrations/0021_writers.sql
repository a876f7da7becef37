-- Rendered from runcontrol/store/tables.py by `make sql` (runcontrol/store/writers.py):
-- do not edit. The writers this migration changes; each is frozen here as of this revision.

-- writer: runcontrol_write_journaled_calls
CREATE OR REPLACE FUNCTION runcontrol_write_journaled_calls(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO journaled_calls (
            run_id, step_id, name, occurrence, tenant_id, attempt_id, fencing_token, value_hash,
            bytes, recorded_at, value_json, error)
        SELECT
            run_id, step_id, name, occurrence, tenant_id, attempt_id, fencing_token, value_hash,
            bytes, recorded_at, value_json, error
        FROM jsonb_populate_recordset(NULL::journaled_calls, doc);
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_journaled_calls(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_journaled_calls(jsonb) TO runcontrol_app;

-- writer: runcontrol_write_tool_calls
CREATE OR REPLACE FUNCTION runcontrol_write_tool_calls(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO tool_calls (
            tool_call_id, tenant_id, run_id, call_id, attempt_id, request_hash, claimed_by,
            fencing_token, claimed_at, expires_at, state, result_hash, completed_at, error,
            result_json)
        SELECT
            tool_call_id, tenant_id, run_id, call_id, attempt_id, request_hash, claimed_by,
            fencing_token, claimed_at, expires_at, state, result_hash, completed_at, error,
            result_json
        FROM jsonb_populate_recordset(NULL::tool_calls, doc)
        ON CONFLICT (tool_call_id) DO UPDATE SET
            tenant_id = EXCLUDED.tenant_id, run_id = EXCLUDED.run_id, call_id = EXCLUDED.call_id,
            attempt_id = EXCLUDED.attempt_id, request_hash = EXCLUDED.request_hash,
            claimed_by = EXCLUDED.claimed_by, fencing_token = EXCLUDED.fencing_token,
            claimed_at = EXCLUDED.claimed_at, expires_at = EXCLUDED.expires_at,
            state = EXCLUDED.state, result_hash = EXCLUDED.result_hash,
            completed_at = EXCLUDED.completed_at, error = EXCLUDED.error,
            result_json = EXCLUDED.result_json;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_tool_calls(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_tool_calls(jsonb) TO runcontrol_app;
