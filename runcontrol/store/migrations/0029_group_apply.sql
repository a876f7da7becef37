-- Migration 0029 (issue 33): a group commit appends its documents' rows in one statement per
-- table, and a document is applied by one function, not a chain of five; the output writer
-- NOTIFYs only while somebody listens (last in this file).
--
-- Measured before (pg_stat_statements, track = all, `python -m bench --only e2e
-- --e2e-transport sdk`, docs/benchmarks.md): a run commits ~5.5 documents in ~0.6 group
-- commits, and each document ran ~20 statements: five nested runcontrol_apply functions
-- (0026 -> 0021 -> 0017 -> 0015 -> 0014, each wrapping the previous), the run's update, a
-- statement per table it writes, two listener checks. The append-only tables (outbox,
-- recovery_journal, command_answers, attempt_results, audit_log) took one INSERT per document
-- each for one to three rows: ~0.5 ms of the ~2.4 ms a document cost PostgreSQL.
--
-- runcontrol_apply_document(doc, appends, wake_dispatch, wake_events) is the whole of what
-- the chain did for a document, in the same order and with the same errors; it writes the
-- append-only rows only when told to (appends), and sends the wake-ups it is told somebody
-- hears. runcontrol_apply(doc) calls it with the appends and its own listener checks (as
-- 0026 did: the lock only for a document that wakes somebody).
--
-- runcontrol_apply_many(docs) checks the two channels' listeners once (the ACCESS SHARE lock
-- is held to the commit either way: 0026's reasoning holds for a check made at the start),
-- applies each document without its appends in a subtransaction of its own (one that fails
-- rolls back alone, as before), then appends the rows of the documents that applied, one
-- INSERT per table and tenant (row-level security checks each row against its tenant), in
-- document order. No document reads what another's appends write, so deferring them to the
-- end changes no outcome. Should an append fail (a duplicate answer, say), the whole group is
-- rolled back and applied again document by document, appends included, so that the
-- failing document alone is refused, as before.
--
-- The chain's functions stay (renamed or not) and are no longer called; a document of the
-- previous release applies as it did (keys "notify_run", "notify_agents", mode "update").

ALTER FUNCTION runcontrol_apply(jsonb) RENAME TO runcontrol_apply_0026;
REVOKE ALL ON FUNCTION runcontrol_apply_0026(jsonb) FROM PUBLIC;

