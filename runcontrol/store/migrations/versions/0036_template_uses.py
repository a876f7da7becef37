"""A run template's uses counted with a guard (issue 44): two runs deciding at once can no
longer pass a pre-approval's maxUses. ``template_uses``, a row per template version and
pre-approval, is counted by ``runcontrol_template_use``, the trigger on ``approval_decisions``
that fires for a template's vote (its new ``pre_approval`` column names which of the version's
pre-approvals decided it): in the vote's own statement, only while the uses are under the
maxUses, else the statement fails (RC431) and the grain decides again on fresh uses. The
writer of approval_decisions takes the new column (applied by name, written by ``make sql``).
The rows are seeded with the uses counted so far (the approvals each version decided, as the
previous release counted them: every pre-approval of a version shares them).

Revision ID: 0036
"""

from __future__ import annotations

from alembic import op

from runcontrol.store.functions import apply

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None

# Only adds (a table, a nullable column, a trigger for votes that name a pre-approval): the
# previous release's votes leave the column NULL and are not counted here, as before.
oldest_code = "0035"

SCHEMA = """
CREATE TABLE template_uses (
    template_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    pre_approval INTEGER NOT NULL,
    tenant_id TEXT NOT NULL,
    uses INTEGER NOT NULL,
    max_uses INTEGER NOT NULL,
    CONSTRAINT template_uses_pkey PRIMARY KEY (tenant_id, template_id, version, pre_approval)
);
ALTER TABLE template_uses ENABLE ROW LEVEL SECURITY;
ALTER TABLE template_uses FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON template_uses
    USING (tenant_id = current_setting('runcontrol.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true));
GRANT SELECT, INSERT, UPDATE ON template_uses TO runcontrol_app;
GRANT SELECT ON template_uses TO runcontrol_system;
ALTER TABLE approval_decisions ADD COLUMN pre_approval INTEGER;
INSERT INTO template_uses (template_id, version, pre_approval, tenant_id, uses, max_uses)
    SELECT t.template_id, t.version, (p.ordinality - 1)::int, t.tenant_id,
           (SELECT count(*) FROM approval_requests a
            WHERE a.decided_by = 'template:' || t.template_id || '@' || t.version),
           (p.value->>'maxUses')::int
    FROM run_templates t, jsonb_array_elements(t.content->'preApprovals') WITH ORDINALITY p;
"""

TRIGGER = """
CREATE TRIGGER template_use AFTER INSERT ON approval_decisions FOR EACH ROW
    WHEN (NEW.pre_approval IS NOT NULL)
    EXECUTE FUNCTION runcontrol_template_use();
"""

FUNCTIONS = {
    "runcontrol_template_use": "4014ea676560bb5df4d0db976b9b3757",
    "runcontrol_write_approval_decisions": "06ac12f1d45d03a826fc6f6cd11fd8a4",
}


def upgrade() -> None:
    op.execute(SCHEMA)
    apply(FUNCTIONS)
    op.execute(TRIGGER)


def downgrade() -> None:
    raise NotImplementedError("0036 has no downgrade: restore from a backup taken before it")
