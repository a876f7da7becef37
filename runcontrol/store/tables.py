"""SQLAlchemy Core tables. The Alembic migrations are the authority on the schema; a test
checks that these definitions and the migrated database agree."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, DOUBLE_PRECISION, JSONB, UUID

from ..domain.limits import MAX_NAME, MAX_WORKFLOW_ID

metadata = MetaData()


def length_check(table: str, column: str, limit: int) -> CheckConstraint:
    """The database's side of a limit publication checks (``domain/limits.py``, migration
    0025): ``column`` holds 1 to ``limit`` characters."""
    return CheckConstraint(
        f"char_length({column}) BETWEEN 1 AND {limit}", name=f"ck_{table}_{column}"
    )


TZ = DateTime(timezone=True)
# Invariant 2: what a run is pinned to at acceptance never changes. The run's writer leaves these
# columns out of its UPDATE and a trigger refuses a change (both rendered by ``writers.py``).
PIN = {"pinned": True}

runs = Table(
    "runs",
    metadata,
    Column("run_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("project_id", Text, nullable=False),
    Column("environment_id", Text),
    Column("idempotency_key", Text, nullable=False),
    Column("workflow_id", Text, nullable=False),
    Column("release_id", Text, nullable=False, info=PIN),
    Column("release_hash", Text, nullable=False),
    Column("policy_id", Text, nullable=False),
    Column("policy_revision", Text, nullable=False, info=PIN),
    Column("model_profile_id", Text, nullable=False, info=PIN),
    Column("state", Text, nullable=False),
    Column("input_hash", Text, nullable=False),
    Column("snapshot_id", UUID(as_uuid=True), nullable=False, info=PIN),
    Column("budget_reservation_id", UUID(as_uuid=True)),
    Column("requested_by", Text, nullable=False),
    Column("max_cost_usd", Numeric),
    Column("max_minutes", Integer),
    Column("deadline_at", TZ),
    Column("failure_class", Text),
    Column("failure_reason", Text),
    Column("outcome_hash", Text),
    Column("correlation_id", Text),
    Column("input", JSONB),
    Column("version", BigInteger, nullable=False),
    Column("event_seq", BigInteger, nullable=False),
    Column("journal_seq", BigInteger, nullable=False),
    Column("fencing_seq", BigInteger, nullable=False),
    Column("next_due_at", TZ),
    Column("created_at", TZ, nullable=False),
    Column("updated_at", TZ, nullable=False),
    # operator controls (0012): set while suspended; the finished run this one reruns
    Column("suspended_at", TZ),
    Column("rerun_of", UUID(as_uuid=True)),
    # the run's result, its final step's (0015): hash and size; the content is in attempt_results
    Column("result_hash", Text),
    Column("result_bytes", BigInteger),
    # flow control (0017): the run's priority and its workflow-wide concurrency keys
    Column("priority", Integer, nullable=False, server_default=text("3"), info=PIN),
    Column("flow", JSONB, info=PIN),
    # child runs (0024): the run and step that started it, and its depth
    Column("parent_run_id", UUID(as_uuid=True), info=PIN),
    Column("parent_step_id", UUID(as_uuid=True), info=PIN),
    Column("depth", Integer, info=PIN),  # NULL (an older host's insert): 0
    UniqueConstraint("tenant_id", "project_id", "idempotency_key", name="uq_runs_idempotency"),
    Index("ix_runs_list", "tenant_id", "created_at", "run_id"),
    Index("ix_runs_state", "tenant_id", "state", "created_at"),
    Index("ix_runs_workflow", "tenant_id", "workflow_id", "created_at"),
    Index(
        "ix_runs_parent",
        "tenant_id",
        "parent_run_id",
        "created_at",
        postgresql_where=text("parent_run_id IS NOT NULL"),
    ),
    Index(
        "ix_runs_due",
        "next_due_at",
        postgresql_where=text("next_due_at IS NOT NULL"),
    ),
)

steps = Table(
    "steps",
    metadata,
    Column("step_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.run_id"), nullable=False),
    Column("ordinal", Integer, nullable=False),
    Column("name", Text, nullable=False),
    Column("agent_id", Text, nullable=False),
    Column("skill_id", Text),
    Column("state", Text, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("gate", Text, nullable=False),
    Column("side_effect_class", Text, nullable=False),
    Column("not_before", TZ),
    Column("failure_class", Text),
    Column("outcome_hash", Text),
    # the names of the steps it waits for (0016); NULL before graphs: the step before it
    Column("depends_on", JSONB),
    # a step no worker executes (0016): kind 'wait', its timer, and when it fires
    Column("kind", Text, nullable=False, server_default=text("'agent'")),
    Column("wait", JSONB),
    Column("due_at", TZ),
    Column("signal", JSONB),  # a signal step's signal, once received (kept until it waits)
    # flow control (0017): the step's own concurrency keys, and why it is held
    Column("flow", JSONB),
    # the rate-limit buckets its dispatch draws on, and why a Pending step is held (0018)
    Column("rate_limits", JSONB),
    Column("held", JSONB),
    # issue 32 (0024): its condition, a step-no-worker-executes' result, a run step's child
    Column("condition", Text),
    Column("result_json", Text),
    Column("child", JSONB),
    UniqueConstraint("run_id", "ordinal", name="uq_steps_ordinal"),
    Index("ix_steps_held", "tenant_id", postgresql_where=text("held IS NOT NULL")),
)

attempts = Table(
    "attempts",
    metadata,
    Column("attempt_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("step_id", UUID(as_uuid=True), ForeignKey("steps.step_id"), nullable=False),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.run_id"), nullable=False),
    Column("agent_id", Text, nullable=False),
    Column("number", Integer, nullable=False),
    Column("state", Text, nullable=False),
    Column("lease_id", UUID(as_uuid=True)),
    Column("fencing_token", BigInteger),
    Column("holder", Text),
    Column("outcome", Text),
    Column("outcome_hash", Text),
    Column("failure_class", Text),
    Column("dispatched_at", TZ, nullable=False),
    Column("settled_at", TZ),
    Column("settled_by", Text),
    # the last progress message stored (0009); its holder numbers them from 1
    Column("progress_seq", BigInteger, nullable=False, server_default=text("0")),
    UniqueConstraint("step_id", "number", name="uq_attempts_number"),
    Index("ix_attempts_run", "run_id"),
    # Invariant 4 at the database level: one non-terminal attempt per step.
    Index(
        "uq_attempts_open_per_step",
        "step_id",
        unique=True,
        postgresql_where=text("state IN ('Dispatched', 'Leased', 'Parked')"),
    ),
    Index(
        "ix_attempts_claimable",
        "agent_id",
        "dispatched_at",
        postgresql_where=text("state = 'Dispatched'"),
    ),
)

# What an attempt's outcome produced (0015): inserted once with the outcome, never rewritten.
# ``result_json`` is the JSON's canonical text (text, not jsonb: jsonb would rewrite numbers such
# as 1e+20, and the bytes a dependent step receives are the bytes hashed), or ``result_ref`` a
# {uri, sha256, bytes} reference; ``outcome_hash`` is the canonical hash of the one stored.
attempt_results = Table(
    "attempt_results",
    metadata,
    Column("attempt_id", UUID(as_uuid=True), ForeignKey("attempts.attempt_id"), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("step_id", UUID(as_uuid=True), ForeignKey("steps.step_id"), nullable=False),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.run_id"), nullable=False),
    Column("outcome_hash", Text, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", TZ, nullable=False),
    Column("result_json", Text),
    Column("result_ref", JSONB),
    Index("ix_attempt_results_run", "run_id"),
)

leases = Table(
    "leases",
    metadata,
    Column("lease_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("attempt_id", UUID(as_uuid=True), ForeignKey("attempts.attempt_id"), nullable=False),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.run_id"), nullable=False),
    Column("holder", Text, nullable=False),
    Column("fencing_token", BigInteger, nullable=False),
    Column("granted_at", TZ, nullable=False),
    Column("expires_at", TZ, nullable=False),
    Column("released_at", TZ),
    Column("release_cause", Text),
    UniqueConstraint("run_id", "fencing_token", name="uq_leases_token"),
    # Invariant 5 at the database level: exactly one current lease per attempt.
    Index(
        "uq_leases_current_per_attempt",
        "attempt_id",
        unique=True,
        postgresql_where=text("released_at IS NULL"),
    ),
    Index("ix_leases_expiry", "expires_at", postgresql_where=text("released_at IS NULL")),
)

approval_requests = Table(
    "approval_requests",
    metadata,
    Column("approval_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.run_id"), nullable=False),
    Column("step_id", UUID(as_uuid=True), ForeignKey("steps.step_id"), nullable=False),
    Column("attempt_id", UUID(as_uuid=True), ForeignKey("attempts.attempt_id"), nullable=False),
    Column("action_class", Text, nullable=False),
    Column("proposal_hash", Text, nullable=False),
    Column("policy_revision", Text, nullable=False),
    Column("approver_rule", Text, nullable=False),
    Column("required_approvals", Integer, nullable=False),
    Column("requested_by", Text, nullable=False),
    Column("created_at", TZ, nullable=False),
    Column("expires_at", TZ, nullable=False),
    Column("state", Text, nullable=False),
    Column("decided_by", Text),
    Column("decided_at", TZ),
    Column("reason", Text),
    Column("version", BigInteger, nullable=False),
    Index("ix_approvals_run", "run_id"),
    Index("ix_approvals_list", "tenant_id", "state", "created_at"),
    Index(
        "uq_approvals_pending_per_step",
        "step_id",
        unique=True,
        postgresql_where=text("state = 'Pending'"),
    ),
    Index("ix_approvals_expiry", "expires_at", postgresql_where=text("state = 'Pending'")),
)

approval_decisions = Table(
    "approval_decisions",
    metadata,
    Column("approval_id", UUID(as_uuid=True), ForeignKey("approval_requests.approval_id")),
    Column("decided_by", Text),
    Column("tenant_id", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("decision", Text, nullable=False),
    Column("proposal_hash", Text, nullable=False),
    Column("reason", Text),
    Column("break_glass", Boolean, nullable=False),
    Column("decided_at", TZ, nullable=False),
    PrimaryKeyConstraint("approval_id", "decided_by"),
    Index("ix_decisions_run", "run_id"),
)

# Tool calls claimed before their side effect, at most once per run and call id (0009).
# Journaled calls (``step.run``, 0021): the first value recorded per (run, step, name,
# occurrence), insert-only; the primary key keeps one value per key at the database level too.
journaled_calls = Table(
    "journaled_calls",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.run_id"), primary_key=True),
    Column("step_id", UUID(as_uuid=True), ForeignKey("steps.step_id"), primary_key=True),
    Column("name", Text, primary_key=True),
    Column("occurrence", Integer, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("attempt_id", UUID(as_uuid=True), ForeignKey("attempts.attempt_id"), nullable=False),
    Column("fencing_token", BigInteger, nullable=False),
    Column("value_hash", Text, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("recorded_at", TZ, nullable=False),
    Column("value_json", Text),
    Column("error", JSONB),
)
tool_calls = Table(
    "tool_calls",
    metadata,
    Column("tool_call_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.run_id"), nullable=False),
    Column("call_id", Text, nullable=False),
    Column("attempt_id", UUID(as_uuid=True), ForeignKey("attempts.attempt_id"), nullable=False),
    Column("request_hash", Text, nullable=False),
    Column("claimed_by", Text, nullable=False),
    Column("fencing_token", BigInteger, nullable=False),
    Column("claimed_at", TZ, nullable=False),
    Column("expires_at", TZ, nullable=False),
    Column("state", Text, nullable=False),
    Column("result_hash", Text),
    Column("completed_at", TZ),
    Column("error", Text),
    # the result's canonical JSON, stored by a completion that sends it (0021)
    Column("result_json", Text),
    # At most once, at the database level too: one claim per run and call id.
    UniqueConstraint("run_id", "call_id", name="uq_tool_calls_call"),
)

cancellation_intents = Table(
    "cancellation_intents",
    metadata,
    Column("intent_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), ForeignKey("runs.run_id"), nullable=False),
    Column("requested_by", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("requested_at", TZ, nullable=False),
    Index("ix_intents_run", "run_id"),
)

recovery_journal = Table(
    "recovery_journal",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("tenant_id", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("sequence", BigInteger, nullable=False),
    Column("entity", Text, nullable=False),
    Column("entity_id", UUID(as_uuid=True), nullable=False),
    Column("from_state", Text),
    Column("to_state", Text, nullable=False),
    Column("cause", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("occurred_at", TZ, nullable=False),
    UniqueConstraint("run_id", "sequence", name="uq_journal_sequence"),
    Index("ix_journal_occurred", "occurred_at"),
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("event_id", UUID(as_uuid=True), nullable=False, unique=True),
    Column("tenant_id", Text, nullable=False),
    Column("project_id", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("topic", Text, nullable=False),
    Column("event_type", Text, nullable=False),
    Column("step_id", UUID(as_uuid=True)),
    Column("attempt_id", UUID(as_uuid=True)),
    Column("correlation_id", Text),
    Column("causation_id", Text),
    Column("producer", Text, nullable=False),
    Column("schema_version", Integer, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("occurred_at", TZ, nullable=False),
    Column("published_at", TZ),
    UniqueConstraint("run_id", "seq", name="uq_outbox_run_seq"),
    Index("ix_outbox_unpublished", "id", postgresql_where=text("published_at IS NULL")),
)

command_answers = Table(
    "command_answers",
    metadata,
    Column("tenant_id", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("command_id", Text, nullable=False),
    Column("command", Text, nullable=False),
    Column("answer", JSONB, nullable=False),
    Column("created_at", TZ, nullable=False),
    Column("fingerprint", Text),  # what the command asked (commands.fingerprint); 0007
    PrimaryKeyConstraint("tenant_id", "run_id", "command_id"),
    Index("ix_command_answers_created", "created_at"),
    # a resent claim finds the lease it granted by its claim id alone (migration 0013)
    Index(
        "ix_command_answers_claims",
        "command_id",
        postgresql_where=text("command = 'AcquireLease'"),
    ),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("tenant_id", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True)),
    Column("kind", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("detail", JSONB, nullable=False),
    Column("occurred_at", TZ, nullable=False),
    Index("ix_audit_run", "run_id"),
)

releases = Table(
    "releases",
    metadata,
    Column("release_id", Text, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("workflow_id", Text, nullable=False),
    Column("content_hash", Text, nullable=False),
    Column("definition", JSONB, nullable=False),
    Column("published_by", Text, nullable=False),
    Column("published_at", TZ, nullable=False),
    UniqueConstraint("tenant_id", "workflow_id", "content_hash", name="uq_releases_content"),
    length_check("releases", "workflow_id", MAX_WORKFLOW_ID),
)

release_aliases = Table(
    "release_aliases",
    metadata,
    Column("tenant_id", Text),
    Column("workflow_id", Text),
    Column("alias", Text),
    Column("release_id", Text, ForeignKey("releases.release_id"), nullable=False),
    Column("moved_at", TZ, nullable=False),
    PrimaryKeyConstraint("tenant_id", "workflow_id", "alias"),
    length_check("release_aliases", "workflow_id", MAX_WORKFLOW_ID),
    length_check("release_aliases", "alias", MAX_NAME),
)

policies = Table(
    "policies",
    metadata,
    Column("tenant_id", Text),
    Column("policy_id", Text),
    Column("revision", Integer),
    Column("document", JSONB, nullable=False),
    Column("created_at", TZ, nullable=False),
    PrimaryKeyConstraint("tenant_id", "policy_id", "revision"),
)

budget_reservations = Table(
    "budget_reservations",
    metadata,
    Column("reservation_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), nullable=False, unique=True),
    Column("amount_usd", Numeric, nullable=False),
    Column("created_at", TZ, nullable=False),
    Column("released_at", TZ),
    Index("ix_budget_open", "tenant_id", postgresql_where=text("released_at IS NULL")),
)

# Flow control (0017, docs/flow-control.md): the holders of each concurrency key's slots and
# the runs waiting for one. Written only by the dispatching statement's functions and the
# triggers that free a slot in the transaction making its holder terminal; never by a writer.
flow_slots = Table(
    "flow_slots",
    metadata,
    Column("tenant_id", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("key", Text, nullable=False),
    # the run (a workflow-wide key: held for the run's life) or the attempt (a step's key, the
    # tenant's cap: held until the attempt settles)
    Column("holder", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("attempt_id", UUID(as_uuid=True)),
    Column("kind", Text, nullable=False),
    Column("max_holders", Integer, nullable=False),
    Column("taken_at", TZ, nullable=False),
    PrimaryKeyConstraint("tenant_id", "name", "key", "holder", name="pk_flow_slots"),
    Index("ix_flow_slots_run", "run_id"),
    Index("ix_flow_slots_attempt", "attempt_id", postgresql_where=text("attempt_id IS NOT NULL")),
)

flow_waiters = Table(
    "flow_waiters",
    metadata,
    Column("tenant_id", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("key", Text, nullable=False),
    Column("holder", Text, nullable=False),  # the run (workflow-wide key) or the step
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("step_id", UUID(as_uuid=True)),
    Column("kind", Text, nullable=False),
    Column("max_holders", Integer, nullable=False),
    Column("priority", Integer, nullable=False),
    Column("seq", BigInteger, nullable=False),  # arrival order (flow_waiters_seq)
    # given the next free slot: its run is due, and its dispatch is admitted on it
    Column("promoted", Boolean, nullable=False),
    Column("enqueued_at", TZ, nullable=False),
    PrimaryKeyConstraint("tenant_id", "name", "key", "holder", name="pk_flow_waiters"),
    Index("ix_flow_waiters_order", "tenant_id", "name", "key", "promoted", "priority", "seq"),
    Index("ix_flow_waiters_run", "run_id"),
)

# Rate limits (0018): one GCRA bucket per (tenant, bucket) shared by every host; ``tat`` is its
# theoretical arrival time, ``per_second`` and ``burst`` the terms of its last reservation.
rate_buckets = Table(
    "rate_buckets",
    metadata,
    Column("tenant_id", Text, nullable=False),
    Column("bucket", Text, nullable=False),
    Column("tat", TZ, nullable=False),
    Column("per_second", DOUBLE_PRECISION, nullable=False),
    Column("burst", DOUBLE_PRECISION, nullable=False),
    Column("updated_at", TZ, nullable=False),
    PrimaryKeyConstraint("tenant_id", "bucket"),
)

# Streamed output (0022, docs/streaming.md): each chunk a lease holder wrote, by its position
# in the run (gap-free, in commit order: the readers' cursor); ``seq`` numbers it in its attempt
# and (``fencing_token``, ``lease_seq``) is the holder's own number, what a resend repeats.
# Written only by ``runcontrol_append_output``; kept as long as the event history.
output_chunks = Table(
    "output_chunks",
    metadata,
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("attempt_id", UUID(as_uuid=True), nullable=False),
    Column("step_id", UUID(as_uuid=True), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("fencing_token", BigInteger, nullable=False),
    Column("lease_seq", BigInteger, nullable=False),
    Column("attempt_bytes", BigInteger, nullable=False),  # the attempt's total up to this one
    Column("text", Text),
    Column("data_json", Text),  # canonical JSON text (jsonb would rewrite its numbers)
    Column("written_at", TZ, nullable=False),
    PrimaryKeyConstraint("run_id", "position"),
    UniqueConstraint("attempt_id", "seq", name="uq_output_chunks_seq"),
    Index("ix_output_chunks_written", "written_at"),
)

# The last output position of each run that streamed: its row lock orders the run's writes.
output_heads = Table(
    "output_heads",
    metadata,
    Column("run_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("updated_at", TZ, nullable=False),
    Index("ix_output_heads_updated", "updated_at"),
)

# Events out (0010): the tenant-wide feed position of each published event, webhook
# subscriptions and one delivery row per (subscription, event).
event_feed = Table(
    "event_feed",
    metadata,
    Column("position", BigInteger, primary_key=True, autoincrement=True),
    Column("event_id", UUID(as_uuid=True), nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("project_id", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("published_at", TZ, nullable=False),
    UniqueConstraint("event_id", name="uq_event_feed_event"),
    ForeignKeyConstraint(
        ["event_id"], ["outbox.event_id"], name="fk_event_feed_outbox", ondelete="CASCADE"
    ),
    Index("ix_event_feed_tenant", "tenant_id", "position"),
)

webhook_subscriptions = Table(
    "webhook_subscriptions",
    metadata,
    Column("subscription_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("url", Text, nullable=False),
    Column("secret", Text, nullable=False),
    Column("description", Text),
    Column("max_attempts", Integer, nullable=False),
    Column("created_by", Text, nullable=False),
    Column("created_at", TZ, nullable=False),
    Column("starts_after", BigInteger, nullable=False),
    Column("disabled_at", TZ),
    # A run's subscription (0028: an A2A task's push config): only that run's events of
    # ``event_types`` (NULL: every type), rendered by ``format`` (``event``: the signed envelope).
    Column("run_id", UUID(as_uuid=True)),
    Column("event_types", ARRAY(Text)),
    Column("format", Text, nullable=False, server_default="event"),
    Index("ix_webhook_subscriptions_tenant", "tenant_id", "created_at"),
    Index("ix_webhook_subscriptions_run", "run_id", postgresql_where=text("run_id IS NOT NULL")),
)

webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("subscription_id", UUID(as_uuid=True), nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("state", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", TZ, nullable=False),
    Column("last_status", Integer),
    Column("last_error", Text),
    Column("delivered_at", TZ),
    Column("updated_at", TZ, nullable=False),
    PrimaryKeyConstraint("subscription_id", "position"),
    ForeignKeyConstraint(
        ["subscription_id"],
        ["webhook_subscriptions.subscription_id"],
        name="fk_deliveries_subscription",
        ondelete="CASCADE",
    ),
    ForeignKeyConstraint(
        ["position"], ["event_feed.position"], name="fk_deliveries_feed", ondelete="CASCADE"
    ),
    Index(
        "ix_webhook_deliveries_pending",
        "subscription_id",
        "run_id",
        "seq",
        postgresql_where=text("state = 'Pending'"),
    ),
    Index("ix_webhook_deliveries_position", "position"),
)

# A2A push notification configs (0028): one per (task, owner, config id), delivered through
# the run's webhook subscription (its URL, retries, dead letters); the token and the
# authentication are A2A's headers, never shown to another owner.
a2a_push_configs = Table(
    "a2a_push_configs",
    metadata,
    Column("run_id", UUID(as_uuid=True), nullable=False),
    Column("owner", Text, nullable=False),
    Column("config_id", Text, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("subscription_id", UUID(as_uuid=True), nullable=False),
    Column("token", Text),
    Column("auth_scheme", Text),
    Column("auth_credentials", Text),
    Column("created_at", TZ, nullable=False),
    Column("updated_at", TZ, nullable=False),
    PrimaryKeyConstraint("run_id", "owner", "config_id"),
    UniqueConstraint("subscription_id", name="uq_a2a_push_configs_subscription"),
    ForeignKeyConstraint(
        ["subscription_id"],
        ["webhook_subscriptions.subscription_id"],
        name="fk_a2a_push_configs_subscription",
        ondelete="CASCADE",
    ),
)

# Schedules (0023): a tenant's schedules with their durable sweep state (the last nominal fire
# time handled, the next one due), and one row per fire time handled (not for missed ones).
schedules = Table(
    "schedules",
    metadata,
    Column("schedule_id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("project_id", Text, nullable=False),
    Column("owner", Text, nullable=False),  # the subject whose runs it starts
    Column("owner_roles", JSONB, nullable=False),
    Column("owner_scopes", JSONB, nullable=False),
    Column("spec", JSONB, nullable=False),  # domain.schedules.ScheduleSpec
    Column("paused", Boolean, nullable=False),
    Column("note", Text),
    Column("last_nominal_at", TZ),  # the last nominal fire time the sweep handled
    Column("next_fire_at", TZ),  # when the next one is due (nominal + jitter); None: ended
    Column("buffered_at", TZ),  # buffer-one: the nominal time waiting for the open run
    Column("started", BigInteger, nullable=False),
    Column("skipped", BigInteger, nullable=False),
    Column("missed", BigInteger, nullable=False),
    Column("created_at", TZ, nullable=False),
    Column("updated_at", TZ, nullable=False),
    Index("ix_schedules_due", "next_fire_at", postgresql_where=text("NOT paused")),
    Index("ix_schedules_tenant", "tenant_id", "created_at"),
)

schedule_fires = Table(
    "schedule_fires",
    metadata,
    Column("schedule_id", UUID(as_uuid=True), nullable=False),
    Column("nominal_at", TZ, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("kind", Text, nullable=False),  # domain.schedules.FireKind
    Column("outcome", Text, nullable=False),  # domain.schedules.FireOutcome
    Column("run_id", UUID(as_uuid=True)),  # once submitted
    Column("submitted_at", TZ),  # a started fire not yet submitted has None
    Column("cancels", JSONB),  # cancel-other: the open runs it cancels
    Column("error", Text),  # the submission's refusal (a started fire that started nothing)
    Column("recorded_at", TZ, nullable=False),
    PrimaryKeyConstraint("schedule_id", "nominal_at"),
    ForeignKeyConstraint(
        ["schedule_id"],
        ["schedules.schedule_id"],
        name="fk_schedule_fires_schedule",
        ondelete="CASCADE",
    ),
    Index(
        "ix_schedule_fires_unsubmitted",
        "schedule_id",
        postgresql_where=text("outcome = 'started' AND submitted_at IS NULL"),
    ),
)

# Who LISTENs on which channel (0026, issue 33): a row per (channel, backend pid) while a
# process's listener listens (``store/notify.Listener``, through ``runcontrol_listen``);
# ``runcontrol_apply`` NOTIFYs a channel only when it has one. A process's, not a tenant's.
listeners = Table(
    "runcontrol_listeners",
    metadata,
    Column("channel", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    PrimaryKeyConstraint("channel", "pid"),
    prefixes=["UNLOGGED"],  # after a crash no backend listens either
)

RUN_PINS = tuple(str(c.name) for c in runs.columns if c.info.get("pinned"))
TENANT_TABLES = tuple(name for name, t in metadata.tables.items() if "tenant_id" in t.columns)
APPEND_ONLY_TABLES = ("recovery_journal", "audit_log", "approval_decisions", "cancellation_intents")
# The app role adds rows to these and never changes them (command answers: the system role
# prunes them past the resend window).
INSERT_ONLY_TABLES = (
    *APPEND_ONLY_TABLES,
    "command_answers",
    "attempt_results",
    "journaled_calls",
    "output_chunks",
)
# The write path only adds rows to these: their writers insert, never upsert (the relay marks
# outbox rows published on the system path).
APPENDED_TABLES = (*INSERT_ONLY_TABLES, "outbox")
# The app role only reads these (the relay writes them on the system path).
READ_ONLY_TABLES = ("event_feed",)
