"""SQLAlchemy Core tables. The Alembic migrations are the authority on the schema; a test
checks that these definitions and the migrated database agree. In the words of
``columns.py``: a name ending in ``?`` is a nullable column, ``tenant_table`` gives a table its
``tenant_id`` and marks its row-level-security policies."""

from __future__ import annotations

from sqlalchemy import Index, MetaData, PrimaryKeyConstraint, Table, UniqueConstraint, text

from ..domain.limits import MAX_NAME, MAX_WORKFLOW_ID
from .columns import PIN as PIN
from .columns import TZ as TZ
from .columns import (
    big,
    bigints,
    cascade,
    flag,
    index_where,
    jsonb,
    length_check,
    num,
    real,
    ref,
    serial,
    tenant_table,
    texts,
    txt,
    tz,
    uid,
    usd,
)
from .columns import metadata as metadata
from .rls import POLICIES, PROJECT_READS, PROJECT_ROWS, RETENTION_PURGE

# The rows a partial index covers.
PARENT = "parent_run_id IS NOT NULL"
OPEN_ATTEMPT = "state IN ('Dispatched', 'Leased', 'Parked')"
DISPATCHED = "state = 'Dispatched'"
PENDING = "state = 'Pending'"
UNRELEASED = "released_at IS NULL"
TENANT_WIDE = "run_id IS NULL AND disabled_at IS NULL"
UNSUBMITTED = "outcome = 'started' AND submitted_at IS NULL"
OPEN_MOVE = "step NOT IN ('done', 'aborted')"
PUBLISHED = "feed_position IS NOT NULL"


runs = tenant_table(
    "runs",
    uid("run_id", primary_key=True),
    txt("project_id", "environment_id?", "idempotency_key", "workflow_id"),
    txt("release_id", info=PIN) + txt("release_hash", "policy_id"),
    txt("policy_revision", "model_profile_id", info=PIN) + txt("state", "input_hash"),
    uid("snapshot_id", info=PIN) + uid("budget_reservation_id?") + txt("requested_by"),
    usd("max_cost_usd?") + num("max_minutes?") + tz("deadline_at?"),  # its limits
    txt("failure_class?", "failure_reason?", "outcome_hash?", "correlation_id?"),
    jsonb("input?"),
    big("version", "event_seq", "journal_seq", "fencing_seq"),
    tz("next_due_at?", "created_at", "updated_at"),
    # operator controls (0012): set while suspended; the finished run this one reruns
    tz("suspended_at?") + uid("rerun_of?"),
    # the run's result, its final step's (0015): hash and size; the content is in attempt_results
    txt("result_hash?") + big("result_bytes?"),
    # flow control (0017): the run's priority and its workflow-wide concurrency keys
    num("priority", server_default=text("3"), info=PIN) + jsonb("flow?", info=PIN),
    # child runs (0024): the run and step that started it, and its depth
    uid("parent_run_id?", "parent_step_id?", info=PIN),
    num("depth?", info=PIN),  # NULL (an older host's insert): 0
    # the template it was submitted from (0032, issue 44) and, for a replay (0037,
    # docs/replay.md), the run it replays and how: pinned at acceptance (0038; in the baseline's
    # SQL too, so that the pins' trigger can name them there)
    txt("template_id?", info=PIN) + num("template_version?", info=PIN),
    uid("replay_of?", info=PIN) + jsonb("replay?", info=PIN),
    UniqueConstraint("tenant_id", "project_id", "idempotency_key", name="uq_runs_idempotency"),
    Index("ix_runs_list", "tenant_id", "created_at", "run_id"),
    Index("ix_runs_state", "tenant_id", "state", "created_at"),
    Index("ix_runs_workflow", "tenant_id", "workflow_id", "created_at"),
    index_where("ix_runs_parent", "tenant_id", "parent_run_id", "created_at", where=PARENT),
    index_where("ix_runs_due", "next_due_at", where="next_due_at IS NOT NULL"),
    policies=(PROJECT_READS,),
)