CREATE FUNCTION runcontrol_apply_document(
    doc jsonb, appends boolean, wake_dispatch boolean, wake_events boolean
) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    wrote boolean;  -- a writer called as an expression: no executor started per call
BEGIN
    PERFORM set_config('runcontrol.tenant_id', doc->>'tenant', true);
    -- Nested, not ANDed: SQL does not promise to evaluate the mode before the writer.
    IF doc->>'mode' = 'patch' THEN
        IF NOT runcontrol_patch_runs(doc->'run', (doc->>'expected_version')::bigint) THEN
            RAISE EXCEPTION 'the run changed since it was loaded' USING ERRCODE = 'RC409';
        END IF;
    ELSIF doc->>'mode' = 'insert' THEN
        IF NOT runcontrol_insert_runs(doc->'run') THEN
            RAISE EXCEPTION 'the idempotency key already names a run' USING ERRCODE = 'RC001';
        END IF;
    ELSIF doc->>'mode' = 'update' THEN
        IF NOT runcontrol_update_runs(doc->'run', (doc->>'expected_version')::bigint) THEN
            RAISE EXCEPTION 'the run changed since it was loaded' USING ERRCODE = 'RC409';
        END IF;
    END IF;
    IF doc ? 'reserve' THEN
        PERFORM runcontrol_reserve_budget(doc->>'tenant', (doc->'run'->>'run_id')::uuid,
                                          doc->'reserve');
    END IF;
    IF doc ? 'steps' THEN wrote := runcontrol_write_steps(doc->'steps'); END IF;
    IF doc ? 'attempts' THEN wrote := runcontrol_write_attempts(doc->'attempts'); END IF;
    IF doc ? 'capacity' THEN
        PERFORM runcontrol_check_capacity(doc->>'tenant', (doc->>'capacity')::int);
    END IF;
    IF doc ? 'leases' THEN wrote := runcontrol_write_leases(doc->'leases'); END IF;
    IF doc ? 'tool_calls' THEN wrote := runcontrol_write_tool_calls(doc->'tool_calls'); END IF;
    IF doc ? 'approvals' THEN
        wrote := runcontrol_write_approval_requests(doc->'approvals');
    END IF;
    IF doc ? 'decisions' THEN
        wrote := runcontrol_write_approval_decisions(doc->'decisions');
    END IF;
    IF doc ? 'intents' THEN
        wrote := runcontrol_write_cancellation_intents(doc->'intents');
    END IF;
    IF appends THEN
        IF doc ? 'outbox' THEN wrote := runcontrol_write_outbox(doc->'outbox'); END IF;
        IF doc ? 'journal' THEN
            wrote := runcontrol_write_recovery_journal(doc->'journal');
        END IF;
        IF doc ? 'audits' THEN wrote := runcontrol_write_audit_log(doc->'audits'); END IF;
        IF doc ? 'answer' THEN
            wrote := runcontrol_write_command_answers(jsonb_build_array(doc->'answer'));
        END IF;
        IF doc ? 'answers' THEN
            wrote := runcontrol_write_command_answers(doc->'answers');
        END IF;
    END IF;
    IF doc ? 'release_budget' THEN
        PERFORM runcontrol_release_budget((doc->'run'->>'run_id')::uuid,
                                          (doc->>'release_budget')::timestamptz);
    END IF;
    IF doc ? 'notify_agents' THEN  -- the previous release's documents
        PERFORM pg_notify('runcontrol_dispatch', agent)
            FROM jsonb_array_elements_text(doc->'notify_agents') agent;
    END IF;
    IF doc ? 'notify_run' THEN
        PERFORM pg_notify('runcontrol_events', doc->>'notify_run');
    END IF;
    IF appends AND doc ? 'results' THEN  -- 0015
        wrote := runcontrol_write_attempt_results(doc->'results');
    END IF;
    IF doc ? 'flow' THEN PERFORM runcontrol_flow_admit(doc->>'tenant', doc->'flow'); END IF;
    IF doc ? 'flow_wait' THEN  -- 0017
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
    IF doc ? 'calls' THEN wrote := runcontrol_write_journaled_calls(doc->'calls'); END IF;
    IF wake_dispatch AND doc ? 'wake_agents' THEN  -- 0026
        PERFORM pg_notify('runcontrol_dispatch', agent)
            FROM jsonb_array_elements_text(doc->'wake_agents') agent;
    END IF;
    IF wake_events AND doc ? 'wake_run' THEN
        PERFORM pg_notify('runcontrol_events', doc->>'wake_run');
    END IF;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_apply_document(jsonb, boolean, boolean, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_apply_document(jsonb, boolean, boolean, boolean)
    TO runcontrol_app;

CREATE FUNCTION runcontrol_apply(doc jsonb) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    wake_dispatch boolean := false;
    wake_events boolean := false;
BEGIN
    -- Nested, not ANDed: SQL does not promise to evaluate the key test first.
    IF doc ? 'wake_agents' THEN
        wake_dispatch := runcontrol_listened('runcontrol_dispatch');
    END IF;
    IF doc ? 'wake_run' THEN
        wake_events := runcontrol_listened('runcontrol_events');
    END IF;
    PERFORM runcontrol_apply_document(doc, true, wake_dispatch, wake_events);
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_apply(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_apply(jsonb) TO runcontrol_app;

-- The append-only rows of the documents at the places ``applied`` (from 1): one INSERT per
-- table and tenant that has such rows (the writers runcontrol_append_<table>, 0029_writers.sql).
CREATE FUNCTION runcontrol_append_rows(docs jsonb, applied int[]) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    tenant text;
    present text[];
    wrote boolean;
BEGIN
    FOR tenant, present IN
        SELECT d.doc->>'tenant', array_agg(DISTINCT k)
        FROM jsonb_array_elements(docs) WITH ORDINALITY AS d(doc, place)
        CROSS JOIN LATERAL jsonb_object_keys(d.doc) k
        WHERE d.place = ANY(applied)
          AND k IN ('outbox', 'journal', 'audits', 'answer', 'answers', 'results')
        GROUP BY 1
    LOOP
        PERFORM set_config('runcontrol.tenant_id', tenant, true);
        IF 'outbox' = ANY(present) THEN
            wrote := runcontrol_append_outbox(docs, applied, 'outbox', tenant);
        END IF;
        IF 'journal' = ANY(present) THEN
            wrote := runcontrol_append_recovery_journal(docs, applied, 'journal', tenant);
        END IF;
        IF 'audits' = ANY(present) THEN
            wrote := runcontrol_append_audit_log(docs, applied, 'audits', tenant);
        END IF;
        IF 'answer' = ANY(present) THEN
            wrote := runcontrol_append_command_answers(docs, applied, 'answer', tenant);
        END IF;
        IF 'answers' = ANY(present) THEN
            wrote := runcontrol_append_command_answers(docs, applied, 'answers', tenant);
        END IF;
        IF 'results' = ANY(present) THEN
            wrote := runcontrol_append_attempt_results(docs, applied, 'results', tenant);
        END IF;
    END LOOP;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_append_rows(jsonb, int[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_append_rows(jsonb, int[]) TO runcontrol_app;

-- Each document applied in a subtransaction of its own (one that fails rolls back alone): the
-- answers, in order, null for a document applied or [SQLSTATE, message] for one rolled back,
-- and the places (from 1) of those applied.
CREATE FUNCTION runcontrol_apply_each(
    docs jsonb, appends boolean, wake_dispatch boolean, wake_events boolean,
    OUT answers jsonb, OUT applied int[]
) LANGUAGE plpgsql AS $fn$
DECLARE
    doc jsonb;
    place int;
BEGIN
    answers := '[]'::jsonb;
    applied := '{}';
    FOR doc, place IN SELECT value, ordinality FROM jsonb_array_elements(docs) WITH ORDINALITY
    LOOP
        BEGIN
            PERFORM runcontrol_apply_document(doc, appends, wake_dispatch, wake_events);
            answers := answers || jsonb_build_array(NULL::text);
            applied := applied || place;
        EXCEPTION WHEN OTHERS THEN
            answers := answers || jsonb_build_array(jsonb_build_array(SQLSTATE, SQLERRM));
        END;
    END LOOP;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_apply_each(jsonb, boolean, boolean, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_apply_each(jsonb, boolean, boolean, boolean)
    TO runcontrol_app;

-- Group commit: 0013's answers. The appends of the documents that applied follow them; should
-- one fail, all of it is rolled back and each document applied again with its own appends.
CREATE OR REPLACE FUNCTION runcontrol_apply_many(docs jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $fn$
DECLARE
    answers jsonb;
    applied int[];
    wake_dispatch boolean := runcontrol_listened('runcontrol_dispatch');
    wake_events boolean := runcontrol_listened('runcontrol_events');
BEGIN
    BEGIN
        SELECT e.answers, e.applied INTO answers, applied
            FROM runcontrol_apply_each(docs, false, wake_dispatch, wake_events) e;
        PERFORM runcontrol_append_rows(docs, applied);
        RETURN answers;
    EXCEPTION WHEN OTHERS THEN
        NULL;  -- an append failed (a duplicate answer, say): nothing above is kept
    END;
    SELECT e.answers INTO answers
        FROM runcontrol_apply_each(docs, true, wake_dispatch, wake_events) e;
    RETURN answers;
END $fn$;

-- 0022's output writer, restated with one change: it NOTIFYs runcontrol_output only while a
-- listener has registered on it (0026's gate: an output stream's LISTEN registers, checked
-- once per statement under the same lock). It sent one per stored write (three a run with
-- the SDK workers), each serialising its commit with every other notifying commit.
CREATE OR REPLACE FUNCTION runcontrol_append_output(writes jsonb, attempt_max bigint) RETURNS jsonb
LANGUAGE plpgsql AS $fn$
DECLARE
    w jsonb;
    answers jsonb := '[]'::jsonb;
    tenant text;
    run uuid;
    attempt uuid;
    token bigint;
    held record;
    last record;
    last_seq bigint;
    head bigint;
    acked bigint;
    total bigint;
    first_seq bigint;
    wanted int;
    dup int;
    stored int;
    refused text;
    why text;
    wake boolean := runcontrol_listened('runcontrol_output');
BEGIN
    FOR w IN SELECT value FROM jsonb_array_elements(writes) LOOP
        BEGIN
            tenant := w->>'tenant_id';
            run := (w->>'run_id')::uuid;
            attempt := (w->>'attempt_id')::uuid;
            token := (w->>'fencing_token')::bigint;
            refused := NULL;
            why := NULL;
            PERFORM set_config('runcontrol.tenant_id', tenant, true);
            SELECT l.lease_id, l.holder, l.fencing_token, a.step_id INTO held
              FROM leases l JOIN attempts a ON a.attempt_id = l.attempt_id
             WHERE l.attempt_id = attempt AND l.run_id = run AND l.released_at IS NULL
               FOR SHARE OF l;
            IF NOT FOUND OR held.fencing_token <> token
               OR (w->>'lease_id' IS NOT NULL AND (w->>'lease_id')::uuid <> held.lease_id) THEN
                refused := 'stale-fencing-token';
                why := format('fencing token %s is not the attempt''s current lease', token);
            ELSIF held.holder <> w->>'holder' THEN
                refused := 'lease-not-held';
                why := 'the caller does not hold this lease';
            END IF;
            IF refused IS NOT NULL THEN
                INSERT INTO audit_log (tenant_id, run_id, kind, actor, detail, occurred_at)
                VALUES (tenant, run, refused, w->>'holder',
                        jsonb_build_object('command', 'AppendOutput', 'attempt_id', attempt,
                                           'holder', w->>'holder', 'fencing_token', token),
                        now());
                answers := answers || jsonb_build_array(jsonb_build_object(
                    'acked', 0, 'stored', 0, 'duplicates', 0, 'error', refused, 'message', why));
                CONTINUE;
            END IF;

            INSERT INTO output_heads (run_id, tenant_id, position, updated_at)
            VALUES (run, tenant, 0, now()) ON CONFLICT (run_id) DO NOTHING;
            SELECT position INTO head FROM output_heads WHERE run_id = run FOR UPDATE;
            SELECT o.seq, o.fencing_token, o.lease_seq, o.attempt_bytes INTO last
              FROM output_chunks o WHERE o.attempt_id = attempt ORDER BY o.seq DESC LIMIT 1;
            IF FOUND THEN
                last_seq := last.seq;
                total := last.attempt_bytes;
                acked := CASE WHEN last.fencing_token = token THEN last.lease_seq ELSE 0 END;
            ELSE
                last_seq := 0;
                total := 0;
                acked := 0;
            END IF;
            first_seq := (w->'chunks'->0->>'seq')::bigint;
            wanted := jsonb_array_length(w->'chunks');
            dup := greatest(0, least(wanted, acked - first_seq + 1));
            stored := 0;
            IF first_seq > acked + 1 THEN
                refused := 'output-gap';
                why := format('output chunk %s follows %s: resend from %s',
                              first_seq, acked, acked + 1);
            ELSIF dup < wanted THEN
                INSERT INTO output_chunks (run_id, position, tenant_id, attempt_id, step_id, seq,
                                           fencing_token, lease_seq, attempt_bytes, text,
                                           data_json, written_at)
                SELECT run, head + k, tenant, attempt, held.step_id,
                       last_seq + k, token, acked + k, total + running,
                       c->>'text', c->>'data_json', now()
                  FROM (SELECT c, row_number() OVER (ORDER BY i) AS k,
                               sum(octet_length(coalesce(c->>'text', c->>'data_json')))
                                   OVER (ORDER BY i) AS running
                          FROM jsonb_array_elements(w->'chunks') WITH ORDINALITY AS e(c, i)
                         WHERE i > dup) s
                 WHERE total + running <= attempt_max;
                GET DIAGNOSTICS stored = ROW_COUNT;
                IF stored < wanted - dup THEN
                    refused := 'output-limit-exceeded';
                    why := format('the attempt''s output is at most %s bytes', attempt_max);
                END IF;
                IF stored > 0 THEN
                    acked := acked + stored;
                    UPDATE output_heads SET position = head + stored, updated_at = now()
                     WHERE run_id = run;
                    IF wake THEN
                        PERFORM pg_notify('runcontrol_output', run::text);
                    END IF;
                END IF;
            END IF;
            answers := answers || jsonb_build_array(jsonb_build_object(
                'acked', acked, 'stored', stored, 'duplicates', dup,
                'error', refused, 'message', why));
        EXCEPTION WHEN OTHERS THEN
            answers := answers || jsonb_build_array(jsonb_build_object(
                'sqlstate', SQLSTATE, 'message', SQLERRM));
        END;
    END LOOP;
    RETURN answers;
END $fn$;

-- The relay reads the last outbox id handed out (reconcilers.RelayFloor): where its read of
-- unpublished rows may start once every transaction that drew an id up to it has ended.
GRANT SELECT ON SEQUENCE outbox_id_seq TO runcontrol_system;
