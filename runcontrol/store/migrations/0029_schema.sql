-- The baseline's schema: what migrations 0001..0029 built, in one file (pre-release, the chain
-- was squashed twice; a database at an older revision is not upgraded, docs/operations.md).
-- 0029_baseline.py makes the roles and the database's CONNECT grant before this runs (the
-- password comes from the configuration), then applies every SQL function by name
-- (runcontrol/store/sql/ and the writers rendered from tables.py) and 0029_triggers.sql.
--
-- Every table carrying tenant_id has row-level security FORCEd on (the owner too) with the
-- tenant_isolation policy; runs, outbox and event_feed also have project_scope, a restrictive
-- read policy for a transaction that sets runcontrol.project_id (schedules: for every
-- command). The app role writes run state through runcontrol_apply_many / runcontrol_apply and
-- never rewrites the append-only tables (recovery_journal, audit_log, approval_decisions,
-- cancellation_intents: a trigger refuses UPDATE, DELETE and TRUNCATE even to the owner, save
-- the journal's retention purge). The system role sweeps every tenant: it reads, marks outbox
-- rows published, prunes what retention allows and writes the event feed; it never rewrites
-- run state. Results, journaled calls and output follow the event history's retention
-- (RunControl:Outbox:RetentionDays): the system role deletes them; the app role only reads and
-- inserts.

CREATE TABLE audit_log (
	id BIGSERIAL NOT NULL,
	tenant_id TEXT NOT NULL,
	run_id UUID,
	kind TEXT NOT NULL,
	actor TEXT NOT NULL,
	detail JSONB NOT NULL,
	occurred_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (id)
);

CREATE INDEX ix_audit_run ON audit_log (run_id);

CREATE TABLE budget_reservations (
	reservation_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	run_id UUID NOT NULL,
	amount_usd NUMERIC NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	released_at TIMESTAMP WITH TIME ZONE,
	PRIMARY KEY (reservation_id),
	UNIQUE (run_id)
);

CREATE INDEX ix_budget_open ON budget_reservations (tenant_id) WHERE released_at IS NULL;

CREATE TABLE outbox (
	id BIGSERIAL NOT NULL,
	event_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	project_id TEXT NOT NULL,
	run_id UUID NOT NULL,
	seq BIGINT NOT NULL,
	topic TEXT NOT NULL,
	event_type TEXT NOT NULL,
	step_id UUID,
	attempt_id UUID,
	correlation_id TEXT,
	causation_id TEXT,
	producer TEXT NOT NULL,
	schema_version INTEGER NOT NULL,
	payload JSONB NOT NULL,
	occurred_at TIMESTAMP WITH TIME ZONE NOT NULL,
	published_at TIMESTAMP WITH TIME ZONE,
	PRIMARY KEY (id),
	CONSTRAINT uq_outbox_run_seq UNIQUE (run_id, seq),
	UNIQUE (event_id)
);

CREATE INDEX ix_outbox_unpublished ON outbox (id) WHERE published_at IS NULL;

CREATE TABLE policies (
	tenant_id TEXT NOT NULL,
	policy_id TEXT NOT NULL,
	revision INTEGER NOT NULL,
	document JSONB NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (tenant_id, policy_id, revision)
);

CREATE TABLE recovery_journal (
	id BIGSERIAL NOT NULL,
	tenant_id TEXT NOT NULL,
	run_id UUID NOT NULL,
	sequence BIGINT NOT NULL,
	entity TEXT NOT NULL,
	entity_id UUID NOT NULL,
	from_state TEXT,
	to_state TEXT NOT NULL,
	cause TEXT NOT NULL,
	actor TEXT NOT NULL,
	occurred_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT uq_journal_sequence UNIQUE (run_id, sequence)
);

CREATE INDEX ix_journal_occurred ON recovery_journal (occurred_at);

CREATE TABLE releases (
	release_id TEXT NOT NULL,
	tenant_id TEXT NOT NULL,
	workflow_id TEXT NOT NULL,
	content_hash TEXT NOT NULL,
	definition JSONB NOT NULL,
	published_by TEXT NOT NULL,
	published_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (release_id),
	CONSTRAINT uq_releases_content UNIQUE (tenant_id, workflow_id, content_hash)
);

CREATE TABLE runs (
	run_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	project_id TEXT NOT NULL,
	environment_id TEXT,
	idempotency_key TEXT NOT NULL,
	workflow_id TEXT NOT NULL,
	release_id TEXT NOT NULL,
	release_hash TEXT NOT NULL,
	policy_id TEXT NOT NULL,
	policy_revision TEXT NOT NULL,
	model_profile_id TEXT NOT NULL,
	state TEXT NOT NULL,
	input_hash TEXT NOT NULL,
	snapshot_id UUID NOT NULL,
	budget_reservation_id UUID,
	requested_by TEXT NOT NULL,
	max_cost_usd NUMERIC,
	max_minutes INTEGER,
	deadline_at TIMESTAMP WITH TIME ZONE,
	failure_class TEXT,
	failure_reason TEXT,
	outcome_hash TEXT,
	correlation_id TEXT,
	input JSONB,
	version BIGINT NOT NULL,
	event_seq BIGINT NOT NULL,
	journal_seq BIGINT NOT NULL,
	fencing_seq BIGINT NOT NULL,
	next_due_at TIMESTAMP WITH TIME ZONE,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
	suspended_at TIMESTAMP WITH TIME ZONE,
	rerun_of UUID,
	result_hash TEXT,
	result_bytes BIGINT,
	priority INTEGER DEFAULT 3 NOT NULL,
	flow JSONB,
	parent_run_id UUID,
	parent_step_id UUID,
	depth INTEGER,
	template_id TEXT,
	template_version INTEGER,
	replay_of UUID,
	replay JSONB,
	PRIMARY KEY (run_id),
	CONSTRAINT uq_runs_idempotency UNIQUE (tenant_id, project_id, idempotency_key)
);

CREATE INDEX ix_runs_due ON runs (next_due_at) WHERE next_due_at IS NOT NULL;

CREATE INDEX ix_runs_list ON runs (tenant_id, created_at, run_id);

CREATE INDEX ix_runs_state ON runs (tenant_id, state, created_at);

CREATE INDEX ix_runs_workflow ON runs (tenant_id, workflow_id, created_at);

CREATE INDEX ix_runs_parent ON runs (tenant_id, parent_run_id, created_at)
	WHERE parent_run_id IS NOT NULL;

CREATE TABLE cancellation_intents (
	intent_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	run_id UUID NOT NULL,
	requested_by TEXT NOT NULL,
	reason TEXT NOT NULL,
	requested_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (intent_id),
	FOREIGN KEY(run_id) REFERENCES runs (run_id)
);

CREATE INDEX ix_intents_run ON cancellation_intents (run_id);

CREATE TABLE release_aliases (
	tenant_id TEXT NOT NULL,
	workflow_id TEXT NOT NULL,
	alias TEXT NOT NULL,
	release_id TEXT NOT NULL,
	moved_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (tenant_id, workflow_id, alias),
	FOREIGN KEY(release_id) REFERENCES releases (release_id)
);

CREATE TABLE steps (
	step_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	run_id UUID NOT NULL,
	ordinal INTEGER NOT NULL,
	name TEXT NOT NULL,
	agent_id TEXT NOT NULL,
	skill_id TEXT,
	state TEXT NOT NULL,
	max_attempts INTEGER NOT NULL,
	gate TEXT NOT NULL,
	side_effect_class TEXT NOT NULL,
	not_before TIMESTAMP WITH TIME ZONE,
	failure_class TEXT,
	outcome_hash TEXT,
	depends_on JSONB,
	kind TEXT DEFAULT 'agent' NOT NULL,
	wait JSONB,
	due_at TIMESTAMP WITH TIME ZONE,
	signal JSONB,
	flow JSONB,
	held JSONB,
	rate_limits JSONB,
	condition TEXT,
	result_json TEXT,
	child JSONB,
	PRIMARY KEY (step_id),
	CONSTRAINT uq_steps_ordinal UNIQUE (run_id, ordinal),
	FOREIGN KEY(run_id) REFERENCES runs (run_id)
);

CREATE TABLE attempts (
	attempt_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	step_id UUID NOT NULL,
	run_id UUID NOT NULL,
	agent_id TEXT NOT NULL,
	number INTEGER NOT NULL,
	state TEXT NOT NULL,
	lease_id UUID,
	fencing_token BIGINT,
	holder TEXT,
	outcome TEXT,
	outcome_hash TEXT,
	failure_class TEXT,
	dispatched_at TIMESTAMP WITH TIME ZONE NOT NULL,
	settled_at TIMESTAMP WITH TIME ZONE,
	settled_by TEXT,
	progress_seq BIGINT DEFAULT 0 NOT NULL,
	PRIMARY KEY (attempt_id),
	CONSTRAINT uq_attempts_number UNIQUE (step_id, number),
	FOREIGN KEY(step_id) REFERENCES steps (step_id),
	FOREIGN KEY(run_id) REFERENCES runs (run_id)
);

CREATE INDEX ix_attempts_claimable ON attempts (agent_id, dispatched_at) WHERE state = 'Dispatched';

CREATE INDEX ix_attempts_run ON attempts (run_id);

CREATE UNIQUE INDEX uq_attempts_open_per_step ON attempts (step_id)
	WHERE state IN ('Dispatched', 'Leased', 'Parked');

CREATE TABLE approval_requests (
	approval_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	run_id UUID NOT NULL,
	step_id UUID NOT NULL,
	attempt_id UUID NOT NULL,
	action_class TEXT NOT NULL,
	proposal_hash TEXT NOT NULL,
	policy_revision TEXT NOT NULL,
	approver_rule TEXT NOT NULL,
	required_approvals INTEGER NOT NULL,
	requested_by TEXT NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	expires_at TIMESTAMP WITH TIME ZONE NOT NULL,
	state TEXT NOT NULL,
	decided_by TEXT,
	decided_at TIMESTAMP WITH TIME ZONE,
	reason TEXT,
	version BIGINT NOT NULL,
	PRIMARY KEY (approval_id),
	FOREIGN KEY(run_id) REFERENCES runs (run_id),
	FOREIGN KEY(step_id) REFERENCES steps (step_id),
	FOREIGN KEY(attempt_id) REFERENCES attempts (attempt_id)
);

CREATE INDEX ix_approvals_expiry ON approval_requests (expires_at) WHERE state = 'Pending';

CREATE INDEX ix_approvals_list ON approval_requests (tenant_id, state, created_at);

CREATE INDEX ix_approvals_run ON approval_requests (run_id);

CREATE UNIQUE INDEX uq_approvals_pending_per_step ON approval_requests (step_id)
	WHERE state = 'Pending';

CREATE TABLE leases (
	lease_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	attempt_id UUID NOT NULL,
	run_id UUID NOT NULL,
	holder TEXT NOT NULL,
	fencing_token BIGINT NOT NULL,
	granted_at TIMESTAMP WITH TIME ZONE NOT NULL,
	expires_at TIMESTAMP WITH TIME ZONE NOT NULL,
	released_at TIMESTAMP WITH TIME ZONE,
	release_cause TEXT,
	PRIMARY KEY (lease_id),
	CONSTRAINT uq_leases_token UNIQUE (run_id, fencing_token),
	FOREIGN KEY(attempt_id) REFERENCES attempts (attempt_id),
	FOREIGN KEY(run_id) REFERENCES runs (run_id)
);

CREATE INDEX ix_leases_expiry ON leases (expires_at) WHERE released_at IS NULL;

CREATE UNIQUE INDEX uq_leases_current_per_attempt ON leases (attempt_id) WHERE released_at IS NULL;

CREATE TABLE approval_decisions (
	approval_id UUID NOT NULL,
	decided_by TEXT NOT NULL,
	tenant_id TEXT NOT NULL,
	run_id UUID NOT NULL,
	decision TEXT NOT NULL,
	proposal_hash TEXT NOT NULL,
	reason TEXT,
	break_glass BOOLEAN NOT NULL,
	decided_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (approval_id, decided_by),
	FOREIGN KEY(approval_id) REFERENCES approval_requests (approval_id)
);

CREATE INDEX ix_decisions_run ON approval_decisions (run_id);

-- command_answers: each committed command's answer, written in the statement of its effect, so a
-- resend of the command id gets the stored answer instead of a second effect; fingerprint (a
-- hash of the command's content) refuses a command id reused for a different command.
CREATE TABLE command_answers (
	tenant_id TEXT NOT NULL,
	run_id UUID NOT NULL,
	command_id TEXT NOT NULL,
	command TEXT NOT NULL,
	answer JSONB NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	fingerprint TEXT,
	PRIMARY KEY (tenant_id, run_id, command_id)
);

CREATE INDEX ix_command_answers_created ON command_answers (created_at);

-- A resent claim finds the lease it granted by its claim id alone, across runs.
CREATE INDEX ix_command_answers_claims ON command_answers (command_id)
    WHERE command = 'AcquireLease';

-- tool_calls: one row per run and call id, claimed before the side effect; the unique
-- (run_id, call_id) keeps a second claim out even past the run's version guard.
CREATE TABLE tool_calls (
	tool_call_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	run_id UUID NOT NULL,
	call_id TEXT NOT NULL,
	attempt_id UUID NOT NULL,
	request_hash TEXT NOT NULL,
	claimed_by TEXT NOT NULL,
	fencing_token BIGINT NOT NULL,
	claimed_at TIMESTAMP WITH TIME ZONE NOT NULL,
	expires_at TIMESTAMP WITH TIME ZONE NOT NULL,
	state TEXT NOT NULL,
	result_hash TEXT,
	completed_at TIMESTAMP WITH TIME ZONE,
	error TEXT,
	result_json TEXT,
	PRIMARY KEY (tool_call_id),
	CONSTRAINT uq_tool_calls_call UNIQUE (run_id, call_id),
	FOREIGN KEY(run_id) REFERENCES runs (run_id),
	FOREIGN KEY(attempt_id) REFERENCES attempts (attempt_id)
);

-- event_feed gives every published event a tenant-wide position, assigned by the outbox relay
-- under a transaction-level advisory lock, so positions grow in the order their rows become
-- visible (an outbox id does not). A feed row goes with its outbox row.
CREATE TABLE event_feed (
	position BIGSERIAL NOT NULL,
	event_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	project_id TEXT NOT NULL,
	run_id UUID NOT NULL,
	seq BIGINT NOT NULL,
	published_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (position),
	CONSTRAINT uq_event_feed_event UNIQUE (event_id),
	CONSTRAINT fk_event_feed_outbox FOREIGN KEY (event_id) REFERENCES outbox (event_id)
		ON DELETE CASCADE
);

CREATE INDEX ix_event_feed_tenant ON event_feed (tenant_id, position);

CREATE TABLE webhook_subscriptions (
	subscription_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	url TEXT NOT NULL,
	secret TEXT NOT NULL,
	description TEXT,
	max_attempts INTEGER NOT NULL,
	created_by TEXT NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	starts_after BIGINT NOT NULL,
	disabled_at TIMESTAMP WITH TIME ZONE,
	run_id UUID,
	event_types TEXT[],
	format TEXT DEFAULT 'event' NOT NULL,
	PRIMARY KEY (subscription_id)
);

CREATE INDEX ix_webhook_subscriptions_tenant ON webhook_subscriptions (tenant_id, created_at);

-- One row per (subscription, event), inserted by the relay in the transaction that publishes
-- the event; the delivery job sends each run's in seq order.
CREATE TABLE webhook_deliveries (
	subscription_id UUID NOT NULL,
	position BIGINT NOT NULL,
	tenant_id TEXT NOT NULL,
	run_id UUID NOT NULL,
	seq BIGINT NOT NULL,
	state TEXT NOT NULL,
	attempts INTEGER NOT NULL,
	next_attempt_at TIMESTAMP WITH TIME ZONE NOT NULL,
	last_status INTEGER,
	last_error TEXT,
	delivered_at TIMESTAMP WITH TIME ZONE,
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (subscription_id, position),
	CONSTRAINT fk_deliveries_subscription FOREIGN KEY (subscription_id)
		REFERENCES webhook_subscriptions (subscription_id) ON DELETE CASCADE,
	CONSTRAINT fk_deliveries_feed FOREIGN KEY (position)
		REFERENCES event_feed (position) ON DELETE CASCADE
);

-- The delivery job's head-of-line read: each (subscription, run)'s first pending event.
CREATE INDEX ix_webhook_deliveries_pending ON webhook_deliveries (subscription_id, run_id, seq)
	WHERE state = 'Pending';
CREATE INDEX ix_webhook_deliveries_position ON webhook_deliveries (position);

-- attempt_results: what an attempt's outcome produced (issue 20), insert-only.
CREATE TABLE attempt_results (
	attempt_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	step_id UUID NOT NULL,
	run_id UUID NOT NULL,
	outcome_hash TEXT NOT NULL,
	bytes BIGINT NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	result_json TEXT,
	result_ref JSONB,
	PRIMARY KEY (attempt_id),
	FOREIGN KEY(attempt_id) REFERENCES attempts (attempt_id),
	FOREIGN KEY(step_id) REFERENCES steps (step_id),
	FOREIGN KEY(run_id) REFERENCES runs (run_id)
);

CREATE INDEX ix_attempt_results_run ON attempt_results (run_id);

-- Flow control (issue 21, docs/flow-control.md): a slot is a row held by a run or an attempt
-- under a concurrency key or the tenant's cap; a waiter is a held step or run queued for one
-- (runcontrol_flow_admit says how they move).
CREATE TABLE flow_slots (
    tenant_id TEXT NOT NULL,
    name TEXT NOT NULL,
    key TEXT NOT NULL,
    holder TEXT NOT NULL,
    run_id UUID NOT NULL,
    attempt_id UUID,
    kind TEXT NOT NULL,
    max_holders INTEGER NOT NULL,
    taken_at TIMESTAMP WITH TIME ZONE NOT NULL,
    CONSTRAINT pk_flow_slots PRIMARY KEY (tenant_id, name, key, holder)
);
CREATE INDEX ix_flow_slots_run ON flow_slots (run_id);
CREATE INDEX ix_flow_slots_attempt ON flow_slots (attempt_id) WHERE attempt_id IS NOT NULL;

CREATE SEQUENCE flow_waiters_seq;
CREATE TABLE flow_waiters (
    tenant_id TEXT NOT NULL,
    name TEXT NOT NULL,
    key TEXT NOT NULL,
    holder TEXT NOT NULL,
    run_id UUID NOT NULL,
    step_id UUID,
    kind TEXT NOT NULL,
    max_holders INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    seq BIGINT NOT NULL,
    promoted BOOLEAN NOT NULL,
    enqueued_at TIMESTAMP WITH TIME ZONE NOT NULL,
    CONSTRAINT pk_flow_waiters PRIMARY KEY (tenant_id, name, key, holder)
);
CREATE INDEX ix_flow_waiters_order ON flow_waiters (tenant_id, name, key, promoted, priority, seq);
CREATE INDEX ix_flow_waiters_run ON flow_waiters (run_id);

-- The held steps' gauge (runcontrol_steps_held) counts them from this.
CREATE INDEX ix_steps_held ON steps (tenant_id) WHERE held IS NOT NULL;

-- Rate limits (issue 21 item 2): one GCRA cell per tenant and bucket (runcontrol_rate_reserve).
CREATE TABLE rate_buckets (
	tenant_id TEXT NOT NULL,
	bucket TEXT NOT NULL,
	tat TIMESTAMP WITH TIME ZONE NOT NULL,
	per_second DOUBLE PRECISION NOT NULL,
	burst DOUBLE PRECISION NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
	CONSTRAINT rate_buckets_pkey PRIMARY KEY (tenant_id, bucket)
);

-- A step's journaled call (step.run, issue 30) stores its first value here, keyed by (run,
-- step, name, occurrence): the primary key keeps one value per key even if two statements
-- raced past the run's version guard.
CREATE TABLE journaled_calls (
	run_id UUID NOT NULL,
	step_id UUID NOT NULL,
	name TEXT NOT NULL,
	occurrence INTEGER NOT NULL,
	tenant_id TEXT NOT NULL,
	attempt_id UUID NOT NULL,
	fencing_token BIGINT NOT NULL,
	value_hash TEXT NOT NULL,
	bytes BIGINT NOT NULL,
	recorded_at TIMESTAMP WITH TIME ZONE NOT NULL,
	value_json TEXT,
	error JSONB,
	PRIMARY KEY (run_id, step_id, name, occurrence),
	FOREIGN KEY(run_id) REFERENCES runs (run_id),
	FOREIGN KEY(step_id) REFERENCES steps (step_id),
	FOREIGN KEY(attempt_id) REFERENCES attempts (attempt_id)
);

-- Streamed output (issue 30): the chunks, and each run's head (runcontrol_append_output).
CREATE TABLE output_chunks (
	run_id UUID NOT NULL,
	position BIGINT NOT NULL,
	tenant_id TEXT NOT NULL,
	attempt_id UUID NOT NULL,
	step_id UUID NOT NULL,
	seq BIGINT NOT NULL,
	fencing_token BIGINT NOT NULL,
	lease_seq BIGINT NOT NULL,
	attempt_bytes BIGINT NOT NULL,
	text TEXT,
	data_json TEXT,
	written_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (run_id, position),
	CONSTRAINT uq_output_chunks_seq UNIQUE (attempt_id, seq)
);
CREATE INDEX ix_output_chunks_written ON output_chunks (written_at);

CREATE TABLE output_heads (
	run_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	position BIGINT NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (run_id)
);
CREATE INDEX ix_output_heads_updated ON output_heads (updated_at);

-- Schedules (issue 32): a tenant's schedules, with the sweep's durable state (the last nominal
-- fire time handled and the next one due), and one row per fire time handled (started,
-- skipped or buffered, and the run it started). The sweep is the system role's; the API
-- creates, changes and deletes schedules in the caller's tenant.
CREATE TABLE schedules (
	schedule_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	project_id TEXT NOT NULL,
	owner TEXT NOT NULL,
	owner_roles JSONB NOT NULL,
	owner_scopes JSONB NOT NULL,
	spec JSONB NOT NULL,
	paused BOOLEAN NOT NULL,
	note TEXT,
	last_nominal_at TIMESTAMP WITH TIME ZONE,
	next_fire_at TIMESTAMP WITH TIME ZONE,
	buffered_at TIMESTAMP WITH TIME ZONE,
	started BIGINT NOT NULL,
	skipped BIGINT NOT NULL,
	missed BIGINT NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
	CONSTRAINT schedules_pkey PRIMARY KEY (schedule_id)
);
CREATE INDEX ix_schedules_tenant ON schedules (tenant_id, created_at);
CREATE INDEX ix_schedules_due ON schedules (next_fire_at) WHERE NOT paused;

CREATE TABLE schedule_fires (
	schedule_id UUID NOT NULL,
	nominal_at TIMESTAMP WITH TIME ZONE NOT NULL,
	tenant_id TEXT NOT NULL,
	kind TEXT NOT NULL,
	outcome TEXT NOT NULL,
	run_id UUID,
	submitted_at TIMESTAMP WITH TIME ZONE,
	cancels JSONB,
	error TEXT,
	recorded_at TIMESTAMP WITH TIME ZONE NOT NULL,
	CONSTRAINT schedule_fires_pkey PRIMARY KEY (schedule_id, nominal_at),
	CONSTRAINT fk_schedule_fires_schedule FOREIGN KEY (schedule_id)
		REFERENCES schedules (schedule_id) ON DELETE CASCADE
);
CREATE INDEX ix_schedule_fires_unsubmitted ON schedule_fires (schedule_id)
	WHERE outcome = 'started' AND submitted_at IS NULL;

CREATE INDEX ix_webhook_subscriptions_run ON webhook_subscriptions (run_id)
    WHERE run_id IS NOT NULL;
-- The relay's join to the tenant-wide subscriptions reads these, not every push config of the
-- tenant's tasks (one subscription each, kept once deleted).
CREATE INDEX ix_webhook_subscriptions_tenant_wide ON webhook_subscriptions (tenant_id)
    WHERE run_id IS NULL AND disabled_at IS NULL;

-- A2A push notification configs (issue 31): one per task, owner and config id, each delivered
-- through a webhook subscription of its run.
CREATE TABLE a2a_push_configs (
	run_id UUID NOT NULL,
	owner TEXT NOT NULL,
	config_id TEXT NOT NULL,
	tenant_id TEXT NOT NULL,
	subscription_id UUID NOT NULL,
	token TEXT,
	auth_scheme TEXT,
	auth_credentials TEXT,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
	CONSTRAINT a2a_push_configs_pkey PRIMARY KEY (run_id, owner, config_id),
	CONSTRAINT uq_a2a_push_configs_subscription UNIQUE (subscription_id),
	CONSTRAINT fk_a2a_push_configs_subscription FOREIGN KEY (subscription_id)
		REFERENCES webhook_subscriptions (subscription_id) ON DELETE CASCADE
);

-- The channels somebody listens on (runcontrol_listen): a commit NOTIFYs only those.
CREATE UNLOGGED TABLE runcontrol_listeners (
    channel text NOT NULL,
    pid integer NOT NULL,
    CONSTRAINT runcontrol_listeners_pkey PRIMARY KEY (channel, pid)
);

-- What a definition may hold (issue 34): the bounds of runcontrol.domain.limits, which
-- store/tables.py declares from the same constants. NOT VALID, as 0025 added them: rows stored
-- before are not rescanned.
ALTER TABLE releases ADD CONSTRAINT ck_releases_workflow_id
    CHECK (char_length(workflow_id) BETWEEN 1 AND 183) NOT VALID;
ALTER TABLE release_aliases ADD CONSTRAINT ck_release_aliases_workflow_id
    CHECK (char_length(workflow_id) BETWEEN 1 AND 183) NOT VALID;
ALTER TABLE release_aliases ADD CONSTRAINT ck_release_aliases_alias
    CHECK (char_length(alias) BETWEEN 1 AND 200) NOT VALID;

-- Row-level security on every table that carries tenant_id: the tenant's rows only, for every
-- role but the system role (BYPASSRLS), the owner too (FORCE).
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY[
        'runs', 'steps', 'attempts', 'leases', 'approval_requests', 'approval_decisions',
        'cancellation_intents', 'recovery_journal', 'outbox', 'audit_log', 'releases',
        'release_aliases', 'policies', 'budget_reservations', 'command_answers', 'tool_calls',
        'event_feed', 'webhook_subscriptions', 'webhook_deliveries', 'attempt_results',
        'flow_slots', 'flow_waiters', 'rate_buckets', 'journaled_calls', 'output_chunks',
        'output_heads', 'schedules', 'schedule_fires', 'a2a_push_configs'
    ] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format($p$CREATE POLICY tenant_isolation ON %I
            USING (tenant_id = current_setting('runcontrol.tenant_id', true))
            WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true))$p$, t);
    END LOOP;