steps = tenant_table(
    "steps",
    uid("step_id", primary_key=True),
    ref("run_id") + num("ordinal"),
    txt("name", "agent_id", "skill_id?", "state") + num("max_attempts"),
    txt("gate", "side_effect_class") + tz("not_before?"),
    txt("failure_class?", "outcome_hash?"),
    # the names of the steps it waits for (0016); NULL before graphs: the step before it
    jsonb("depends_on?"),
    # a step no worker executes (0016): kind 'wait', its timer, and when it fires
    txt("kind", server_default=text("'agent'")) + jsonb("wait?") + tz("due_at?"),
    jsonb("signal?"),  # a signal step's signal, once received (kept until it waits)
    # flow control (0017): the step's own concurrency keys, and why it is held
    jsonb("flow?"),
    # the rate-limit buckets its dispatch draws on, and why a Pending step is held (0018)
    jsonb("rate_limits?", "held?"),
    # issue 32 (0024): its condition, a step-no-worker-executes' result, a run step's child
    txt("condition?", "result_json?") + jsonb("child?"),
    UniqueConstraint("run_id", "ordinal", name="uq_steps_ordinal"),
    index_where("ix_steps_held", "tenant_id", where="held IS NOT NULL"),
)

attempts = tenant_table(
    "attempts",
    uid("attempt_id", primary_key=True),
    ref("step_id", "run_id") + txt("agent_id") + num("number") + txt("state"),
    uid("lease_id?") + big("fencing_token?") + txt("holder?"),  # the lease it is held by
    txt("outcome?", "outcome_hash?", "failure_class?"),
    tz("dispatched_at", "settled_at?") + txt("settled_by?"),
    # the last progress message stored (0009); its holder numbers them from 1
    big("progress_seq", server_default=text("0")),
    UniqueConstraint("step_id", "number", name="uq_attempts_number"),
    Index("ix_attempts_run", "run_id"),
    # Invariant 4 at the database level: one non-terminal attempt per step.
    index_where("uq_attempts_open_per_step", "step_id", unique=True, where=OPEN_ATTEMPT),
    index_where("ix_attempts_claimable", "agent_id", "dispatched_at", where=DISPATCHED),
)

# What an attempt's outcome produced (0015): inserted once with the outcome, never rewritten.
# ``result_json`` is the JSON's canonical text (text, not jsonb: jsonb would rewrite numbers such
# as 1e+20, and the bytes a dependent step receives are the bytes hashed), or ``result_ref`` a
# {uri, sha256, bytes} reference; ``outcome_hash`` is the canonical hash of the one stored.
attempt_results = tenant_table(
    "attempt_results",
    ref("attempt_id", primary_key=True),
    ref("step_id", "run_id"),
    txt("outcome_hash") + big("bytes") + tz("created_at"),
    txt("result_json?") + jsonb("result_ref?"),
    # the outcome report that stored it (0041): its resends are answered from this row and the
    # attempt's (store/commit.py), with no command_answers row; NULL before 0041
    txt("command_id?", "fingerprint?"),
    Index("ix_attempt_results_run", "run_id"),
)

leases = tenant_table(
    "leases",
    uid("lease_id", primary_key=True),
    ref("attempt_id", "run_id") + txt("holder") + big("fencing_token"),
    tz("granted_at", "expires_at", "released_at?") + txt("release_cause?"),
    UniqueConstraint("run_id", "fencing_token", name="uq_leases_token"),
    # Invariant 5 at the database level: exactly one current lease per attempt.
    index_where("uq_leases_current_per_attempt", "attempt_id", unique=True, where=UNRELEASED),
    index_where("ix_leases_expiry", "expires_at", where=UNRELEASED),
)

approval_requests = tenant_table(
    "approval_requests",
    uid("approval_id", primary_key=True),
    ref("run_id", "step_id", "attempt_id"),
    txt("action_class", "proposal_hash", "policy_revision", "approver_rule"),
    num("required_approvals") + txt("requested_by") + tz("created_at", "expires_at"),
    txt("state", "decided_by?") + tz("decided_at?") + txt("reason?"),
    big("version"),
    Index("ix_approvals_run", "run_id"),
    Index("ix_approvals_list", "tenant_id", "state", "created_at"),
    index_where("uq_approvals_pending_per_step", "step_id", unique=True, where=PENDING),
    index_where("ix_approvals_expiry", "expires_at", where=PENDING),
)

