-- Initial schema (frozen snapshot; later changes come as new migrations).

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

CREATE TABLE inbox (
	consumer TEXT NOT NULL,
	event_id UUID NOT NULL,
	tenant_id TEXT NOT NULL,
	received_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (consumer, event_id)
);

CREATE INDEX ix_inbox_received ON inbox (received_at);

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
	PRIMARY KEY (run_id),
	CONSTRAINT uq_runs_idempotency UNIQUE (tenant_id, project_id, idempotency_key)
);

CREATE INDEX ix_runs_due ON runs (next_due_at) WHERE next_due_at IS NOT NULL;

CREATE INDEX ix_runs_list ON runs (tenant_id, created_at, run_id);

CREATE INDEX ix_runs_state ON runs (tenant_id, state, created_at);

CREATE INDEX ix_runs_workflow ON runs (tenant_id, workflow_id, created_at);

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
	PRIMARY KEY (attempt_id),
	CONSTRAINT uq_attempts_number UNIQUE (step_id, number),
	FOREIGN KEY(step_id) REFERENCES steps (step_id),
	FOREIGN KEY(run_id) REFERENCES runs (run_id)
);

CREATE INDEX ix_attempts_claimable ON attempts (agent_id, dispatched_at) WHERE state = 'Dispatched';

CREATE INDEX ix_attempts_run ON attempts (run_id);

CREATE UNIQUE INDEX uq_attempts_open_per_step ON attempts (step_id) WHERE state IN ('Dispatched', 'Leased');

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

CREATE UNIQUE INDEX uq_approvals_pending_per_step ON approval_requests (step_id) WHERE state = 'Pending';

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
