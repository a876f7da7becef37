-- Migration 0026 (issue 33): runcontrol_apply updates only the run columns a document
-- carries (mode "patch", runcontrol_patch_runs from 0026_writers.sql, run before this file),
-- and NOTIFYs a channel only while somebody listens on it.
--
-- A "patch" document's run holds its run_id and the columns that changed since the run was
-- loaded or last committed (store/commit.prepare); the update is guarded by the version as
-- "update" is, and the columns left out keep their stored values (an unchanged input is not
-- sent, parsed or written again). 0014's "update" (a whole row: the previous release's
-- documents) is applied as before.
--
-- Every commit with events NOTIFYed runcontrol_events (its run) and each agent it dispatched
-- to runcontrol_dispatch, ~6 NOTIFYs a run, though the processes LISTEN only while a stream
-- or a long poll waits (store/notify.Listener, idle_s). A NOTIFY is not free without a
-- listener: PreCommit_Notify takes a database-wide lock that serialises every notifying
-- commit until it ends.
--
-- A listener registers its channels (runcontrol_listen) after it LISTENs and before its
-- waiters re-read the store. No wake-up is lost between the two: a document checks for a
-- listener (runcontrol_listened) holding ACCESS SHARE on runcontrol_listeners until its
-- transaction ends, and the registration takes ACCESS EXCLUSIVE, so it waits until every
-- transaction that found no listener has committed (the waiters' re-read then sees it), and
-- every later check waits for the registration and sees it (a new snapshot per statement:
-- the lock is taken by a statement of its own, before the check reads). A transaction that
-- checks after the registration commits NOTIFYs, and its NOTIFY reaches the LISTEN made
-- before. Unregistering needs no lock (a NOTIFY too many is harmless). The rows of a backend
-- that died without unregistering are swept by every registration and unregistration; until
-- then they only cost NOTIFYs, as before this migration.
--
-- The documents name the run and agents to wake "wake_run" and "wake_agents"; 0014's
-- "notify_run" and "notify_agents" (the previous release's documents) still NOTIFY always.

CREATE UNLOGGED TABLE runcontrol_listeners (
    channel text NOT NULL,
    pid integer NOT NULL,
    CONSTRAINT runcontrol_listeners_pkey PRIMARY KEY (channel, pid)
);
REVOKE ALL ON runcontrol_listeners FROM PUBLIC;
GRANT SELECT ON runcontrol_listeners TO runcontrol_app, runcontrol_system;

CREATE FUNCTION runcontrol_listen(channels text[]) RETURNS void
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

CREATE FUNCTION runcontrol_unlisten() RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $fn$
    DELETE FROM runcontrol_listeners l
     WHERE l.pid = pg_backend_pid()
        OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.pid);
$fn$;
REVOKE ALL ON FUNCTION runcontrol_unlisten() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_unlisten() TO runcontrol_app, runcontrol_system;

-- Whether a backend listens on the channel; the lock is kept until the transaction ends.
CREATE FUNCTION runcontrol_listened(channel text) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    LOCK TABLE runcontrol_listeners IN ACCESS SHARE MODE;
    RETURN EXISTS (SELECT 1 FROM runcontrol_listeners l WHERE l.channel = $1);
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_listened(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_listened(text) TO runcontrol_app, runcontrol_system;

-- 0021's runcontrol_apply is not restated: renamed, and called by the new one after it has
-- patched the run (0021's writes the run first too, and ignores the mode "patch"), which then
-- sends the document's wake-ups to the channels somebody listens on.
ALTER FUNCTION runcontrol_apply(jsonb) RENAME TO runcontrol_apply_0021;
REVOKE ALL ON FUNCTION runcontrol_apply_0021(jsonb) FROM PUBLIC;

CREATE FUNCTION runcontrol_apply(doc jsonb) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF doc->>'mode' = 'patch' THEN
        PERFORM set_config('runcontrol.tenant_id', doc->>'tenant', true);
        IF NOT runcontrol_patch_runs(doc->'run', (doc->>'expected_version')::bigint) THEN
            RAISE EXCEPTION 'the run changed since it was loaded' USING ERRCODE = 'RC409';
        END IF;
    END IF;
    PERFORM runcontrol_apply_0021(doc);
    -- Nested, not ANDed: SQL does not promise to evaluate the key test first.
    IF doc ? 'wake_agents' THEN
        IF runcontrol_listened('runcontrol_dispatch') THEN
            PERFORM pg_notify('runcontrol_dispatch', agent)
                FROM jsonb_array_elements_text(doc->'wake_agents') agent;
        END IF;
    END IF;
    IF doc ? 'wake_run' THEN
        IF runcontrol_listened('runcontrol_events') THEN
            PERFORM pg_notify('runcontrol_events', doc->>'wake_run');
        END IF;
    END IF;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_apply(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_apply(jsonb) TO runcontrol_app;