approval_decisions = tenant_table(
    "approval_decisions",
    uid("approval_id", refs="approval_requests.approval_id") + txt("decided_by"),
    uid("run_id") + txt("decision", "proposal_hash", "reason?"),
    flag("break_glass") + tz("decided_at") + num("pre_approval?"),
    PrimaryKeyConstraint("approval_id", "decided_by"),
    Index("ix_decisions_run", "run_id"),
    tenant_after="decided_by",
)

# Tool calls claimed before their side effect, at most once per run and call id (0009).
# Journaled calls (``step.run``, 0021): the first value recorded per (run, step, name,
# occurrence), insert-only; the primary key keeps one value per key at the database level too.
journaled_calls = tenant_table(
    "journaled_calls",
    ref("run_id", "step_id", primary_key=True),
    txt("name", primary_key=True) + num("occurrence", primary_key=True),
    ref("attempt_id") + big("fencing_token"),
    txt("value_hash") + big("bytes") + tz("recorded_at"),
    txt("value_json?") + jsonb("error?") + txt("request_hash?"),
)
tool_calls = tenant_table(
    "tool_calls",
    uid("tool_call_id", primary_key=True),
    ref("run_id") + txt("call_id") + ref("attempt_id"),
    txt("request_hash", "claimed_by") + big("fencing_token"),
    tz("claimed_at", "expires_at") + txt("state"),
    txt("result_hash?") + tz("completed_at?") + txt("error?"),
    # the result's canonical JSON, stored by a completion that sends it (0021)
    txt("result_json?"),
    # At most once, at the database level too: one claim per run and call id.
    UniqueConstraint("run_id", "call_id", name="uq_tool_calls_call"),
)

cancellation_intents = tenant_table(
    "cancellation_intents",
    uid("intent_id", primary_key=True),
    ref("run_id") + txt("requested_by", "reason") + tz("requested_at"),
    Index("ix_intents_run", "run_id"),
)

# The journal entries written before migration 0033, kept as they were until retention purges
# them (365 d); nothing writes here any more: since 0033 a document's journal entries are
# carried by its last event (``outbox.journal``) and ``recovery_journal`` is a view of both.
recovery_journal_legacy = tenant_table(
    "recovery_journal_legacy",
    serial("id"),
    uid("run_id") + big("sequence"),
    txt("entity") + uid("entity_id"),
    txt("from_state?", "to_state", "cause", "actor") + tz("occurred_at"),
    UniqueConstraint("run_id", "sequence", name="uq_journal_sequence"),
    Index("ix_journal_occurred", "occurred_at"),
    policies=(RETENTION_PURGE,),
)

# One event row for every reader (issue 42, migration 0033; docs/write-path.md section 7): the
# run's event, and on the last event of a document the journal entries that document recorded
# (``journal``: a JSON array of entries, each a ``recovery_journal`` row without its tenant and
# run). Written once by the write path, never updated on publication (0039: the relay advances
# its floor in ``relay_state`` and pages the tenant feed in ``feed_pages``); the events'
# retention (90 d) sets ``payload`` to NULL on a row carrying a journal and deletes the others,
# the journal's (365 d, ``runcontrol_purge_journal``) deletes the rest. A trigger refuses any
# other change, even the owner's (``outbox_append_only``, ``outbox_keeps_journal``).
outbox = tenant_table(
    "outbox",
    serial("id"),
    uid("event_id", unique=True),
    txt("project_id") + uid("run_id") + big("seq") + txt("topic", "event_type"),
    uid("step_id?", "attempt_id?"),
    txt("correlation_id?", "causation_id?", "producer") + num("schema_version"),
    jsonb("payload?") + tz("occurred_at", "published_at?"),  # payload: NULL past 90 d
    jsonb("journal?"),
    # its place in its tenant's feed as the relay of 0033-0038 marked it (with ``published_at``);
    # since 0039 never set (those marks are pages, ``feed_pages``), and ``published_at`` set
    # only on a row a shard move wrote already published
    big("feed_position?"),
    UniqueConstraint("run_id", "seq", name="uq_outbox_run_seq"),
    index_where("uq_outbox_feed", "tenant_id", "feed_position", unique=True, where=PUBLISHED),
    # the recent events by time (a stalled agent's claims, retention), nearly free to keep
    Index("ix_outbox_occurred", "occurred_at", postgresql_using="brin"),
    tenant_after="event_id",
    policies=(PROJECT_READS, RETENTION_PURGE),
)

