-- A document of the release before migration 0033, which sent its journal entries apart
-- ("journal": rows of the old recovery_journal table), as this release writes it: the entries
-- (without their tenant and run, the event row's) on the document's last event, where the
-- journal view reads them. A document with entries and no event is answered as it is, and
-- runcontrol_apply_document refuses it: every transition records its event (invariant 3).
CREATE OR REPLACE FUNCTION runcontrol_fold_journal(doc jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    last int := coalesce(jsonb_array_length(doc->'outbox'), 0) - 1;
BEGIN
    IF last < 0 OR NOT doc ? 'journal' THEN
        RETURN doc;
    END IF;
    RETURN jsonb_set(doc - 'journal', ARRAY['outbox', last::text, 'journal'],
                     (SELECT jsonb_agg(e - 'tenant_id' - 'run_id' ORDER BY n)
                      FROM jsonb_array_elements(doc->'journal') WITH ORDINALITY AS j(e, n)));
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_fold_journal(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_fold_journal(jsonb) TO runcontrol_app;
