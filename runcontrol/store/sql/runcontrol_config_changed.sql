-- A process caching a tenant's current policy and release aliases drops them on this NOTIFY
-- (payload: the tenant). Releases and policy revisions are immutable.
CREATE OR REPLACE FUNCTION runcontrol_config_changed() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('runcontrol_config', NEW.tenant_id);
    RETURN NULL;
END $fn$;