# The tenant feed (0039, docs/write-path.md section 7): one page per relay pass and tenant, its
# events' ids (``outbox.id``) in publication order; the event at ``ids[i]`` (1-based) is at
# position ``first_position + i - 1`` of the tenant's feed, counted from the tenant's own last
# page, so a position survives a shard move (the pages move with their tenant). Written by the
# relay on the system path, read by the tenant; retention keeps each tenant's newest page.
feed_pages = tenant_table(
    "feed_pages",
    big("first_position"),
    bigints("ids"),
    tz("published_at"),
    PrimaryKeyConstraint("tenant_id", "first_position"),
    Index("ix_feed_pages_published", "published_at", postgresql_using="brin"),  # retention
)

# The relay's floor (0039): one row per database. Every event row with ``id <= floor`` is
# published (or its transaction never committed); ``mark_drawn``/``mark_xmax``: the last outbox
# id handed out at a pass and the pass's snapshot xmax, which the floor may move to once a later
# snapshot's xmin has passed that xmax (docs/write-path.md section 6).
relay_state = Table(
    "relay_state",
    metadata,
    *num("id", primary_key=True),
    *big("floor", "mark_drawn?", "mark_xmax?"),
    *tz("updated_at"),
)

# Views (0033): not tables, so not in ``metadata`` (no writer, policy or trigger of their own;
# row-level security is their tables', ``security_invoker``).
views = MetaData()
# The recovery journal: each entry of each event row's ``journal`` (its tenant, run and id the
# row's), then the entries written before 0033 (``recovery_journal_legacy``).
recovery_journal = Table(
    "recovery_journal",
    views,
    *big("id"),
    *txt("tenant_id"),
    *uid("run_id"),
    *big("sequence"),
    *txt("entity"),
    *uid("entity_id"),
    *txt("from_state?", "to_state", "cause", "actor"),
    *tz("occurred_at"),
)
# What an event row's ``journal`` holds of each entry: the view's columns but those of the row.
JOURNAL_ENTRY = tuple(
    str(c) for c in recovery_journal.c.keys() if c not in ("id", "tenant_id", "run_id")
)


command_answers = tenant_table(
    "command_answers",
    uid("run_id") + txt("command_id", "command"),
    jsonb("answer") + tz("created_at"),
    txt("fingerprint?"),  # what the command asked (commands.fingerprint); 0007
    PrimaryKeyConstraint("tenant_id", "run_id", "command_id"),
    Index("ix_command_answers_created", "created_at"),
    # a resent claim finds the lease it granted by its claim id alone (migration 0013)
    index_where("ix_command_answers_claims", "command_id", where="command = 'AcquireLease'"),
)

audit_log = tenant_table(
    "audit_log",
    serial("id"),
    uid("run_id?") + txt("kind", "actor") + jsonb("detail") + tz("occurred_at"),
    Index("ix_audit_run", "run_id"),
)

releases = tenant_table(
    "releases",
    txt("release_id", primary_key=True),
    txt("workflow_id", "content_hash") + jsonb("definition"),
    txt("published_by") + tz("published_at"),
    UniqueConstraint("tenant_id", "workflow_id", "content_hash", name="uq_releases_content"),
    length_check("releases", "workflow_id", MAX_WORKFLOW_ID),
)

release_aliases = tenant_table(
    "release_aliases",
    txt("workflow_id", "alias"),
    txt("release_id", refs="releases.release_id") + tz("moved_at"),
    PrimaryKeyConstraint("tenant_id", "workflow_id", "alias"),
    length_check("release_aliases", "workflow_id", MAX_WORKFLOW_ID),
    length_check("release_aliases", "alias", MAX_NAME),
)

policies = tenant_table(
    "policies",
    txt("policy_id") + num("revision") + jsonb("document") + tz("created_at"),
    PrimaryKeyConstraint("tenant_id", "policy_id", "revision"),
)

budget_reservations = tenant_table(
    "budget_reservations",
    uid("reservation_id", primary_key=True),
    uid("run_id", unique=True) + usd("amount_usd") + tz("created_at", "released_at?"),
    index_where("ix_budget_open", "tenant_id", where="released_at IS NULL"),
)

