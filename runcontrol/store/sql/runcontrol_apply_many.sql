-- Group commit: the one statement the store's committer sends for a batch of documents
-- (store/commit.py). It checks the two channels' listeners once (the ACCESS SHARE lock is held
-- to the commit either way: runcontrol_listen says why that loses no wake-up), applies each
-- document without its appends in a subtransaction of its own (one that fails rolls back
-- alone), then appends the rows of the documents that applied, one INSERT per table and tenant
-- (row-level security checks each row against its tenant), in document order. No document
-- reads what another's appends write, so deferring them to the end changes no outcome. Should
-- an append fail (a duplicate answer, say), the whole group is rolled back and applied again
-- document by document, appends included, so that the failing document alone is refused.
-- Answers, in order: null for a document committed, [SQLSTATE, message] for one rolled back.
CREATE OR REPLACE FUNCTION runcontrol_apply_many(docs jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $fn$
DECLARE
    answers jsonb;
    applied int[];
    wake_dispatch boolean := runcontrol_listened('runcontrol_dispatch');
    wake_events boolean := runcontrol_listened('runcontrol_events');
BEGIN
    -- a document of the release before 0033 sends its journal apart: on its last event here
    IF docs @? '$[*].journal' THEN
        SELECT jsonb_agg(runcontrol_fold_journal(d.doc) ORDER BY d.place) INTO docs
            FROM jsonb_array_elements(docs) WITH ORDINALITY AS d(doc, place);
    END IF;
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
REVOKE ALL ON FUNCTION runcontrol_apply_many(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_apply_many(jsonb) TO runcontrol_app;
