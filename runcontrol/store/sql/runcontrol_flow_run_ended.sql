-- A run ended: every slot it holds frees and it leaves every queue it waits in, in the
-- transaction that ends it; the next waiters move up.
CREATE OR REPLACE FUNCTION runcontrol_flow_run_ended() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT tenant_id, name, key, kind FROM (
                 SELECT tenant_id, name, key, kind FROM flow_slots WHERE run_id = NEW.run_id
                 UNION SELECT tenant_id, name, key, kind FROM flow_waiters
                       WHERE run_id = NEW.run_id
             ) k ORDER BY kind = 'capacity', name, key LOOP  -- flow.lock_order
        PERFORM runcontrol_flow_lock(s.tenant_id, s.name, s.key);
        DELETE FROM flow_slots WHERE tenant_id = s.tenant_id AND name = s.name AND key = s.key
            AND run_id = NEW.run_id;
        DELETE FROM flow_waiters WHERE tenant_id = s.tenant_id AND name = s.name
            AND key = s.key AND run_id = NEW.run_id;
        PERFORM runcontrol_flow_promote(s.tenant_id, s.name, s.key);
    END LOOP;
    RETURN NULL;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_flow_run_ended() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_flow_run_ended() TO runcontrol_app;
