-- An attempt settled: its slots free, in its own transaction, and the next waiters move up.
-- An attempt parked for an approval frees only its slot of the tenant's cap (which counts
-- Dispatched and Leased attempts, docs/approvals.md); a concurrency key stays held until the
-- attempt ends (the work it guards is half done).
CREATE OR REPLACE FUNCTION runcontrol_flow_attempt_settled() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT tenant_id, name, key FROM flow_slots
             WHERE attempt_id = NEW.attempt_id AND (NEW.state <> 'Parked' OR kind = 'capacity')
             ORDER BY kind = 'capacity', name, key LOOP  -- flow.lock_order
        PERFORM runcontrol_flow_lock(s.tenant_id, s.name, s.key);
        DELETE FROM flow_slots WHERE tenant_id = s.tenant_id AND name = s.name AND key = s.key
            AND attempt_id = NEW.attempt_id;
        PERFORM runcontrol_flow_promote(s.tenant_id, s.name, s.key);
    END LOOP;
    RETURN NULL;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_flow_attempt_settled() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_flow_attempt_settled() TO runcontrol_app;
