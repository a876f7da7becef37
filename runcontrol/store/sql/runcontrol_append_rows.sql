-- The append-only rows of the documents at the places ``applied`` (from 1): one INSERT per
-- table and tenant that has such rows (the writers runcontrol_append_<table>, rendered by
-- store/writers.py).
CREATE OR REPLACE FUNCTION runcontrol_append_rows(docs jsonb, applied int[]) RETURNS void
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
          AND k IN ('outbox', 'audits', 'answer', 'answers', 'results')
        GROUP BY 1
    LOOP
        PERFORM set_config('runcontrol.tenant_id', tenant, true);
        IF 'outbox' = ANY(present) THEN
            wrote := runcontrol_append_outbox(docs, applied, 'outbox', tenant);
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
