"""Group commit: ``runcontrol_apply_many(docs jsonb)``.

The grain commands one process commits at the same moment share one statement and one commit
(``runcontrol/store/group.py``). Each document runs through ``runcontrol_apply`` (0002) in its
own subtransaction, so one that fails (a lost race, a used idempotency key, a deadlock between
two activations) rolls back only itself; the others commit together, each still with its outbox
and journal rows (invariant 3). It answers, in order, null for a document committed or
``[SQLSTATE, message]`` for one rolled back. Like 0002 it runs as the caller, under row-level
security.

Revision ID: 0003
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

APP_ROLE = "runcontrol_app"

APPLY_MANY = """
CREATE FUNCTION runcontrol_apply_many(docs jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $fn$
DECLARE
    doc jsonb;
    answers jsonb := '[]'::jsonb;
BEGIN
    FOR doc IN SELECT value FROM jsonb_array_elements(docs) LOOP
        BEGIN
            PERFORM runcontrol_apply(doc);
            answers := answers || jsonb_build_array(NULL::text);
        EXCEPTION WHEN OTHERS THEN
            answers := answers || jsonb_build_array(jsonb_build_array(SQLSTATE, SQLERRM));
        END;
    END LOOP;
    RETURN answers;
END $fn$"""


def upgrade() -> None:
    op.execute(APPLY_MANY)
    op.execute("REVOKE ALL ON FUNCTION runcontrol_apply_many(jsonb) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION runcontrol_apply_many(jsonb) TO {APP_ROLE}")


def downgrade() -> None:
    op.execute("DROP FUNCTION runcontrol_apply_many(jsonb)")
