"""The relay's floor and the tenant feed as pages (issue 42; docs/write-path.md sections 6
and 7): an event row is no longer updated when it is published. The relay advances one floor
per database (``relay_state``: every event row with ``id <= floor`` is published, or its
transaction never committed) once a pass, and writes the pass's events into their tenants'
feeds as one ``feed_pages`` row per tenant (the events' ids in publication order; a position
is ``first_position`` plus the index, counted from the tenant's own last page). 13 non-HOT
updates a run go, and ``ix_outbox_unpublished`` (one index entry per event) with them.

The stored data is upgraded in place: every row the previous relays marked keeps its feed
position, as a page (one per run of consecutive positions of a tenant), so every feed cursor
and every webhook delivery's position stays valid; the floor starts below the first row still
unmarked. The outbox is locked first (SHARE: every transaction that drew an outbox id has
ended, none draws one until the commit), so no row below the floor can commit later; the write
path waits for this transaction meanwhile, which reads every marked row once (time it on a
copy of a large database).

The previous release's relay marks rows (``published_at``, ``feed_position``): the append-only
trigger now refuses both, so its passes roll back, nothing is lost, and this release's relay
publishes every row past the floor once it holds the scheduler's lock (the relay runs in the
scheduler that holds it: one at a time). Its readers of the feed (``outbox.feed_position``)
see the feed as it stood at the upgrade until they are replaced; ``event_feed`` (a view since
0033) now shows the pages. Its documents apply as
before.

Revision ID: 0039
"""

from __future__ import annotations

from alembic import op

from runcontrol.store import rls
from runcontrol.store.tables import feed_pages

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None

# The previous release's documents and reads work as before; its relay's passes are refused
# (see above) until it is replaced, nothing lost.
oldest_code = "0038"

SCHEMA = """
LOCK TABLE outbox IN SHARE MODE;

DROP TRIGGER outbox_append_only ON outbox;
CREATE TRIGGER outbox_append_only BEFORE UPDATE ON outbox FOR EACH ROW
    WHEN ((to_jsonb(OLD) - 'payload') IS DISTINCT FROM (to_jsonb(NEW) - 'payload')
          OR (NEW.payload IS NOT NULL AND NEW.payload IS DISTINCT FROM OLD.payload))
    EXECUTE FUNCTION runcontrol_forbid_mutation();
REVOKE UPDATE (published_at, feed_position) ON outbox FROM runcontrol_system;
DROP INDEX ix_outbox_unpublished;

CREATE TABLE feed_pages (
    tenant_id TEXT NOT NULL,
    first_position BIGINT NOT NULL,
    ids BIGINT[] NOT NULL,
    published_at TIMESTAMP WITH TIME ZONE NOT NULL,
    CONSTRAINT feed_pages_pkey PRIMARY KEY (tenant_id, first_position)
);
CREATE INDEX ix_feed_pages_published ON feed_pages USING brin (published_at);
ALTER TABLE outbox NO FORCE ROW LEVEL SECURITY;
INSERT INTO feed_pages (tenant_id, first_position, ids, published_at)
    SELECT tenant_id, min(feed_position), array_agg(id ORDER BY feed_position),
           max(published_at)
    FROM (SELECT tenant_id, feed_position, id, published_at,
                 feed_position - row_number() OVER (PARTITION BY tenant_id
                                                    ORDER BY feed_position) AS island
          FROM outbox WHERE feed_position IS NOT NULL) marked
    GROUP BY tenant_id, island;

CREATE TABLE relay_state (
    id INTEGER NOT NULL,
    floor BIGINT NOT NULL,
    mark_drawn BIGINT,
    mark_xmax BIGINT,
    updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
    CONSTRAINT relay_state_pkey PRIMARY KEY (id)
);
INSERT INTO relay_state (id, floor, updated_at)
    SELECT 1, coalesce((SELECT min(id) - 1 FROM outbox WHERE feed_position IS NULL),
                       (SELECT max(id) FROM outbox), 0), now();
ALTER TABLE outbox FORCE ROW LEVEL SECURITY;

-- event_feed (a view since 0033): the pages' events at their positions
CREATE OR REPLACE VIEW event_feed WITH (security_invoker = true) AS
    SELECT p.first_position + u.n - 1 AS position, o.event_id, o.tenant_id, o.project_id,
           o.run_id, o.seq, p.published_at
    FROM feed_pages p
    CROSS JOIN LATERAL unnest(p.ids) WITH ORDINALITY AS u(id, n)
    JOIN outbox o ON o.id = u.id;
GRANT SELECT ON feed_pages TO runcontrol_app;
GRANT SELECT, INSERT, DELETE ON feed_pages TO runcontrol_system;
GRANT SELECT ON relay_state TO runcontrol_app;
GRANT SELECT, UPDATE ON relay_state TO runcontrol_system;
"""


def upgrade() -> None:
    op.execute(SCHEMA)
    op.execute("\n".join(rls.table_statements(feed_pages)))  # the tenant's rows only


def downgrade() -> None:
    raise NotImplementedError("0039 has no downgrade: restore from a backup taken before it")