# Flow control (0017, docs/flow-control.md): the holders of each concurrency key's slots and
# the runs waiting for one. Written only by the dispatching statement's functions and the
# triggers that free a slot in the transaction making its holder terminal; never by a writer.
flow_slots = tenant_table(
    "flow_slots",
    # holder: the run (a workflow-wide key: held for the run's life) or the attempt (a step's
    # key, the tenant's cap: held until the attempt settles)
    txt("name", "key", "holder") + uid("run_id", "attempt_id?"),
    txt("kind") + num("max_holders") + tz("taken_at"),
    PrimaryKeyConstraint("tenant_id", "name", "key", "holder", name="pk_flow_slots"),
    Index("ix_flow_slots_run", "run_id"),
    index_where("ix_flow_slots_attempt", "attempt_id", where="attempt_id IS NOT NULL"),
)

flow_waiters = tenant_table(
    "flow_waiters",
    txt("name", "key", "holder"),  # holder: the run (workflow-wide key) or the step
    uid("run_id", "step_id?") + txt("kind") + num("max_holders", "priority"),
    big("seq"),  # arrival order (flow_waiters_seq)
    # given the next free slot: its run is due, and its dispatch is admitted on it
    flag("promoted") + tz("enqueued_at"),
    PrimaryKeyConstraint("tenant_id", "name", "key", "holder", name="pk_flow_waiters"),
    Index("ix_flow_waiters_order", "tenant_id", "name", "key", "promoted", "priority", "seq"),
    Index("ix_flow_waiters_run", "run_id"),
)

# Rate limits (0018): one GCRA bucket per (tenant, bucket) shared by every host; ``tat`` is its
# theoretical arrival time, ``per_second`` and ``burst`` the terms of its last reservation.
rate_buckets = tenant_table(
    "rate_buckets",
    txt("bucket") + tz("tat") + real("per_second", "burst") + tz("updated_at"),
    PrimaryKeyConstraint("tenant_id", "bucket"),
)

# Streamed output (0022, docs/streaming.md): each chunk a lease holder wrote, by its position
# in the run (gap-free, in commit order: the readers' cursor); ``seq`` numbers it in its attempt
# and (``fencing_token``, ``lease_seq``) is the holder's own number, what a resend repeats.
# Written only by ``runcontrol_append_output``; kept as long as the event history.
output_chunks = tenant_table(
    "output_chunks",
    uid("run_id") + big("position"),
    uid("attempt_id", "step_id") + big("seq", "fencing_token", "lease_seq"),
    big("attempt_bytes"),  # the attempt's total up to this one
    txt("text?"),
    txt("data_json?"),  # canonical JSON text (jsonb would rewrite its numbers)
    tz("written_at"),
    PrimaryKeyConstraint("run_id", "position"),
    UniqueConstraint("attempt_id", "seq", name="uq_output_chunks_seq"),
    Index("ix_output_chunks_written", "written_at"),
    tenant_after="position",
)

# The last output position of each run that streamed: its row lock orders the run's writes.
output_heads = tenant_table(
    "output_heads",
    uid("run_id", primary_key=True),
    big("position") + tz("updated_at"),
    Index("ix_output_heads_updated", "updated_at"),
)

# Events out (0010): webhook subscriptions and one delivery row per (subscription, event),
# keyed by the event's position in its tenant's feed (``feed_pages``, 0039) and read by its run
# and seq (the retention of the events' horizon deletes the deliveries of the events it
# removes).
webhook_subscriptions = tenant_table(
    "webhook_subscriptions",
    uid("subscription_id", primary_key=True),
    txt("url", "secret", "description?") + num("max_attempts"),
    txt("created_by") + tz("created_at") + big("starts_after") + tz("disabled_at?"),
    # A run's subscription (0028: an A2A task's push config): only that run's events of
    # ``event_types`` (NULL: every type), rendered by ``format`` (``event``: the signed envelope).
    uid("run_id?") + texts("event_types?") + txt("format", server_default="event"),
    Index("ix_webhook_subscriptions_tenant", "tenant_id", "created_at"),
    index_where("ix_webhook_subscriptions_run", "run_id", where="run_id IS NOT NULL"),
    # the relay's tenant-wide ones, not every push config of the tenant's tasks (0028)
    index_where("ix_webhook_subscriptions_tenant_wide", "tenant_id", where=TENANT_WIDE),
)

