-- Streamed output (issue 30, docs/streaming.md): a lease holder's chunks, appended by a fenced
-- insert of their own beside the run's commits (runcontrol_apply is not involved). The lease
-- row is checked and share-locked, so a chunk is stored only while its writer holds the
-- attempt's current lease, and a settlement or a new lease waits for the write in flight. The
-- run's head row (output_heads) is locked first, so the run's chunks take their positions in
-- commit order, without gaps: the readers' cursor. It NOTIFYs runcontrol_output only while a
-- listener has registered on it (runcontrol_listen; checked once per statement under the same
-- lock).
--
-- Output follows the event history's retention (RunControl:Outbox:RetentionDays): the
-- retention reconciler deletes it on the system path; the app role inserts chunks and never
-- changes them.
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
            PERFORM runcontrol_check_fence(tenant);  -- a moved tenant's: RC421 (issue 41)
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
REVOKE ALL ON FUNCTION runcontrol_append_output(jsonb, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_append_output(jsonb, bigint) TO runcontrol_app;
