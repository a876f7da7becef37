-- Whether a backend listens on the channel; the lock is kept until the transaction ends.
CREATE OR REPLACE FUNCTION runcontrol_listened(channel text) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    LOCK TABLE runcontrol_listeners IN ACCESS SHARE MODE;
    RETURN EXISTS (SELECT 1 FROM runcontrol_listeners l WHERE l.channel = $1);
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_listened(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_listened(text) TO runcontrol_app, runcontrol_system;