webhook_deliveries = tenant_table(
    "webhook_deliveries",
    uid("subscription_id") + big("position"),
    uid("run_id") + big("seq") + txt("state"),
    num("attempts") + tz("next_attempt_at"),  # so far, and when the next one is due
    num("last_status?") + txt("last_error?"),
    tz("delivered_at?", "updated_at"),
    PrimaryKeyConstraint("subscription_id", "position"),
    cascade(
        "fk_deliveries_subscription", "subscription_id", "webhook_subscriptions.subscription_id"
    ),
    index_where("ix_webhook_deliveries_pending", "subscription_id", "run_id", "seq", where=PENDING),
    Index("ix_webhook_deliveries_position", "position"),
    tenant_after="position",
)

# A2A push notification configs (0028): one per (task, owner, config id), delivered through
# the run's webhook subscription (its URL, retries, dead letters); the token and the
# authentication are A2A's headers, never shown to another owner.
a2a_push_configs = tenant_table(
    "a2a_push_configs",
    uid("run_id") + txt("owner", "config_id"),
    uid("subscription_id"),
    txt("token?", "auth_scheme?", "auth_credentials?"),
    tz("created_at", "updated_at"),
    PrimaryKeyConstraint("run_id", "owner", "config_id"),
    UniqueConstraint("subscription_id", name="uq_a2a_push_configs_subscription"),
    cascade(
        "fk_a2a_push_configs_subscription",
        "subscription_id",
        "webhook_subscriptions.subscription_id",
    ),
    tenant_after="config_id",
)

# Schedules (0023): a tenant's schedules with their durable sweep state (the last nominal fire
# time handled, the next one due), and one row per fire time handled (not for missed ones).
schedules = tenant_table(
    "schedules",
    uid("schedule_id", primary_key=True),
    txt("project_id"),
    txt("owner"),  # the subject whose runs it starts
    jsonb("owner_roles", "owner_scopes"),
    jsonb("spec"),  # domain.schedules.ScheduleSpec
    flag("paused") + txt("note?"),
    tz("last_nominal_at?"),  # the last nominal fire time the sweep handled
    tz("next_fire_at?"),  # when the next one is due (nominal + jitter); None: ended
    tz("buffered_at?"),  # buffer-one: the nominal time waiting for the open run
    big("started", "skipped", "missed") + tz("created_at", "updated_at"),
    index_where("ix_schedules_due", "next_fire_at", where="NOT paused"),
    Index("ix_schedules_tenant", "tenant_id", "created_at"),
    policies=(PROJECT_ROWS,),
)

schedule_fires = tenant_table(
    "schedule_fires",
    uid("schedule_id") + tz("nominal_at"),
    txt("kind"),  # domain.schedules.FireKind
    txt("outcome"),  # domain.schedules.FireOutcome
    uid("run_id?"),  # once submitted
    tz("submitted_at?"),  # a started fire not yet submitted has None
    jsonb("cancels?"),  # cancel-other: the open runs it cancels
    txt("error?"),  # the submission's refusal (a started fire that started nothing)
    tz("recorded_at"),
    PrimaryKeyConstraint("schedule_id", "nominal_at"),
    cascade("fk_schedule_fires_schedule", "schedule_id", "schedules.schedule_id"),
    index_where("ix_schedule_fires_unsubmitted", "schedule_id", where=UNSUBMITTED),
    tenant_after="nominal_at",
)

# Run templates (0032, issue 44): one row per version, its content (domain.templates) as
# created, its state and decision. Its uses are the approvals it decided (``approval_requests``
# whose ``decided_by`` names it): counted by the decision's own row. The API writes them in the
# caller's tenant and project.
run_templates = tenant_table(
    "run_templates",
    txt("template_id") + num("version"),
    txt("project_id", "workflow_id", "release_alias", "state", "content_hash"),
    jsonb("content"),
    txt("created_by") + tz("created_at"),
    txt("decided_by?") + tz("decided_at?") + txt("reason?") + flag("break_glass"),
    tz("updated_at"),
    PrimaryKeyConstraint("tenant_id", "template_id", "version"),
    Index("ix_run_templates_list", "tenant_id", "created_at"),
    tenant_after="version",
    policies=(PROJECT_ROWS,),
)

