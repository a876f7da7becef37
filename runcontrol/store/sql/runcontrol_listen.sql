-- A channel is NOTIFYed only while somebody listens on it (issue 33). A NOTIFY is not free
-- without a listener: PreCommit_Notify takes a database-wide lock that serialises every
-- notifying commit until it ends; the processes LISTEN only while a stream or a long poll
-- waits (store/notify.Listener, idle_s).
--
-- A listener registers its channels here after it LISTENs and before its waiters re-read the
-- store. No wake-up is lost between the two: a document checks for a listener
-- (runcontrol_listened) holding ACCESS SHARE on runcontrol_listeners until its transaction
-- ends, and the registration takes ACCESS EXCLUSIVE, so it waits until every transaction that
-- found no listener has committed (the waiters' re-read then sees it), and every later check
-- waits for the registration and sees it (a new snapshot per statement: the lock is taken by a
-- statement of its own, before the check reads). A transaction that checks after the
-- registration commits NOTIFYs, and its NOTIFY reaches the LISTEN made before. Unregistering
-- (runcontrol_unlisten) needs no lock (a NOTIFY too many is harmless). The rows of a backend
-- that died without unregistering are swept by every registration and unregistration; until
-- then they only cost NOTIFYs.
CREATE OR REPLACE FUNCTION runcontrol_listen(channels text[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $fn$
BEGIN
    LOCK TABLE runcontrol_listeners IN ACCESS EXCLUSIVE MODE;
    DELETE FROM runcontrol_listeners l
     WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.pid);
    INSERT INTO runcontrol_listeners (channel, pid)
        SELECT DISTINCT c, pg_backend_pid() FROM unnest(channels) c
        ON CONFLICT DO NOTHING;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_listen(text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_listen(text[]) TO runcontrol_app, runcontrol_system;
