-- A document that dispatched under a cap on the tenant's open attempts: the check is serialised
-- per tenant and counts the document's own rows (RC429 rolls back this document only; the grain
-- decides again without the dispatch).
CREATE OR REPLACE FUNCTION runcontrol_check_capacity(tenant text, cap int)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    open_attempts bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('capacity:' || tenant));
    SELECT count(*) INTO open_attempts FROM attempts WHERE state IN ('Dispatched', 'Leased');
    IF open_attempts > cap THEN
        RAISE EXCEPTION 'tenant capacity exhausted: at most % open attempts', cap
            USING ERRCODE = 'RC429';
    END IF;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_check_capacity(text, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_check_capacity(text, int) TO runcontrol_app;
