-- Migration 0017: flow control, part 1 (issue 21, docs/flow-control.md): concurrency keys
-- with ordered release, priority, held steps; the tenant's cap on open attempts goes through
-- the same queue.
--
-- A dispatch that needs slots carries them in its document ("flow"); runcontrol_flow_admit,
-- called by runcontrol_apply only for such documents, takes each key's advisory lock and
-- admits the holder only if the key's holders and promoted waiters leave room and nobody
-- queued ahead of it (priority, then arrival) is waiting, or if it is the promoted waiter;
-- else it raises RC430 with what it found, rolling back this document only. The grain then
-- decides again holding the step, and that commit queues it ("flow_wait"). The slots are rows
-- inserted by the admitting statement and deleted by triggers in the transaction that makes
-- their holder terminal (the attempt for a step's key and the cap, the run for a workflow-wide
-- key), which promote the next waiters in order and make their runs due: the dispatcher's
-- event-driven sweep wakes exactly them. A run that ends while it waits leaves its queues
-- the same way.

ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 3, ADD COLUMN flow JSONB;
ALTER TABLE steps ADD COLUMN flow JSONB, ADD COLUMN held JSONB;

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

ALTER TABLE flow_slots ENABLE ROW LEVEL SECURITY;
ALTER TABLE flow_slots FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON flow_slots
    USING (tenant_id = current_setting('runcontrol.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true));
ALTER TABLE flow_waiters ENABLE ROW LEVEL SECURITY;
ALTER TABLE flow_waiters FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON flow_waiters
    USING (tenant_id = current_setting('runcontrol.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true));
GRANT SELECT, INSERT, UPDATE, DELETE ON flow_slots, flow_waiters TO runcontrol_app;
GRANT USAGE ON SEQUENCE flow_waiters_seq TO runcontrol_app;
GRANT SELECT ON flow_slots, flow_waiters TO runcontrol_system;

-- One key's lock: every admission, queueing and release of the key is serialised by it, so
-- two statements can never both take its last slot.
CREATE FUNCTION runcontrol_flow_lock(tenant text, fname text, fkey text)
RETURNS void LANGUAGE sql AS $fn$
    SELECT pg_advisory_xact_lock(hashtextextended('flow' || chr(31) || tenant || chr(31)
                                                  || fname || chr(31) || fkey, 0));
$fn$;

-- Give the key's free slots to its next waiters (priority desc, then arrival) and make their
-- runs due. The caller holds the key's lock.
CREATE FUNCTION runcontrol_flow_promote(tenant text, fname text, fkey text)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    taken bigint;
    head flow_waiters%ROWTYPE;
BEGIN
    LOOP
        SELECT (SELECT count(*) FROM flow_slots
                    WHERE tenant_id = tenant AND name = fname AND key = fkey)
             + (SELECT count(*) FROM flow_waiters
                    WHERE tenant_id = tenant AND name = fname AND key = fkey AND promoted)
            INTO taken;
        SELECT * INTO head FROM flow_waiters
            WHERE tenant_id = tenant AND name = fname AND key = fkey AND NOT promoted
            ORDER BY priority DESC, seq LIMIT 1;
        EXIT WHEN NOT FOUND OR taken >= head.max_holders;
        UPDATE flow_waiters SET promoted = true
            WHERE tenant_id = tenant AND name = fname AND key = fkey AND holder = head.holder;
        UPDATE runs AS r SET next_due_at = LEAST(coalesce(r.next_due_at, now()), now())
            WHERE r.run_id = head.run_id AND r.state NOT IN ('Completed', 'Failed', 'Cancelled');
    END LOOP;
END $fn$;

-- The document's slots, taken or refused (RC430). Entries come in one order (flow.lock_order:
-- concurrency keys by name and key, the tenant's cap last) so two statements take the keys'
-- locks alike. Each: {name, key, limit, kind, strategy,
-- holder (the run or the attempt), waiter (the run or the step: its queue row), run_id,
-- attempt_id, priority, at}.
CREATE FUNCTION runcontrol_flow_admit(tenant text, wanted jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    w jsonb;
    fname text;
    fkey text;
    mine flow_waiters%ROWTYPE;
    taken bigint;
    mine_priority int;
    ahead boolean;
BEGIN
    FOR w IN SELECT value FROM jsonb_array_elements(wanted) LOOP
        fname := w->>'name';
        fkey := w->>'key';
        PERFORM runcontrol_flow_lock(tenant, fname, fkey);
        -- a run's workflow-wide slot, taken by its first dispatch
        CONTINUE WHEN EXISTS (SELECT 1 FROM flow_slots WHERE tenant_id = tenant
                              AND name = fname AND key = fkey AND holder = w->>'holder');
        SELECT * INTO mine FROM flow_waiters
            WHERE tenant_id = tenant AND name = fname AND key = fkey AND holder = w->>'waiter';
        IF NOT FOUND OR NOT mine.promoted THEN
            mine_priority := (w->>'priority')::int;
            SELECT (SELECT count(*) FROM flow_slots
                        WHERE tenant_id = tenant AND name = fname AND key = fkey)
                 + (SELECT count(*) FROM flow_waiters
                        WHERE tenant_id = tenant AND name = fname AND key = fkey AND promoted)
                INTO taken;
            -- a newcomer never jumps the queue: anyone unpromoted before it in its order
            ahead := EXISTS (
                SELECT 1 FROM flow_waiters
                WHERE tenant_id = tenant AND name = fname AND key = fkey AND NOT promoted
                  AND holder <> w->>'waiter'
                  AND (priority > mine_priority
                       OR (priority = mine_priority AND (mine.seq IS NULL OR seq < mine.seq))));
            IF ahead OR taken >= (w->>'limit')::int THEN
                RAISE EXCEPTION 'concurrency key busy: %', jsonb_build_object(
                    'name', fname, 'key', fkey, 'limit', (w->>'limit')::int,
                    'kind', w->>'kind', 'strategy', w->>'strategy', 'holders', taken,
                    'holderRuns', (SELECT coalesce(jsonb_agg(DISTINCT run_id), '[]'::jsonb)
                                   FROM flow_slots WHERE tenant_id = tenant
                                   AND name = fname AND key = fkey))
                    USING ERRCODE = 'RC430';
            END IF;
        END IF;
        DELETE FROM flow_waiters
            WHERE tenant_id = tenant AND name = fname AND key = fkey AND holder = w->>'waiter';
        INSERT INTO flow_slots (tenant_id, name, key, holder, run_id, attempt_id, kind,
                                max_holders, taken_at)
            VALUES (tenant, fname, fkey, w->>'holder', (w->>'run_id')::uuid,
                    (w->>'attempt_id')::uuid, w->>'kind', (w->>'limit')::int,
                    (w->>'at')::timestamptz);
    END LOOP;
END $fn$;

-- The document's held steps queued (once: a repeat keeps the first arrival). A slot that
-- freed between the refusal and this statement is given here: the queue is never left
-- waiting with a free slot. Each: {name, key, limit, kind, waiter, run_id, step_id, priority,
-- at}.
CREATE FUNCTION runcontrol_flow_wait(tenant text, waits jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    w jsonb;
BEGIN
    FOR w IN SELECT value FROM jsonb_array_elements(waits) LOOP
        PERFORM runcontrol_flow_lock(tenant, w->>'name', w->>'key');
        INSERT INTO flow_waiters (tenant_id, name, key, holder, run_id, step_id, kind,
                                  max_holders, priority, seq, promoted, enqueued_at)
            VALUES (tenant, w->>'name', w->>'key', w->>'waiter', (w->>'run_id')::uuid,
                    (w->>'step_id')::uuid, w->>'kind', (w->>'limit')::int,
                    (w->>'priority')::int, nextval('flow_waiters_seq'), false,
                    (w->>'at')::timestamptz)
            ON CONFLICT ON CONSTRAINT pk_flow_waiters DO NOTHING;
        PERFORM runcontrol_flow_promote(tenant, w->>'name', w->>'key');
    END LOOP;
END $fn$;

-- An attempt settled: its slots free, in its own transaction, and the next waiters move up.
-- An attempt parked for an approval frees only its slot of the tenant's cap (which counts
-- Dispatched and Leased attempts, docs/approvals.md); a concurrency key stays held until the
-- attempt ends (the work it guards is half done).
CREATE FUNCTION runcontrol_flow_attempt_settled() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT tenant_id, name, key FROM flow_slots
             WHERE attempt_id = NEW.attempt_id AND (NEW.state <> 'Parked' OR kind = 'capacity')
             ORDER BY kind = 'capacity', name, key LOOP  -- flow.lock_order
        PERFORM runcontrol_flow_lock(s.tenant_id, s.name, s.key);
        DELETE FROM flow_slots WHERE tenant_id = s.tenant_id AND name = s.name AND key = s.key
            AND attempt_id = NEW.attempt_id;
        PERFORM runcontrol_flow_promote(s.tenant_id, s.name, s.key);
    END LOOP;
    RETURN NULL;
END $fn$;
CREATE TRIGGER flow_attempt_settled AFTER UPDATE OF state ON attempts FOR EACH ROW
    WHEN (OLD.state IN ('Dispatched', 'Leased', 'Parked') AND NEW.state <> OLD.state
          AND NEW.state NOT IN ('Dispatched', 'Leased'))
    EXECUTE FUNCTION runcontrol_flow_attempt_settled();

-- A run ended: every slot it holds frees and it leaves every queue it waits in, in the
-- transaction that ends it; the next waiters move up.
CREATE FUNCTION runcontrol_flow_run_ended() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT tenant_id, name, key, kind FROM (
                 SELECT tenant_id, name, key, kind FROM flow_slots WHERE run_id = NEW.run_id
                 UNION SELECT tenant_id, name, key, kind FROM flow_waiters
                       WHERE run_id = NEW.run_id
             ) k ORDER BY kind = 'capacity', name, key LOOP  -- flow.lock_order
        PERFORM runcontrol_flow_lock(s.tenant_id, s.name, s.key);
        DELETE FROM flow_slots WHERE tenant_id = s.tenant_id AND name = s.name AND key = s.key
            AND run_id = NEW.run_id;
        DELETE FROM flow_waiters WHERE tenant_id = s.tenant_id AND name = s.name
            AND key = s.key AND run_id = NEW.run_id;
        PERFORM runcontrol_flow_promote(s.tenant_id, s.name, s.key);
    END LOOP;
    RETURN NULL;
END $fn$;
CREATE TRIGGER flow_run_ended AFTER UPDATE OF state ON runs FOR EACH ROW
    WHEN (NEW.state IN ('Completed', 'Failed', 'Cancelled')
          AND OLD.state NOT IN ('Completed', 'Failed', 'Cancelled'))
    EXECUTE FUNCTION runcontrol_flow_run_ended();

REVOKE ALL ON FUNCTION runcontrol_flow_lock(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runcontrol_flow_promote(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION runcontrol_flow_admit(text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runcontrol_flow_wait(text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION runcontrol_flow_attempt_settled() FROM PUBLIC;
REVOKE ALL ON FUNCTION runcontrol_flow_run_ended() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_flow_lock(text, text, text) TO runcontrol_app;
GRANT EXECUTE ON FUNCTION runcontrol_flow_promote(text, text, text) TO runcontrol_app;
GRANT EXECUTE ON FUNCTION runcontrol_flow_admit(text, jsonb) TO runcontrol_app;
GRANT EXECUTE ON FUNCTION runcontrol_flow_wait(text, jsonb) TO runcontrol_app;
GRANT EXECUTE ON FUNCTION runcontrol_flow_attempt_settled() TO runcontrol_app;
GRANT EXECUTE ON FUNCTION runcontrol_flow_run_ended() TO runcontrol_app;

-- 0015's runcontrol_apply is not restated: renamed, and called by the new one, which then
-- takes the document's slots and queues its held steps (after every row they refer to).
-- A document without them pays two key tests.
ALTER FUNCTION runcontrol_apply(jsonb) RENAME TO runcontrol_apply_0015;
REVOKE ALL ON FUNCTION runcontrol_apply_0015(jsonb) FROM PUBLIC;

CREATE FUNCTION runcontrol_apply(doc jsonb) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM runcontrol_apply_0015(doc);
    IF doc ? 'flow' THEN PERFORM runcontrol_flow_admit(doc->>'tenant', doc->'flow'); END IF;
    IF doc ? 'flow_wait' THEN
        PERFORM runcontrol_flow_wait(doc->>'tenant', doc->'flow_wait');
    END IF;
    -- A run with held steps rewrote its reminder from its cache, which cannot know that one
    -- of them was promoted meanwhile: keep the promotion's "due now".
    IF doc ? 'flow_held' THEN
        UPDATE runs AS r SET next_due_at = LEAST(coalesce(r.next_due_at, now()), now())
            WHERE r.run_id = (doc->'run'->>'run_id')::uuid
              AND EXISTS (SELECT 1 FROM flow_waiters w
                          WHERE w.run_id = (doc->'run'->>'run_id')::uuid AND w.promoted);
    END IF;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_apply(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_apply(jsonb) TO runcontrol_app;
