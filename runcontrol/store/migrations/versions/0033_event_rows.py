"""One event row for the outbox, the feed and the journal (issue 42; docs/write-path.md
section 7): a document's journal entries are carried by its last event (``outbox.journal``, a
JSON array of entries without their tenant and run), and ``recovery_journal`` is a view that
expands them, after the entries written before this revision (the old table, renamed
``recovery_journal_legacy``, kept as it was and no longer written). A transition and its
journal entries are thus one row insert, complete by construction; 18 journal inserts a run
go. The stored data is upgraded in place, without copying: the old entries stay where they
are, read through the view, until retention purges them.

The tenant feed is read from the event rows: the relay marks each row it publishes with its
feed position (``feed_position``, from the feed's counter, in the same UPDATE as
``published_at``) instead of writing an ``event_feed`` row, so 13 feed inserts a run go too.
The upgrade gives every published row its feed row's position and drops the table (its
counter kept as ``feed_position_seq``); ``event_feed`` stays as a read-only view of the rows,
for the previous release's readers. Webhook deliveries keep their positions (no foreign key:
the events' retention deletes the deliveries of the events it removes).

Append-only at the database level, even for the owner: an event row's columns never change but
``published_at`` and ``feed_position`` once (the relay) and ``payload`` to NULL (the events'
retention, 90 d: a row that
carries journal entries keeps them); a row carrying journal entries is deleted only by
``runcontrol_purge_journal`` (the journal's horizon, 365 d). The app role inserts and reads
event rows, no longer updates them. ``ix_outbox_occurred`` (BRIN, nearly free to keep) serves
a stalled agent's recent claims (``LeaseGranted`` events) where the journal's time index did.

Functions: ``runcontrol_fold_journal`` puts the journal entries of a previous release's
document (sent apart) on its last event, so its hosts keep committing through the upgrade;
``runcontrol_apply_document`` refuses entries with no event (invariant 3); the group append
and the single apply write no journal rows; the purge deletes the event rows past the cutoff.
The previous release's writers of the journal table are dropped. Lean child rows (issue 42,
point 2): ``runcontrol_patch_steps``, ``_attempts`` and ``_leases`` update a stored row with
only the columns a document's ``<table>_patch`` carries (``store/lean.py``); a previous
release's document sends whole rows, applied as before.

Revision ID: 0033
"""

from __future__ import annotations

from alembic import op

from runcontrol.store.functions import apply

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None

# The previous release's documents apply as before (their journal folded onto their last
# event), its readers read the views; only its scheduler's relay and retention passes are
# refused until it is replaced (the relay's feed insert: event_feed is a view; the retention:
# it would delete event rows that carry journal entries): each rolls back, nothing is lost,
# and this release's relay publishes what it left.
oldest_code = "0032"

