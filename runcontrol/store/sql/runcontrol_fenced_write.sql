-- The fence of a shard's move on the writes that are not documents (0040; docs/sharding.md
-- "Moving a tenant"): a trigger, BEFORE each row's INSERT, UPDATE or DELETE, on a tenant's
-- configuration tables (releases and their aliases, policies, schedules and their fires,
-- webhook subscriptions, push configs, templates and their uses, rate buckets). A write of a
-- fenced tenant is refused in its own transaction, RC421 (errors.ShardMoved: route again),
-- as its documents are by runcontrol_check_fence, under the same lock taken shared and held
-- to the commit: the fence waits for the tenant's writes in flight. The tables' owner is not
-- refused: a move copies the rows into the target (which may hold a fence of an earlier move
-- away) and removes the source's copy as the owner. That test is read only once a fence is
-- found, so an unfenced tenant's write pays the lock and one index probe. The tables the
-- documents write are not here: runcontrol_apply_document checks once per document.
CREATE OR REPLACE FUNCTION runcontrol_fenced_write() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    written record;
BEGIN
    IF TG_OP = 'DELETE' THEN
        written := OLD;
    ELSE
        written := NEW;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(72616041, hashtext(written.tenant_id));
    PERFORM FROM shard_fences f WHERE f.tenant_id = written.tenant_id;
    IF FOUND AND NOT EXISTS (
        SELECT FROM pg_class c WHERE c.oid = TG_RELID AND c.relowner = current_user::regrole
    ) THEN
        PERFORM runcontrol_check_fence(written.tenant_id);  -- raises RC421, as a document's
    END IF;
    RETURN written;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_fenced_write() FROM PUBLIC;
