-- The baseline's triggers (0029_baseline.py runs this after the functions they execute; the
-- run's pins trigger, runs_keep_pins, is rendered with its function by store/writers.py).

-- The append-only tables refuse UPDATE, DELETE and TRUNCATE, even to the owner; the one
-- sanctioned removal is the journal's retention purge (runcontrol_purge_journal).
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY[
        'recovery_journal', 'audit_log', 'approval_decisions', 'cancellation_intents'
    ] LOOP
        EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE ON %I
            FOR EACH ROW EXECUTE FUNCTION runcontrol_forbid_mutation()', t || '_append_only', t);
        EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I
            FOR EACH STATEMENT EXECUTE FUNCTION runcontrol_forbid_mutation()',
            t || '_no_truncate', t);
    END LOOP;
END $$;

-- A process caching a tenant's current policy and release aliases drops them on this NOTIFY.
CREATE TRIGGER config_changed AFTER INSERT OR UPDATE ON policies
    FOR EACH ROW EXECUTE FUNCTION runcontrol_config_changed();
CREATE TRIGGER config_changed AFTER INSERT OR UPDATE ON release_aliases
    FOR EACH ROW EXECUTE FUNCTION runcontrol_config_changed();

-- A flow slot is freed in the transaction that makes its holder terminal (the attempt for a
-- step's key and the tenant's cap, the run for a workflow-wide key): runcontrol_flow_*.sql.
CREATE TRIGGER flow_attempt_settled AFTER UPDATE OF state ON attempts FOR EACH ROW
    WHEN (OLD.state IN ('Dispatched', 'Leased', 'Parked') AND NEW.state <> OLD.state
          AND NEW.state NOT IN ('Dispatched', 'Leased'))
    EXECUTE FUNCTION runcontrol_flow_attempt_settled();
CREATE TRIGGER flow_run_ended AFTER UPDATE OF state ON runs FOR EACH ROW
    WHEN (NEW.state IN ('Completed', 'Failed', 'Cancelled')
          AND OLD.state NOT IN ('Completed', 'Failed', 'Cancelled'))
    EXECUTE FUNCTION runcontrol_flow_run_ended();

-- The dispatcher's signal: a run's reminder made near (at most 5 seconds ahead, the default
-- periodic sweep's interval, or past) NOTIFYs runcontrol_due on commit (runcontrol_notify_due).
-- A reminder further out is found by the sweep before it comes due.
CREATE TRIGGER runs_due_inserted AFTER INSERT ON runs
    FOR EACH ROW WHEN (NEW.next_due_at <= now() + interval '5 seconds')
    EXECUTE FUNCTION runcontrol_notify_due();
CREATE TRIGGER runs_due_changed AFTER UPDATE OF next_due_at ON runs
    FOR EACH ROW WHEN (NEW.next_due_at IS DISTINCT FROM OLD.next_due_at
                       AND NEW.next_due_at <= now() + interval '5 seconds')
    EXECUTE FUNCTION runcontrol_notify_due();
