"""The dispatcher's signal (issue 24): a statement that makes a run's reminder near
(``runs.next_due_at`` inserted or changed to a time at most 5 seconds ahead, or past)
NOTIFYs ``runcontrol_due`` on commit, so the scheduler sweeps at once instead of after every
commit's events NOTIFY. Whatever sets ``next_due_at`` sends it: the write path's documents, and
any other statement (a flow-control release that makes waiters due with
``UPDATE runs SET next_due_at = now()``) without doing anything more. The payload is empty:
one NOTIFY per transaction, however many runs it made due (PostgreSQL folds identical ones).

Revision ID: 0020
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# Only triggers that NOTIFY: code from 0016 on runs on it unchanged (its scheduler sweeps after
# every events NOTIFY, as before).
oldest_code = "0016"

SQL = """
CREATE FUNCTION runcontrol_notify_due() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('runcontrol_due', '');
    RETURN NULL;
END $fn$;

-- The horizon is the default periodic sweep's interval: a reminder further out is found by
-- the sweep before it comes due (the scheduler then sleeps until it).
CREATE TRIGGER runs_due_inserted AFTER INSERT ON runs
    FOR EACH ROW WHEN (NEW.next_due_at <= now() + interval '5 seconds')
    EXECUTE FUNCTION runcontrol_notify_due();
CREATE TRIGGER runs_due_changed AFTER UPDATE OF next_due_at ON runs
    FOR EACH ROW WHEN (NEW.next_due_at IS DISTINCT FROM OLD.next_due_at
                       AND NEW.next_due_at <= now() + interval '5 seconds')
    EXECUTE FUNCTION runcontrol_notify_due();
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    raise NotImplementedError("0020 has no downgrade: restore from a backup taken before it")
