-- One key's lock: every admission, queueing and release of the key is serialised by it, so
-- two statements can never both take its last slot.
CREATE OR REPLACE FUNCTION runcontrol_flow_lock(tenant text, fname text, fkey text)
RETURNS void LANGUAGE sql AS $fn$
    SELECT pg_advisory_xact_lock(hashtextextended('flow' || chr(31) || tenant || chr(31)
                                                  || fname || chr(31) || fkey, 0));
$fn$;
REVOKE ALL ON FUNCTION runcontrol_flow_lock(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_flow_lock(text, text, text) TO runcontrol_app;
