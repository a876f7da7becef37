-- A listener's channels unregistered (runcontrol_listen says why no lock is needed), and the
-- rows of backends gone since swept.
CREATE OR REPLACE FUNCTION runcontrol_unlisten() RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $fn$
    DELETE FROM runcontrol_listeners l
     WHERE l.pid = pg_backend_pid()
        OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.pid);
$fn$;
REVOKE ALL ON FUNCTION runcontrol_unlisten() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_unlisten() TO runcontrol_app, runcontrol_system;
