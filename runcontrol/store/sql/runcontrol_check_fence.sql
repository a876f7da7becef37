-- A shard's move (issue 41; store/move.py, docs/sharding.md "Moving a tenant"): a document of a
-- tenant whose rows left this database (or are leaving it) is refused in its own transaction,
-- RC421, which the hosts take as "route again" (errors.ShardMoved): a host whose directory is
-- stale cannot commit here. The tenant's advisory lock is taken shared, held to the commit: the
-- move takes it exclusive to write the fence, so it waits for every document of the tenant in
-- flight, and one that comes after waits for the fence and then finds it (this read is a
-- statement of its own: a new snapshot, in READ COMMITTED).
CREATE OR REPLACE FUNCTION runcontrol_check_fence(tenant text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    fence record;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(72616041, hashtext(tenant));
    SELECT f.vshard, f.moved_to, f.epoch INTO fence FROM shard_fences f WHERE f.tenant_id = tenant;
    IF FOUND THEN
        RAISE EXCEPTION 'tenant % moved with virtual shard % to database % (epoch %)',
            tenant, fence.vshard, fence.moved_to, fence.epoch USING ERRCODE = 'RC421';
    END IF;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_check_fence(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_check_fence(text) TO runcontrol_app;
