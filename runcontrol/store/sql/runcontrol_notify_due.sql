-- The dispatcher's signal (issue 24): a statement that makes a run's reminder near NOTIFYs
-- runcontrol_due on commit (the triggers runs_due_inserted and runs_due_changed), so the
-- scheduler sweeps at once instead of after every commit's events NOTIFY. Whatever sets
-- next_due_at sends it: the write path's documents, and any other statement (a flow-control
-- release that makes waiters due with UPDATE runs SET next_due_at = now()). The payload is
-- empty: one NOTIFY per transaction, however many runs it made due (PostgreSQL folds
-- identical ones).
CREATE OR REPLACE FUNCTION runcontrol_notify_due() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('runcontrol_due', '');
    RETURN NULL;
END $fn$;
