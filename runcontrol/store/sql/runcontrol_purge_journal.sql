-- Retention's removal from the journal: owned by the schema owner, callable by the system
-- role, deleting only entries older than the cutoff.
CREATE OR REPLACE FUNCTION runcontrol_purge_journal(cutoff timestamptz) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE removed bigint;
BEGIN
    PERFORM set_config('runcontrol.retention_purge', 'on', true);
    DELETE FROM recovery_journal WHERE occurred_at < cutoff;
    GET DIAGNOSTICS removed = ROW_COUNT;
    PERFORM set_config('runcontrol.retention_purge', 'off', true);
    RETURN removed;
END $$;
REVOKE ALL ON FUNCTION runcontrol_purge_journal(timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_purge_journal(timestamptz) TO runcontrol_system;