SCHEMA = """
ALTER TABLE outbox ADD COLUMN journal jsonb;
ALTER TABLE outbox ADD COLUMN feed_position bigint;
ALTER TABLE outbox ALTER COLUMN payload DROP NOT NULL;
CREATE INDEX ix_outbox_occurred ON outbox USING brin (occurred_at);

-- The feed on the event rows: each published row takes its feed row's position (as the
-- owner, whom the tenant policy would otherwise bind), then the feed's table goes, its
-- position counter kept; a read-only view keeps the previous release's readers of it working.
ALTER TABLE outbox NO FORCE ROW LEVEL SECURITY;
ALTER TABLE event_feed NO FORCE ROW LEVEL SECURITY;
UPDATE outbox o SET feed_position = f.position FROM event_feed f WHERE f.event_id = o.event_id;
ALTER TABLE outbox FORCE ROW LEVEL SECURITY;
DROP INDEX ix_outbox_unpublished;
CREATE INDEX ix_outbox_unpublished ON outbox (id) WHERE feed_position IS NULL;
CREATE UNIQUE INDEX uq_outbox_feed ON outbox (tenant_id, feed_position)
    WHERE feed_position IS NOT NULL;
ALTER TABLE webhook_deliveries DROP CONSTRAINT fk_deliveries_feed;
ALTER SEQUENCE event_feed_position_seq OWNED BY NONE;
DROP TABLE event_feed;
ALTER SEQUENCE event_feed_position_seq RENAME TO feed_position_seq;
GRANT UPDATE ON SEQUENCE feed_position_seq TO runcontrol_system;  -- a batch's draw: setval
CREATE VIEW event_feed WITH (security_invoker = true) AS
    SELECT feed_position AS position, event_id, tenant_id, project_id, run_id, seq, published_at
    FROM outbox WHERE feed_position IS NOT NULL;
GRANT SELECT ON event_feed TO runcontrol_app, runcontrol_system;
CREATE POLICY retention_purge ON outbox FOR DELETE
    USING (current_setting('runcontrol.retention_purge', true) = 'on');
REVOKE UPDATE ON outbox FROM runcontrol_app;
GRANT UPDATE (published_at, payload, feed_position) ON outbox TO runcontrol_system;
CREATE TRIGGER outbox_append_only BEFORE UPDATE ON outbox FOR EACH ROW
    WHEN ((to_jsonb(OLD) - 'published_at' - 'payload' - 'feed_position')
          IS DISTINCT FROM (to_jsonb(NEW) - 'published_at' - 'payload' - 'feed_position')
          OR (NEW.payload IS NOT NULL AND NEW.payload IS DISTINCT FROM OLD.payload)
          OR (OLD.feed_position IS NOT NULL
              AND NEW.feed_position IS DISTINCT FROM OLD.feed_position))
    EXECUTE FUNCTION runcontrol_forbid_mutation();
CREATE TRIGGER outbox_keeps_journal BEFORE DELETE ON outbox FOR EACH ROW
    WHEN (OLD.journal IS NOT NULL)
    EXECUTE FUNCTION runcontrol_forbid_mutation();
CREATE TRIGGER outbox_no_truncate BEFORE TRUNCATE ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION runcontrol_forbid_mutation();

ALTER TABLE recovery_journal RENAME TO recovery_journal_legacy;
ALTER TABLE recovery_journal_legacy
    RENAME CONSTRAINT recovery_journal_pkey TO recovery_journal_legacy_pkey;
ALTER SEQUENCE recovery_journal_id_seq RENAME TO recovery_journal_legacy_id_seq;
ALTER TRIGGER recovery_journal_append_only ON recovery_journal_legacy
    RENAME TO recovery_journal_legacy_append_only;
ALTER TRIGGER recovery_journal_no_truncate ON recovery_journal_legacy
    RENAME TO recovery_journal_legacy_no_truncate;
REVOKE INSERT ON recovery_journal_legacy FROM runcontrol_app;
DROP FUNCTION IF EXISTS runcontrol_write_recovery_journal(jsonb);
DROP FUNCTION IF EXISTS runcontrol_append_recovery_journal(jsonb, int[], text, text);

CREATE VIEW recovery_journal WITH (security_invoker = true) AS
    SELECT o.id, o.tenant_id, o.run_id, j.sequence, j.entity, j.entity_id, j.from_state,
           j.to_state, j.cause, j.actor, j.occurred_at
    FROM outbox o
    CROSS JOIN LATERAL jsonb_to_recordset(o.journal) AS j(
        sequence bigint, entity text, entity_id uuid, from_state text, to_state text,
        cause text, actor text, occurred_at timestamptz)
    WHERE o.journal IS NOT NULL
    UNION ALL
    SELECT id, tenant_id, run_id, sequence, entity, entity_id, from_state, to_state, cause,
           actor, occurred_at
    FROM recovery_journal_legacy;
GRANT SELECT ON recovery_journal TO runcontrol_app, runcontrol_system;
"""

FUNCTIONS = {
    "runcontrol_append_rows": "594d4d2310e3d6161ad6e0b9b2da1427",
    "runcontrol_apply": "bb2facadf2451c9eeb7d880c55549d92",
    "runcontrol_apply_document": "75b841bb96e439aab906b998d002c6d7",
    "runcontrol_apply_many": "9af6e722630c2a040ab2217286b483d9",
    "runcontrol_fold_journal": "d6ec835634248deef1ec81742048c1bc",
    "runcontrol_purge_journal": "176d1c249f95ef2b406dedf653eb1d5e",
    "runcontrol_write_outbox": "400f1bd7ed3262bf29e4b642f882ae09",
    "runcontrol_patch_steps": "7ce63ad0bb0c5dce7bc407f8e15353dc",
    "runcontrol_patch_attempts": "5458b2bc1bbc93142d1a6debaca6c05e",
    "runcontrol_patch_leases": "208f8b71de81172da6fdef58a06fbfd3",
    "runcontrol_append_outbox": "dc97d412e725d2259516c61b81105c95",
}


def upgrade() -> None:
    op.execute(SCHEMA)
    apply(FUNCTIONS)


def downgrade() -> None:
    raise NotImplementedError("0033 has no downgrade: restore from a backup taken before it")
