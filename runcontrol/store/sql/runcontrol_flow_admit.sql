-- Flow control (issue 21, docs/flow-control.md): concurrency keys with ordered release,
-- priority, held steps; the tenant's cap on open attempts goes through the same queue.
--
-- A dispatch that needs slots carries them in its document ("flow"); this function, called by
-- runcontrol_apply_document only for such documents, takes each key's advisory lock and admits
-- the holder only if the key's holders and promoted waiters leave room and nobody queued ahead
-- of it (priority, then arrival) is waiting, or if it is the promoted waiter; else it raises
-- RC430 with what it found, rolling back this document only. The grain then decides again
-- holding the step, and that commit queues it ("flow_wait": runcontrol_flow_wait). The slots
-- are rows inserted by the admitting statement and deleted by triggers in the transaction that
-- makes their holder terminal (runcontrol_flow_attempt_settled, runcontrol_flow_run_ended),
-- which promote the next waiters in order and make their runs due: the dispatcher's
-- event-driven sweep wakes exactly them. A run that ends while it waits leaves its queues the
-- same way.
--
-- The document's slots, taken or refused (RC430). Entries come in one order (flow.lock_order:
-- concurrency keys by name and key, the tenant's cap last) so two statements take the keys'
-- locks alike. Each: {name, key, limit, kind, strategy,
-- holder (the run or the attempt), waiter (the run or the step: its queue row), run_id,
-- attempt_id, priority, at}.
CREATE OR REPLACE FUNCTION runcontrol_flow_admit(tenant text, wanted jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    w jsonb;
    fname text;
    fkey text;
    mine flow_waiters%ROWTYPE;
    taken bigint;
    mine_priority int;
    ahead boolean;
BEGIN
    FOR w IN SELECT value FROM jsonb_array_elements(wanted) LOOP
        fname := w->>'name';
        fkey := w->>'key';
        PERFORM runcontrol_flow_lock(tenant, fname, fkey);
        -- a run's workflow-wide slot, taken by its first dispatch
        CONTINUE WHEN EXISTS (SELECT 1 FROM flow_slots WHERE tenant_id = tenant
                              AND name = fname AND key = fkey AND holder = w->>'holder');
        SELECT * INTO mine FROM flow_waiters
            WHERE tenant_id = tenant AND name = fname AND key = fkey AND holder = w->>'waiter';
        IF NOT FOUND OR NOT mine.promoted THEN
            mine_priority := (w->>'priority')::int;
            SELECT (SELECT count(*) FROM flow_slots
                        WHERE tenant_id = tenant AND name = fname AND key = fkey)
                 + (SELECT count(*) FROM flow_waiters
                        WHERE tenant_id = tenant AND name = fname AND key = fkey AND promoted)
                INTO taken;
            -- a newcomer never jumps the queue: anyone unpromoted before it in its order
            ahead := EXISTS (
                SELECT 1 FROM flow_waiters
                WHERE tenant_id = tenant AND name = fname AND key = fkey AND NOT promoted
                  AND holder <> w->>'waiter'
                  AND (priority > mine_priority
                       OR (priority = mine_priority AND (mine.seq IS NULL OR seq < mine.seq))));
            IF ahead OR taken >= (w->>'limit')::int THEN
                RAISE EXCEPTION 'concurrency key busy: %', jsonb_build_object(
                    'name', fname, 'key', fkey, 'limit', (w->>'limit')::int,
                    'kind', w->>'kind', 'strategy', w->>'strategy', 'holders', taken,
                    'holderRuns', (SELECT coalesce(jsonb_agg(DISTINCT run_id), '[]'::jsonb)
                                   FROM flow_slots WHERE tenant_id = tenant
                                   AND name = fname AND key = fkey))
                    USING ERRCODE = 'RC430';
            END IF;
        END IF;
        DELETE FROM flow_waiters
            WHERE tenant_id = tenant AND name = fname AND key = fkey AND holder = w->>'waiter';
        INSERT INTO flow_slots (tenant_id, name, key, holder, run_id, attempt_id, kind,
                                max_holders, taken_at)
            VALUES (tenant, fname, fkey, w->>'holder', (w->>'run_id')::uuid,
                    (w->>'attempt_id')::uuid, w->>'kind', (w->>'limit')::int,
                    (w->>'at')::timestamptz);
    END LOOP;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_flow_admit(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_flow_admit(text, jsonb) TO runcontrol_app;