# A template version's uses, a row per pre-approval (0036): written with the version, counted
# by the statement that writes a template's vote, ``uses < max_uses`` or the statement fails
# (runcontrol_template_use, the trigger on approval_decisions): two runs deciding at once never
# pass a pre-approval's maxUses.
template_uses = tenant_table(
    "template_uses",
    txt("template_id") + num("version") + num("pre_approval"),
    num("uses", "max_uses"),
    PrimaryKeyConstraint("tenant_id", "template_id", "version", "pre_approval"),
    tenant_after="pre_approval",
)

# Who LISTENs on which channel (0026, issue 33): a row per (channel, backend pid) while a
# process's listener listens (``store/notify.Listener``, through ``runcontrol_listen``);
# ``runcontrol_apply`` NOTIFYs a channel only when it has one. A process's, not a tenant's.
listeners = Table(
    "runcontrol_listeners",
    metadata,
    *txt("channel"),
    *num("pid"),
    PrimaryKeyConstraint("channel", "pid"),
    prefixes=["UNLOGGED"],  # after a crash no backend listens either
)

# The directory (issue 41; docs/sharding.md, docs/write-path.md section 7): which database each
# virtual shard's rows live in, and which virtual shard each tenant is placed on. In the first
# database; every process caches it (``store/directory.Directory``) and reloads it when
# ``directory_version`` changes (bumped, and NOTIFY runcontrol_directory, in the transaction of
# any change). Migration 0031 seeds the 1,024 shards on database 0.
vshards = Table(
    "vshards",
    metadata,
    *num("vshard", primary_key=True),  # 0 to domain.shards.VSHARDS - 1
    *num("database"),  # its position in RUNCONTROL_SHARDS__DATABASES (0: the first)
    *big("epoch"),  # bumped each time the shard moves
    *txt("state"),  # serving | moving
)
# A tenant placed on a virtual shard; a tenant without a row is on ``shards.hashed_vshard``.
tenant_placement = tenant_table(
    "tenant_placement",
    num("vshard"),
    PrimaryKeyConstraint("tenant_id"),
)
directory_version = Table("directory_version", metadata, *big("version"))  # one row
# A virtual shard's moves (0034; store/move.py, domain/moves.py), in the directory's database:
# each one's next step, journaled as it goes, so a crash resumes it from there. At most one
# open move per shard.
vshard_moves = Table(
    "vshard_moves",
    metadata,
    *uid("move_id", primary_key=True),
    *num("vshard", "source", "target"),  # databases: positions in RUNCONTROL_SHARDS__DATABASES
    *txt("step"),  # domain.moves.Step: the next one to run
    *jsonb("tenants?"),  # the tenants moving, once fenced
    *tz("started_at", "updated_at"),
    *txt("error?"),  # why its last step stopped (None: it did not)
    index_where("uq_vshard_moves_open", "vshard", unique=True, where=OPEN_MOVE),
)
# In every shard database (0034): a tenant whose rows moved away (or are moving). Documents of
# a fenced tenant are refused here, in their own transaction (runcontrol_check_fence, RC421):
# a host whose directory is stale cannot commit to the database the tenant left.
shard_fences = tenant_table(
    "shard_fences",
    num("vshard", "moved_to"),
    big("epoch"),  # the shard's epoch on the database it moved to
    tz("fenced_at"),
    PrimaryKeyConstraint("tenant_id"),
)

RUN_PINS = tuple(str(c.name) for c in runs.columns if c.info.get("pinned"))
TENANT_TABLES = tuple(name for name, t in metadata.tables.items() if POLICIES in t.info)
APPEND_ONLY_TABLES = (
    "recovery_journal_legacy",
    "audit_log",
    "approval_decisions",
    "cancellation_intents",
)
# The app role adds rows to these and never changes them (command answers: the system role
# prunes them past the resend window; event rows: the relay marks them published and
# retention drops their payload, 0033). The write path's writers insert, never upsert.
INSERT_ONLY_TABLES = (
    *APPEND_ONLY_TABLES,
    "command_answers",
    "attempt_results",
    "journaled_calls",
    "output_chunks",
    "outbox",
)
# The app role only reads these (the relay and the directory write them on the system path).
READ_ONLY_TABLES = ("tenant_placement", "shard_fences", "feed_pages")
