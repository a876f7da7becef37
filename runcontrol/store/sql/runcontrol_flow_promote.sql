-- Give the key's free slots to its next waiters (priority desc, then arrival) and make their
-- runs due. The caller holds the key's lock.
CREATE OR REPLACE FUNCTION runcontrol_flow_promote(tenant text, fname text, fkey text)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    taken bigint;
    head flow_waiters%ROWTYPE;
BEGIN
    LOOP
        SELECT (SELECT count(*) FROM flow_slots
                    WHERE tenant_id = tenant AND name = fname AND key = fkey)
             + (SELECT count(*) FROM flow_waiters
                    WHERE tenant_id = tenant AND name = fname AND key = fkey AND promoted)
            INTO taken;
        SELECT * INTO head FROM flow_waiters
            WHERE tenant_id = tenant AND name = fname AND key = fkey AND NOT promoted
            ORDER BY priority DESC, seq LIMIT 1;
        EXIT WHEN NOT FOUND OR taken >= head.max_holders;
        UPDATE flow_waiters SET promoted = true
            WHERE tenant_id = tenant AND name = fname AND key = fkey AND holder = head.holder;
        UPDATE runs AS r SET next_due_at = LEAST(coalesce(r.next_due_at, now()), now())
            WHERE r.run_id = head.run_id AND r.state NOT IN ('Completed', 'Failed', 'Cancelled');
    END LOOP;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_flow_promote(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_flow_promote(text, text, text) TO runcontrol_app;
