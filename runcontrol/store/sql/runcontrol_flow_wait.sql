-- The document's held steps queued (once: a repeat keeps the first arrival). A slot that
-- freed between the refusal and this statement is given here: the queue is never left
-- waiting with a free slot. Each: {name, key, limit, kind, waiter, run_id, step_id, priority,
-- at}.
CREATE OR REPLACE FUNCTION runcontrol_flow_wait(tenant text, waits jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    w jsonb;
BEGIN
    FOR w IN SELECT value FROM jsonb_array_elements(waits) LOOP
        PERFORM runcontrol_flow_lock(tenant, w->>'name', w->>'key');
        INSERT INTO flow_waiters (tenant_id, name, key, holder, run_id, step_id, kind,
                                  max_holders, priority, seq, promoted, enqueued_at)
            VALUES (tenant, w->>'name', w->>'key', w->>'waiter', (w->>'run_id')::uuid,
                    (w->>'step_id')::uuid, w->>'kind', (w->>'limit')::int,
                    (w->>'priority')::int, nextval('flow_waiters_seq'), false,
                    (w->>'at')::timestamptz)
            ON CONFLICT ON CONSTRAINT pk_flow_waiters DO NOTHING;
        PERFORM runcontrol_flow_promote(tenant, w->>'name', w->>'key');
    END LOOP;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_flow_wait(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_flow_wait(text, jsonb) TO runcontrol_app;
