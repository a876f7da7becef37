-- Retention's removal from the journal: owned by the schema owner, callable by the system
-- role, deleting only entries older than the cutoff: the event rows that carry them (0033:
-- their payload went at the events' horizon) and the entries written before 0033.
CREATE OR REPLACE FUNCTION runcontrol_purge_journal(cutoff timestamptz) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public AS $$
DECLARE
    removed bigint;
    carried bigint;
BEGIN
    PERFORM set_config('runcontrol.retention_purge', 'on', true);
    DELETE FROM recovery_journal_legacy WHERE occurred_at < cutoff;
    GET DIAGNOSTICS removed = ROW_COUNT;
    WITH gone AS (
        DELETE FROM outbox WHERE journal IS NOT NULL AND occurred_at < cutoff RETURNING journal
    )
    SELECT coalesce(sum(jsonb_array_length(journal)), 0) INTO carried FROM gone;
    PERFORM set_config('runcontrol.retention_purge', 'off', true);
    RETURN removed + carried;
END $$;
REVOKE ALL ON FUNCTION runcontrol_purge_journal(timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_purge_journal(timestamptz) TO runcontrol_system;
