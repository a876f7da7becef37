"""The fence of a shard's move on the writes that are not documents (issue 41; docs/sharding.md
"Moving a tenant"): ``runcontrol_fenced_write``, a trigger BEFORE each row's INSERT, UPDATE or
DELETE on the tenant tables written outside ``runcontrol_apply_document`` (``FENCED``: a
release published, an alias moved, a policy revision, a schedule and its fires, a webhook
subscription, an A2A push config, a template and its uses, a rate bucket). A write of a fenced
tenant is refused in its own transaction (RC421: ``errors.ShardMoved``, route again), under the
fence's lock taken shared: the fence waits for the writes in flight, so none lands between the
move's verification and its flip. The system role may now run ``runcontrol_check_fence`` (the
scheduler's sweep writes schedules).

The tables the documents write keep no trigger (their writes are fenced by the document's one
check). Applied by name as ``runcontrol/store/sql/`` makes it today.

Revision ID: 0040
"""

from __future__ import annotations

from alembic import op

from runcontrol.store.functions import apply

revision = "0040"
down_revision = "0039"
branch_labels = None
depends_on = None

# Refuses nothing until a move writes a fence (and a move needs 0034): the previous release
# runs on it unchanged.
oldest_code = "0038"

FUNCTIONS = {
    "runcontrol_fenced_write": "b7ec5dca6d5cfba559da44c3cfb0b995",
}

FENCED = (
    "releases",
    "release_aliases",
    "policies",
    "schedules",
    "schedule_fires",
    "webhook_subscriptions",
    "a2a_push_configs",
    "run_templates",
    "template_uses",
    "rate_buckets",
)


def upgrade() -> None:
    apply(FUNCTIONS)
    for table in FENCED:
        op.execute(
            f"CREATE TRIGGER fenced_write BEFORE INSERT OR UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION runcontrol_fenced_write()"
        )
    op.execute("GRANT EXECUTE ON FUNCTION runcontrol_check_fence(text) TO runcontrol_system")


def downgrade() -> None:
    raise NotImplementedError("0040 has no downgrade: restore from a backup taken before it")
