-- Rendered from runcontrol/store/tables.py by `make sql` (runcontrol/store/writers.py):
-- do not edit. The writers this migration changes; each is frozen here as of this revision.

-- writer: runcontrol_write_steps
CREATE OR REPLACE FUNCTION runcontrol_write_steps(doc jsonb)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO steps (
            step_id, tenant_id, run_id, ordinal, name, agent_id, skill_id, state, max_attempts,
            gate, side_effect_class, not_before, failure_class, outcome_hash, depends_on, kind,
            wait, due_at, signal, flow, rate_limits, held)
        SELECT
            step_id, tenant_id, run_id, ordinal, name, agent_id, skill_id, state, max_attempts,
            gate, side_effect_class, not_before, failure_class, outcome_hash, depends_on, kind,
            wait, due_at, signal, flow, rate_limits, held
        FROM jsonb_populate_recordset(NULL::steps, doc)
        ON CONFLICT (step_id) DO UPDATE SET
            tenant_id = EXCLUDED.tenant_id, run_id = EXCLUDED.run_id, ordinal = EXCLUDED.ordinal,
            name = EXCLUDED.name, agent_id = EXCLUDED.agent_id, skill_id = EXCLUDED.skill_id,
            state = EXCLUDED.state, max_attempts = EXCLUDED.max_attempts, gate = EXCLUDED.gate,
            side_effect_class = EXCLUDED.side_effect_class, not_before = EXCLUDED.not_before,
            failure_class = EXCLUDED.failure_class, outcome_hash = EXCLUDED.outcome_hash,
            depends_on = EXCLUDED.depends_on, kind = EXCLUDED.kind, wait = EXCLUDED.wait,
            due_at = EXCLUDED.due_at, signal = EXCLUDED.signal, flow = EXCLUDED.flow,
            rate_limits = EXCLUDED.rate_limits, held = EXCLUDED.held;
    RETURN FOUND;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_write_steps(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_write_steps(jsonb) TO runcontrol_app;
