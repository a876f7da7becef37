-- One document alone (a caller outside a group commit): its appends included, and a wake-up
-- only to a channel somebody listens on (the lock only for a document that wakes somebody).
CREATE OR REPLACE FUNCTION runcontrol_apply(doc jsonb) RETURNS void
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
    -- a document of the release before 0033 sends its journal apart: on its last event here
    IF doc ? 'journal' THEN
        doc := runcontrol_fold_journal(doc);
    END IF;
    PERFORM runcontrol_apply_document(doc, true, wake_dispatch, wake_events);
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_apply(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_apply(jsonb) TO runcontrol_app;
