-- Migration 0010: events out. The tenant-wide event feed and per-tenant webhook subscriptions.
--
-- event_feed gives every published event a tenant-wide position: the outbox relay assigns it
-- when it publishes, under a transaction-level advisory lock, so positions grow in the order
-- their rows become visible (an outbox id does not: a transaction that took id 10 may commit
-- after the one that took id 11, and a reader resuming after 11 would never see 10). The
-- position is the /factory/events SSE id and a webhook subscription's redelivery cursor. A
-- feed row goes with its outbox row (the retention reconciler prunes the outbox).
-- webhook_deliveries holds one row per (subscription, event): the relay inserts them in the
-- transaction that publishes the event; the delivery job sends each run's in seq order.

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
	PRIMARY KEY (subscription_id)
);

CREATE INDEX ix_webhook_subscriptions_tenant ON webhook_subscriptions (tenant_id, created_at);

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

ALTER TABLE event_feed ENABLE ROW LEVEL SECURITY;
ALTER TABLE event_feed FORCE ROW LEVEL SECURITY;
ALTER TABLE webhook_subscriptions ENABLE ROW LEVEL SECURITY;
ALTER TABLE webhook_subscriptions FORCE ROW LEVEL SECURITY;
ALTER TABLE webhook_deliveries ENABLE ROW LEVEL SECURITY;
ALTER TABLE webhook_deliveries FORCE ROW LEVEL SECURITY;

CREATE POLICY tenant_isolation ON event_feed
    USING (tenant_id = current_setting('runcontrol.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true));
-- Project scope as 0008 has it for runs and outbox: the feed of a project-bound caller.
CREATE POLICY project_scope ON event_feed AS RESTRICTIVE FOR SELECT TO runcontrol_app
    USING (coalesce(current_setting('runcontrol.project_id', true), '') IN ('', project_id));
CREATE POLICY tenant_isolation ON webhook_subscriptions
    USING (tenant_id = current_setting('runcontrol.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true));
CREATE POLICY tenant_isolation ON webhook_deliveries
    USING (tenant_id = current_setting('runcontrol.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true));

-- The app role reads the feed, manages its tenant's subscriptions (deleting one disables it:
-- the app role deletes nothing) and re-queues deliveries (redelivery from a cursor); the
-- system role (the relay and the delivery job) writes the
-- feed, fans out and records delivery attempts.
GRANT SELECT ON event_feed TO runcontrol_app;
GRANT SELECT, INSERT, UPDATE ON webhook_subscriptions TO runcontrol_app;
GRANT SELECT, INSERT, UPDATE ON webhook_deliveries TO runcontrol_app;
GRANT SELECT, INSERT, DELETE ON event_feed TO runcontrol_system;
GRANT USAGE ON SEQUENCE event_feed_position_seq TO runcontrol_system;
GRANT SELECT ON webhook_subscriptions TO runcontrol_system;
GRANT SELECT, INSERT, UPDATE, DELETE ON webhook_deliveries TO runcontrol_system;