END $$;

-- Project scope, for the app role's reads only (no write depends on it); unset, it restricts
-- nothing and the tenant policy still applies.
CREATE POLICY project_scope ON runs AS RESTRICTIVE FOR SELECT TO runcontrol_app
    USING (coalesce(current_setting('runcontrol.project_id', true), '') IN ('', project_id));
CREATE POLICY project_scope ON outbox AS RESTRICTIVE FOR SELECT TO runcontrol_app
    USING (coalesce(current_setting('runcontrol.project_id', true), '') IN ('', project_id));
CREATE POLICY project_scope ON event_feed AS RESTRICTIVE FOR SELECT TO runcontrol_app
    USING (coalesce(current_setting('runcontrol.project_id', true), '') IN ('', project_id));

-- A caller bound to its project sees and changes its project's schedules only, as its runs.
CREATE POLICY project_scope ON schedules AS RESTRICTIVE TO runcontrol_app
    USING (coalesce(current_setting('runcontrol.project_id', true), '') IN ('', project_id));

CREATE POLICY retention_purge ON recovery_journal FOR DELETE
    USING (current_setting('runcontrol.retention_purge', true) = 'on');

-- Grants. The app role adds to the append-only tables and never changes them; the system role
-- reads everything and removes only what retention allows.
GRANT USAGE ON SCHEMA public TO runcontrol_app, runcontrol_system;
GRANT USAGE, SELECT ON SEQUENCE audit_log_id_seq, outbox_id_seq, recovery_journal_id_seq
    TO runcontrol_app;
DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY[
        'runs', 'steps', 'attempts', 'leases', 'approval_requests', 'outbox', 'releases',
        'release_aliases', 'policies', 'budget_reservations', 'tool_calls'
    ] LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON %I TO runcontrol_app', t);
        EXECUTE format('GRANT SELECT ON %I TO runcontrol_system', t);
    END LOOP;
    FOREACH t IN ARRAY ARRAY[
        'recovery_journal', 'audit_log', 'approval_decisions', 'cancellation_intents'
    ] LOOP
        EXECUTE format('GRANT SELECT, INSERT ON %I TO runcontrol_app', t);
        EXECUTE format('GRANT SELECT ON %I TO runcontrol_system', t);
    END LOOP;
END $$;
GRANT UPDATE (published_at), DELETE ON outbox TO runcontrol_system;
GRANT SELECT, INSERT ON command_answers TO runcontrol_app;
GRANT SELECT, DELETE ON command_answers TO runcontrol_system;
-- Deleting a subscription disables it (the app role deletes nothing); re-queueing deliveries is
-- redelivery from a cursor. The relay and the delivery job write the feed and the deliveries.
GRANT SELECT ON event_feed TO runcontrol_app;
GRANT SELECT, INSERT, UPDATE ON webhook_subscriptions TO runcontrol_app;
GRANT SELECT, INSERT, UPDATE ON webhook_deliveries TO runcontrol_app;
GRANT SELECT, INSERT, DELETE ON event_feed TO runcontrol_system;
GRANT USAGE ON SEQUENCE event_feed_position_seq TO runcontrol_system;
GRANT SELECT ON webhook_subscriptions TO runcontrol_system;
GRANT SELECT, INSERT, UPDATE, DELETE ON webhook_deliveries TO runcontrol_system;
-- Processes that do not migrate check the revision at start (Database.require_compatible_schema).
GRANT SELECT ON alembic_version TO runcontrol_app, runcontrol_system;
GRANT SELECT, INSERT ON attempt_results TO runcontrol_app;
GRANT SELECT, DELETE ON attempt_results TO runcontrol_system;
GRANT SELECT, INSERT, UPDATE, DELETE ON flow_slots, flow_waiters TO runcontrol_app;
GRANT USAGE ON SEQUENCE flow_waiters_seq TO runcontrol_app;
GRANT SELECT ON flow_slots, flow_waiters TO runcontrol_system;
GRANT SELECT, INSERT, UPDATE ON rate_buckets TO runcontrol_app;
GRANT SELECT ON rate_buckets TO runcontrol_system;
GRANT SELECT, INSERT ON journaled_calls TO runcontrol_app;
GRANT SELECT, DELETE ON journaled_calls TO runcontrol_system;
GRANT SELECT, DELETE ON output_chunks, output_heads TO runcontrol_system;
GRANT SELECT, INSERT ON output_chunks TO runcontrol_app;
GRANT SELECT, INSERT, UPDATE ON output_heads TO runcontrol_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON schedules TO runcontrol_app;
GRANT SELECT, INSERT, UPDATE ON schedule_fires TO runcontrol_app;
GRANT SELECT, UPDATE ON schedules TO runcontrol_system;
GRANT SELECT, INSERT, UPDATE ON schedule_fires TO runcontrol_system;
GRANT SELECT, INSERT, UPDATE, DELETE ON a2a_push_configs TO runcontrol_app;
GRANT SELECT ON a2a_push_configs TO runcontrol_system;
REVOKE ALL ON runcontrol_listeners FROM PUBLIC;
GRANT SELECT ON runcontrol_listeners TO runcontrol_app, runcontrol_system;
-- The relay reads the last outbox id handed out (reconcilers.RelayFloor): where its read of
-- unpublished rows may start once every transaction that drew an id up to it has ended.
GRANT SELECT ON SEQUENCE outbox_id_seq TO runcontrol_system;
-- The schema's compatibility marker (store/schema.py): the oldest code that may run on it.
ALTER TABLE alembic_version ADD COLUMN oldest_code text;
